"""Pre-warmed standby workers: one interpreter per local rank that has already imported `restart.preload`.

A standby is started like a worker (own session, the job's tag, its own cgroup, watched by the guard) with the
worker's python and the worker's environment less the per-attempt contract (RANK, MASTER_PORT, ...), runs
runner/workers/standby_main.py, imports the preload modules and waits. When an attempt starts a worker,
`StandbyPool.take` gives the group that rank's standby; `Standby.hand_off` sends it the worker's argv, environment,
cwd, stdout and stderr, and it runs the entrypoint as a fresh `python -u script` / `python -u -m module` would.
The pid, pidfd, session, cgroup and tag of the standby become the worker's.

A worker starts cold (a new interpreter, as without standbys) when the entrypoint is a `command:`, when the
worker's argv is not `python -u script|-m module ...` with the standby's python, when its environment differs
from the standby's anywhere outside the contract (the interpreter already started with it), or when no live
standby is there. A standby still importing is handed its orders all the same: it runs them once its imports are
done, which is never later than a cold interpreter started now would be.

The first standbys start in INIT, whatever the rendezvous: their imports overlap the agent's own start and the
rendezvous (etcd: the wait for other nodes), and the first attempt runs in them, ready or still importing. A worker
that ran in a standby exits fast (gc.freeze: its teardown skips torch's objects), so a crash of attempt 0 recovers
as fast as a crash of any later attempt. The pool (re)fills a rank `REFILL_DELAY_S` after a worker of that rank
started (its own start-up gets the CPU first), or at once when the attempt fails (`fill()`, from RESTARTING: the
CPU is free then). It turns itself off for the rest of the run (with a warning) when a preload fails, when a warm
standby's resident memory exceeds `restart.standby_max_memory_mb`, or after `MAX_LOSSES` standbys died while
waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from runner.system import procs
from runner.system.cgroup import JobCgroup
from runner.workers.launch_plan import WorkerPlan, attempt_free_env, worker_argv

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

    from runner.config.spec import JobSpec
    from runner.system.shepherd import Shepherd

MAIN = str(Path(__file__).with_name("standby_main.py"))
HEADER = 8  # standby_main.HEADER: big-endian length of the JSON orders
TITLE_ROOM = "-" * 1024  # an argument that reserves room for the worker's argv in /proc/<pid>/cmdline (retitle)
REFILL_DELAY_S = 3.0  # after a hand-off: the new workers' own start-up gets the CPU first
MAX_LOSSES = 3  # standbys that died while waiting before the pool gives up
KILL_WAIT_S = 5.0
OFF_VAR = "RUNNER_STANDBY"  # "0" turns standbys off on this machine whatever the spec says (e.g. a test suite)


def entry(argv: tuple[str, ...], python: str) -> tuple[str, str, tuple[str, ...]] | None:
    """('script', path, args) or ('module', name, args) when `argv` is `python -u ...` a standby can run, else None."""
    if len(argv) < 3 or argv[0] != python or argv[1] != "-u":
        return None
    if argv[2] == "-m":
        return ("module", argv[3], argv[4:]) if len(argv) > 3 and argv[3] else None
    target = argv[2]
    if target.startswith("-") or target.endswith((".pyc", ".pyz", ".zip")):
        return None  # stdin, another interpreter flag, or what only the interpreter's own runner handles
    return "script", target, argv[3:]


def path0(kind: str, target: str, cwd: str) -> str:
    """sys.path[0] of `python script` (the script's real directory) or `python -m` (the working directory)."""
    if kind == "module":
        return os.path.abspath(cwd)
    return os.path.dirname(os.path.realpath(os.path.join(cwd, target)))


def orders(wp: WorkerPlan, tag_var: str, tag: str) -> bytes:
    """What a standby is sent: length header + JSON {argv, env, cwd}; the job's tag stays in the environment."""
    body = json.dumps({"argv": list(wp.argv), "env": {**dict(wp.env), tag_var: tag},
                       "cwd": os.path.abspath(wp.cwd)}).encode()
    return len(body).to_bytes(HEADER, "big") + body


def rss_mb(pid: int) -> float | None:
    """Resident memory of `pid` in MiB (VmRSS), None when it cannot be read."""
    try:
        text = Path(f"/proc/{pid}/status").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


@dataclass
class Standby:
    """One waiting interpreter; `proc`, `pidfd`, `tag` and `cgroup` become the worker's at hand-off."""

    local_rank: int
    proc: subprocess.Popen[bytes]
    pidfd: int
    sock: socket.socket
    tag: str
    cgroup: Path | None
    env: dict[str, str]
    python: str
    started: float
    ready_after: float | None = None  # seconds from start to "ready"
    rss_mb: float | None = None
    said: bytes = b""  # what it wrote on the socket so far (one line: 'ready')
    _sending: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def pid(self) -> int:
        """The standby's pid (the worker's, after hand-off)."""
        return self.proc.pid

    def fits(self, wp: WorkerPlan) -> str:
        """Why `wp` cannot run here ('' when it can)."""
        if entry(wp.argv, self.python) is None:
            return "the worker's argv is not `python -u script|-m module`"
        contract = dict(wp.contract)
        mine = {k: v for k, v in self.env.items() if k not in contract}
        theirs = {k: v for k, v in wp.env if k not in contract}
        if mine != theirs:
            changed = sorted(set(mine.items()) ^ set(theirs.items()))
            return f"the environment changed since the standby started ({', '.join({k for k, _ in changed})})"
        return ""

    def hand_off(self, wp: WorkerPlan, tag_var: str, stdout: int, stderr: int) -> None:
        """Send the orders and the worker's two output descriptors; the rest of a long message follows in the loop."""
        data = orders(wp, tag_var, self.tag)
        self.sock.setblocking(False)  # noqa: FBT003 - socket API
        try:
            sent = socket.send_fds(self.sock, [data], [stdout, stderr])
        except OSError:
            self.sock.close()  # the standby died just now: its pidfd reports the exit, as a worker's
            return
        if sent == len(data):
            self.sock.close()
            return
        task = asyncio.get_running_loop().create_task(self._send_rest(data[sent:]))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send_rest(self, rest: bytes) -> None:
        try:
            await asyncio.get_running_loop().sock_sendall(self.sock, rest)
        except OSError:
            pass  # the standby died: reported through its pidfd
        finally:
            self.sock.close()


class StandbyPool:
    """The standbys of this node: `fill()` once, `take()` per worker started, `close()` at the end."""

    def __init__(
        self,
        spec: JobSpec,
        shepherd: Shepherd,
        *,
        nproc: int,
        run_dir: Path,
        base_env: Mapping[str, str],
        log: FilteringBoundLogger,
    ) -> None:
        self.spec = spec
        self.shepherd = shepherd
        self.nproc = nproc
        self.run_dir = run_dir
        self.base_env = base_env
        self.log = log
        self.waiting: dict[int, Standby] = {}  # by local rank
        self.serial = 0
        self.off = ""  # why standbys were turned off for this run ('' while on)
        self.handed_off = 0
        self.cold: list[str] = []  # why each cold start happened while standbys were on
        self.losses = 0
        self.ready_after: list[float] = []
        self.rss: list[float] = []
        self._refills: dict[int, asyncio.TimerHandle] = {}

    @staticmethod
    def wanted(spec: JobSpec, environ: Mapping[str, str]) -> bool:
        """Standbys are on (the spec, and no RUNNER_STANDBY=0 on this machine) and the entrypoint is a script/module."""
        return spec.restart.standby and environ.get(OFF_VAR) != "0" and spec.entrypoint.command is None

    def log_path(self, local_rank: int) -> Path:
        """Where the standbys of `local_rank` write until they become workers (<run dir>/standby/rank_<r>.log)."""
        return self.run_dir / "standby" / f"rank_{local_rank}.log"

    def fill(self) -> None:
        """Start a standby for every local rank that has none."""
        for local_rank in range(self.nproc):
            if local_rank not in self.waiting and not self.off:
                self._start(local_rank)

    def _start(self, local_rank: int) -> None:
        pending = self._refills.pop(local_rank, None)
        if pending is not None:
            pending.cancel()
        spec = self.spec
        argv = worker_argv(spec, local_rank, self.base_env.get("PYTHON_EXEC"))
        python = argv[0]
        target = entry(argv, python)
        if target is None:
            self.turn_off(f"the worker's argv {argv[:3]} is not one a standby runs")
            return
        env = attempt_free_env(spec, self.base_env, self.nproc)
        self.serial += 1
        tag = self.shepherd.standby_tag(self.serial, local_rank)
        cgroup = self.shepherd.standby_cgroup(self.serial, local_rank)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        cmd = [python, "-u", MAIN, str(theirs.fileno()), path0(target[0], target[1], spec.cwd), TITLE_ROOM,
               *spec.restart.preload]
        if cgroup is not None:
            cmd = JobCgroup.enter(cgroup, cmd)
        log_path = self.log_path(local_rank)
        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with log_path.open("ab") as out:
                proc = subprocess.Popen(
                    cmd, env={**env, procs.TAG_VAR: tag}, cwd=spec.cwd, stdin=subprocess.DEVNULL, stdout=out,
                    stderr=out, start_new_session=True, pass_fds=(theirs.fileno(),),
                )
        except OSError as e:
            ours.close()
            self.turn_off(f"a standby could not start: {e}")
            return
        finally:
            theirs.close()
        pidfd = os.pidfd_open(proc.pid)  # our unreaped child: the pid is this process's
        self.shepherd.watch(proc.pid)
        loop = asyncio.get_running_loop()
        standby = Standby(local_rank, proc, pidfd, ours, tag, cgroup, env, python, loop.time())
        self.waiting[local_rank] = standby
        ours.setblocking(False)  # noqa: FBT003 - socket API
        loop.add_reader(ours.fileno(), self._on_message, standby)
        loop.add_reader(pidfd, self._on_exit, standby)
        self.log.debug("standby_started", local_rank=local_rank, pid=proc.pid, preload=list(spec.restart.preload))

    def take(self, wp: WorkerPlan) -> Standby | None:
        """The standby that will run `wp` (no longer the pool's), or None: start it cold (the reason is kept)."""
        if self.off:
            return None
        standby = self.waiting.get(wp.local_rank)
        if standby is not None and standby.ready_after is None:
            if not self._read_now(standby):
                return None  # its "ready" turned standbys off (the memory cap): the report says so as `off`
            standby = self.waiting.get(wp.local_rank)
        if wp.local_rank not in self._refills:  # the next attempt's standby, once this worker had the CPU first
            self._refills[wp.local_rank] = asyncio.get_running_loop().call_later(
                REFILL_DELAY_S, self._refill, wp.local_rank)
        if standby is None and self.serial == 0:
            return None  # a pool never filled: nothing to report as a cold start
        why = "no standby for this rank yet" if standby is None else standby.fits(wp)
        if standby is None or why:
            self.cold.append(f"rank {wp.rank}: {why}")
            self.log.info("standby_not_used", rank=wp.rank, why=why)
            return None
        self._release(standby)
        self.handed_off += 1
        return standby

    def _read_now(self, standby: Standby) -> bool:
        """Read what `standby` said, unread yet (a "ready": memory cap, warm-up figures); False if standbys went off."""
        self._on_message(standby)
        return not self.off

    def _refill(self, local_rank: int) -> None:
        self._refills.pop(local_rank, None)
        if not self.off and local_rank not in self.waiting:
            self._start(local_rank)

    def _release(self, standby: Standby) -> None:
        """Stop watching `standby` as ours (it becomes a worker, or is being stopped)."""
        loop = asyncio.get_running_loop()
        self.waiting.pop(standby.local_rank, None)
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(standby.sock.fileno())
        loop.remove_reader(standby.pidfd)

    def _on_message(self, standby: Standby) -> None:
        try:
            data = standby.sock.recv(256)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # it exited: its pidfd says how
            asyncio.get_running_loop().remove_reader(standby.sock.fileno())
            return
        standby.said += data
        if b"\n" not in standby.said:
            if len(standby.said) > 256:
                self._stop(standby, "it said something unexpected")
            return
        word = standby.said.split(b"\n", 1)[0].decode(errors="replace")
        if word.startswith("failed "):
            self.turn_off(f"the preload of {word[7:80]!r} failed (see {self.log_path(standby.local_rank)})")
            return
        if word != "ready":
            self._stop(standby, f"it said {word[:80]!r}")
            return
        asyncio.get_running_loop().remove_reader(standby.sock.fileno())
        standby.ready_after = asyncio.get_running_loop().time() - standby.started
        standby.rss_mb = rss_mb(standby.pid)
        self.ready_after.append(standby.ready_after)
        if standby.rss_mb is not None:
            self.rss.append(standby.rss_mb)
        self.log.debug("standby_ready", local_rank=standby.local_rank, after_s=round(standby.ready_after, 3),
                       rss_mb=None if standby.rss_mb is None else round(standby.rss_mb, 1))
        limit = self.spec.restart.standby_max_memory_mb
        if standby.rss_mb is not None and standby.rss_mb > limit:
            self.turn_off(f"a warm standby holds {standby.rss_mb:.0f} MiB, more than "
                          f"restart.standby_max_memory_mb ({limit})")

    def _on_exit(self, standby: Standby) -> None:
        """A standby died while waiting (not yet a worker): reap it and start another (up to MAX_LOSSES)."""
        self._release(standby)
        code = self._reap(standby)
        if self.off:
            return
        self.losses += 1
        self.log.warning("standby_lost", local_rank=standby.local_rank, exit_code=code)
        if self.losses >= MAX_LOSSES:
            self.turn_off(f"{self.losses} standbys died while waiting")
            return
        self._start(standby.local_rank)

    def _stop(self, standby: Standby, why: str) -> None:
        self.log.warning("standby_stopped", local_rank=standby.local_rank, why=why)
        self._release(standby)
        self._kill([standby])

    def turn_off(self, why: str) -> None:
        """No standby for the rest of the run: every waiting one is stopped; workers start cold."""
        if self.off:
            return
        self.off = why
        self.log.warning("standby_off", why=why, detail="workers start cold from now on")
        self.close()

    def close(self) -> None:
        """Stop every waiting standby and reap it (bounded); later takes return None."""
        for handle in self._refills.values():
            handle.cancel()
        self._refills.clear()
        left = list(self.waiting.values())
        for standby in left:
            self._release(standby)
        self._kill(left)
        if not self.off:
            self.off = "closed"

    def _kill(self, standbys: list[Standby]) -> None:
        for s in standbys:
            s.sock.close()
            if s.cgroup is not None:
                JobCgroup.kill(s.cgroup)
            procs.send(s.pidfd, signal.SIGKILL)
        procs.wait_exited([s.pidfd for s in standbys], KILL_WAIT_S)
        for s in standbys:
            self._reap(s)

    def _reap(self, standby: Standby) -> int | None:
        """Collect a dead standby: exit code (negative: signal), None if it still runs (left to the guard)."""
        if not procs.exited(standby.pidfd):
            return None
        self.shepherd.forget(standby.pid)
        code = None
        with contextlib.suppress(ChildProcessError):
            result = os.waitid(os.P_PIDFD, standby.pidfd, os.WEXITED | os.WNOHANG)
            if result is not None:
                code = procs.exit_code(result)
                standby.proc.returncode = code
        os.close(standby.pidfd)
        standby.pidfd = -1
        if standby.cgroup is not None:
            JobCgroup.remove_child(standby.cgroup)
        return code

    def summary(self) -> dict[str, object]:
        """For report.json and status: on/off and why, hand-offs, cold starts, warm-up time and memory."""
        out: dict[str, object] = {
            "enabled": not self.off or self.off == "closed",
            "preload": list(self.spec.restart.preload),
            "handed_off": self.handed_off,
            "cold_starts": self.cold[-20:],
        }
        if self.off and self.off != "closed":
            out["off"] = self.off
        if self.ready_after:
            out["warm_up_s_max"] = round(max(self.ready_after), 3)
        if self.rss:
            out["rss_mb_max"] = round(max(self.rss), 1)
        return out
