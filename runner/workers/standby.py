"""Warm workers from a fork server: one interpreter per job and node imports `restart.preload` once, then forks.

The pool starts the **fork server** (runner/workers/standby_main.py) in INIT: the workers' python, their
environment less the per-attempt contract (RANK, MASTER_PORT, ...), its own session, cgroup and tag, watched by
the guard. It imports the preload once and, on each request, forks a **standby** for a local rank in
milliseconds, sharing the server's memory copy-on-write. A standby is forked twice (server, intermediate child,
standby) so that it is reparented to the agent, the child subreaper: it is the agent's child like any worker, and
the agent holds a pidfd the standby sent of itself, reads its exit status and reaps it. Each standby starts its own
session, enters its own cgroup and carries its own tag (written over the server's in its initial environment), so
the group watches, stops, kills and reaps it as a cold worker.

When an attempt starts a worker, `StandbyPool.take` gives the group that rank's standby, and the pool asks the
server for the next one at once: a crash at any moment, in a crash loop, of every rank at once or with `scope:
worker`, finds a warm standby. RUNNING waits (bounded) for the pool to be warm before the first attempt
(`warm`): the server's one import replaces every rank's own, so this is never later than cold workers.
`Standby.hand_off` sends the worker's argv, environment, cwd, stdout and stderr, and the standby runs the
entrypoint as a fresh `python -u script` / `python -u -m module` would.

A worker starts cold (a new interpreter) when the entrypoint is a `command:`, when its argv is not `python -u
script|-m module ...` with the server's python, when its environment differs from the server's outside the
contract, or when no standby is ready for its rank. The pool turns itself off for the rest of the run (one warning,
workers start cold) when a preload fails, when forking is unsafe (a thread besides the main one, CUDA initialised),
when the server's resident memory exceeds `restart.standby_max_memory_mb`, when this process is not the child
subreaper, or after `MAX_LOSSES` servers or standbys died while waiting.
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
from typing import IO, TYPE_CHECKING

from runner.rundir.layout import RunDir
from runner.system import procs
from runner.system.cgroup import JobCgroup
from runner.workers.launch_plan import WorkerPlan, attempt_free_env, worker_argv

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

    from runner.config.spec import JobSpec
    from runner.system.shepherd import Shepherd

MAIN = str(Path(__file__).with_name("standby_main.py"))
HEADER = 8  # standby_main.HEADER: big-endian length of the JSON orders
TAG_ROOM = 96  # characters reserved for a standby's tag in the server's initial environment (standby_main.retag)
TAG_PAD = "~"  # standby_main.TAG_PAD
MAX_LOSSES = 3  # servers or standbys that died while waiting before the pool gives up
KILL_WAIT_S = 5.0
WARM_WAIT_S = 120.0  # RUNNING waits at most this long for the server's imports before starting workers cold
OFF_VAR = "RUNNER_STANDBY"  # "0" turns standbys off on this machine whatever the spec says (a memory-tight node)


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


def fits(env: Mapping[str, str], python: str, wp: WorkerPlan) -> str:
    """Why `wp` cannot run in a standby of this python and environment ('' when it can)."""
    if entry(wp.argv, python) is None:
        return "the worker's argv is not `python -u script|-m module`"
    contract = dict(wp.contract)
    mine = {k: v for k, v in env.items() if k not in contract}
    theirs = {k: v for k, v in wp.env if k not in contract}
    if mine != theirs:
        changed = sorted(set(mine.items()) ^ set(theirs.items()))
        return f"the environment changed since the fork server started ({', '.join({k for k, _ in changed})})"
    return ""


def standby_pid(said: bytes, pidfd: int) -> int | None:
    """The pid behind `pidfd` if it said `ready` and is this process's child (unreaped: its pid is ours), else None."""
    if said != b"ready\n" or pidfd < 0:
        return None
    pid = procs.pidfd_pid(pidfd)
    st = procs.read_stat(pid) if pid is not None else None
    if st is None or st.ppid != os.getpid() or not procs.exists(pidfd):
        return None
    return pid


def proven_ours(pidfd: int, tag: str) -> bool:
    """True when the live process behind `pidfd` carries `tag` (read, then confirmed alive: the read was about it)."""
    pid = procs.pidfd_pid(pidfd)
    return pid is not None and procs.environ_has(pid, procs.tag_entry(tag)) and procs.exists(pidfd)


@dataclass
class Standby:
    """One forked, waiting standby; `pid`, `pidfd`, `tag` and `cgroup` become the worker's at hand-off."""

    local_rank: int
    pid: int
    pidfd: int
    sock: socket.socket
    tag: str
    cgroup: Path | None
    env: dict[str, str]  # the server's: what the worker's environment must match outside the contract
    python: str
    _sending: set[asyncio.Task[None]] = field(default_factory=set)

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


@dataclass
class Pending:
    """A standby asked of the server, not ready yet: its socket, tag and cgroup."""

    local_rank: int
    sock: socket.socket
    tag: str
    cgroup: Path | None


@dataclass
class Server:
    """The fork server: its process, control socket, environment and python (what a worker must match)."""

    proc: subprocess.Popen[bytes]
    pidfd: int
    ctl: socket.socket
    env: dict[str, str]
    python: str
    cgroup: Path | None
    started: float
    ready_after: float | None = None
    rss_mb: float | None = None


class StandbyPool:
    """The fork server and its standbys on this node: `fill()` once, `take()` per worker started, `close()` at end.

    One concern over 20 methods: the life of the fork server's processes (start, hand over, lose, reap), each
    method one step of that life, sharing the server's pipe and its table of standbys.
    """

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
        self.server: Server | None = None
        self.pending: dict[int, Pending] = {}  # by local rank: asked of the server
        self.waiting: dict[int, Standby] = {}  # by local rank: forked and ready
        self.serial = 0  # standbys asked for
        self.servers = 0  # servers started
        self.off = ""  # why standbys were turned off for this run ('' while on)
        self.handed_off = 0
        self.cold: list[str] = []  # why each cold start happened while standbys were on
        self.losses = 0
        self.ready_after: list[float] = []
        self.rss: list[float] = []
        self._changed: asyncio.Event | None = None  # set whenever a standby becomes ready or the pool goes off

    @staticmethod
    def wanted(spec: JobSpec, environ: Mapping[str, str]) -> bool:
        """Standbys are on (the spec, and no RUNNER_STANDBY=0 on this machine) and the entrypoint is a script/module."""
        return spec.restart.standby and environ.get(OFF_VAR) != "0" and spec.entrypoint.command is None

    def log_path(self) -> Path:
        """Where the fork server and its standbys write until they become workers (<run dir>/standby/server.log)."""
        return RunDir(self.run_dir).standby_log

    def fill(self) -> None:
        """Start the server if there is none, and ask it for a standby for every local rank that has none."""
        if self.off:
            return
        if self.server is None:
            self._start_server()
        for local_rank in range(self.nproc):
            if self.off or self.server is None:
                return
            if local_rank not in self.waiting and local_rank not in self.pending:
                self._request(local_rank)

    def _start_server(self) -> None:
        spec = self.spec
        argv = worker_argv(spec, 0, self.base_env.get("PYTHON_EXEC"))
        python = argv[0]
        target = entry(argv, python)
        if target is None:
            self.turn_off(f"the worker's argv {argv[:3]} is not one a standby runs")
            return
        tag = self.shepherd.helper_tag(f"f{self.servers}")  # starts the guard: this process is the subreaper now
        if not procs.is_child_subreaper():
            self.turn_off("this process is not the child subreaper: a forked standby would not be its child")
            return
        env = attempt_free_env(spec, self.base_env, self.nproc)
        cgroup = self.shepherd.helper_cgroup(f"forkserver{self.servers}")
        self.servers += 1
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cmd = [python, "-u", MAIN, str(theirs.fileno()), path0(target[0], target[1], spec.cwd), spec.name,
               *spec.restart.preload]
        if cgroup is not None:
            cmd = JobCgroup.enter(cgroup, cmd)
        out = self._open_log()
        try:
            proc = subprocess.Popen(
                cmd, env={**env, procs.TAG_VAR: tag.ljust(TAG_ROOM, TAG_PAD)}, cwd=spec.cwd,
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True, pass_fds=(theirs.fileno(),),
            )
        except OSError as e:
            ours.close()
            self.turn_off(f"the fork server could not start: {e}")
            return
        finally:
            theirs.close()
            if not isinstance(out, int):
                with contextlib.suppress(OSError):
                    out.close()
        pidfd = os.pidfd_open(proc.pid)  # our unreaped child: the pid is this process's
        self.shepherd.watch(proc.pid)
        loop = asyncio.get_running_loop()
        self.server = Server(proc, pidfd, ours, env, python, cgroup, loop.time())
        ours.setblocking(False)  # noqa: FBT003 - socket API
        loop.add_reader(ours.fileno(), self._on_server_message)
        loop.add_reader(pidfd, self._on_server_exit)
        self.log.debug("fork_server_started", pid=proc.pid, preload=list(spec.restart.preload))

    def _open_log(self) -> IO[bytes] | int:
        """The server's log opened for appending, or DEVNULL when the logs disk cannot take it (full, read-only)."""
        path = self.log_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            return path.open("ab")
        except OSError:
            return subprocess.DEVNULL

    def _request(self, local_rank: int) -> None:
        """Ask the server for a standby of `local_rank` (it forks once its imports are done)."""
        server = self.server
        if server is None or self.off:
            return
        self.serial += 1
        tag = self.shepherd.standby_tag(self.serial, local_rank)
        cgroup = self.shepherd.standby_cgroup(self.serial, local_rank)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        request = json.dumps({"tag": tag, "cgroup": "" if cgroup is None else str(cgroup), "parent": os.getpid()})
        try:
            socket.send_fds(server.ctl, [request.encode()], [theirs.fileno()])
        except OSError as e:  # the server is gone (its pidfd says so) or its queue is full
            ours.close()
            if cgroup is not None:
                JobCgroup.remove_child(cgroup)
            self.log.debug("standby_request_failed", local_rank=local_rank, error=str(e))
            return
        finally:
            theirs.close()
        ours.setblocking(False)  # noqa: FBT003 - socket API
        pending = Pending(local_rank, ours, tag, cgroup)
        self.pending[local_rank] = pending
        asyncio.get_running_loop().add_reader(ours.fileno(), self._on_standby_message, pending)

    def _on_standby_message(self, pending: Pending) -> None:
        """A forked standby says `ready` with a pidfd of itself, or its socket closed before (it died: a loss)."""
        try:
            data, fds, _flags, _addr = socket.recv_fds(pending.sock, 64, 1)
        except BlockingIOError:
            return
        except OSError:
            data, fds = b"", []
        loop = asyncio.get_running_loop()
        loop.remove_reader(pending.sock.fileno())
        if self.pending.get(pending.local_rank) is pending:
            del self.pending[pending.local_rank]
        pidfd = fds[0] if fds else -1
        if not data and self.server is not None:
            self._on_server_message()  # the server may have said why before it exited (failed, unsafe)
        server = self.server
        if not data and (self.off or server is None or server.ready_after is None):
            pending.sock.close()  # never forked: the server's end (what it said, its exit) tells why
            return
        pid = standby_pid(data, pidfd)
        if pid is None:  # it died before it was ready, or never became our child
            self._not_adopted(pending, pidfd, data)
            return
        self.shepherd.watch(pid)
        server = self.server
        env, python = (server.env, server.python) if server is not None else ({}, "")  # none: it never fits
        standby = Standby(pending.local_rank, pid, pidfd, pending.sock, pending.tag, pending.cgroup, env, python)
        if self.off:
            self._kill([standby])
            return
        self.waiting[standby.local_rank] = standby
        loop.add_reader(pidfd, self._on_exit, standby)
        self.log.info("standby_ready", local_rank=standby.local_rank, pid=pid)
        self._signal()

    def _not_adopted(self, pending: Pending, pidfd: int, said: bytes) -> None:
        """A standby that never became ours to run a worker: killed only if its tag proves it the job's; a loss."""
        if pidfd >= 0:
            if proven_ours(pidfd, pending.tag):  # never adopted, but still the job's
                procs.send(pidfd, signal.SIGKILL)
            os.close(pidfd)
        pending.sock.close()
        if pending.cgroup is not None:
            JobCgroup.kill(pending.cgroup)
            JobCgroup.remove_child(pending.cgroup)
        self._lost(pending.local_rank, f"a standby ended before it was ready ({said[:40]!r})")

    def take(self, wp: WorkerPlan) -> Standby | None:
        """The standby that will run `wp` (no longer the pool's), or None: start it cold (the reason is kept)."""
        if self.off or (self.server is None and not self.waiting):
            return None
        standby = self.waiting.get(wp.local_rank)
        server = self.server
        if standby is None:
            why = ("no standby for this rank yet: the fork server is still importing"
                   if server is not None and server.ready_after is None else "no standby for this rank yet")
        else:
            why = fits(standby.env, standby.python, wp)
        if standby is None or why:
            self.cold.append(f"rank {wp.rank}: {why}")
            self.log.info("standby_not_used", rank=wp.rank, why=why)
            if wp.local_rank not in self.pending and standby is None:
                self._request(wp.local_rank)
            return None
        self._release(standby)
        self.handed_off += 1
        self._request(wp.local_rank)  # the next one now: forking costs milliseconds, a crash may come at once
        return standby

    async def warm(self, timeout: float = WARM_WAIT_S) -> None:
        """Until every local rank has a ready standby, the pool is off, or `timeout` s passed (then: cold starts)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.off and self.server is not None and len(self.waiting) < self.nproc:
            left = deadline - loop.time()
            if left <= 0:
                if self.server.ready_after is None:  # its imports hang: no later attempt should wait for it again
                    self.turn_off(f"the fork server was not ready after {timeout:g} s")
                    return
                self.log.warning("standby_not_warm", after_s=timeout, ready=sorted(self.waiting),
                                 detail="workers without a standby start cold")
                return
            changed = self._changed = self._changed or asyncio.Event()
            changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), left)

    def _signal(self) -> None:
        if self._changed is not None:
            self._changed.set()

    def _release(self, standby: Standby) -> None:
        """Stop watching `standby` as ours (it becomes a worker, or is being stopped)."""
        self.waiting.pop(standby.local_rank, None)
        asyncio.get_running_loop().remove_reader(standby.pidfd)

    def _on_server_message(self) -> None:
        server = self.server
        if server is None:
            return
        try:
            data = server.ctl.recv(512)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        loop = asyncio.get_running_loop()
        if not data:  # it exited or closed its end: its pidfd says how
            loop.remove_reader(server.ctl.fileno())
            return
        word, _, rest = data.decode(errors="replace").strip().partition(" ")
        if word == "failed":
            self.turn_off(f"the preload of {rest[:80]!r} failed (see {self.log_path()})")
        elif word == "unsafe":
            self.turn_off(f"the fork server cannot fork safely: {rest[:300]}")
        elif word == "ready":
            self._server_ready(server, rest)
        else:
            self.turn_off(f"the fork server said {data[:80]!r}")

    def _server_ready(self, server: Server, rest: str) -> None:
        took, _, kb = rest.partition(" ")
        loop = asyncio.get_running_loop()
        server.ready_after = loop.time() - server.started
        with contextlib.suppress(ValueError):
            server.rss_mb = int(kb) / 1024
        self.ready_after.append(server.ready_after)
        if server.rss_mb is not None:
            self.rss.append(server.rss_mb)
        self.log.debug("fork_server_ready", after_s=round(server.ready_after, 3), import_s=took,
                       rss_mb=None if server.rss_mb is None else round(server.rss_mb, 1))
        limit = self.spec.restart.standby_max_memory_mb
        if server.rss_mb is not None and server.rss_mb > limit:
            self.turn_off(f"the warm fork server holds {server.rss_mb:.0f} MiB, more than "
                          f"restart.standby_max_memory_mb ({limit})")

    def _on_server_exit(self) -> None:
        """The server died: its pending standbys with it; start another (up to MAX_LOSSES), keep the ready ones."""
        server = self.server
        if server is None:
            return
        self._drop_server(server)
        if self.off:
            return
        self.losses += 1
        self.log.warning("fork_server_lost", exit_code=server.proc.returncode)
        if self.losses >= MAX_LOSSES:
            self.turn_off(f"{self.losses} fork servers or standbys died while waiting")
            return
        self.fill()

    def _drop_server(self, server: Server) -> None:
        """Forget `server` (exited, or being stopped): its pending standbys, its sockets; reap it when it is gone."""
        loop = asyncio.get_running_loop()
        self.server = None
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(server.ctl.fileno())
        loop.remove_reader(server.pidfd)
        server.ctl.close()
        for pending in list(self.pending.values()):
            loop.remove_reader(pending.sock.fileno())
            pending.sock.close()
            if pending.cgroup is not None:
                JobCgroup.kill(pending.cgroup)
                JobCgroup.remove_child(pending.cgroup)
        self.pending.clear()
        if procs.exited(server.pidfd):
            self._reap_server(server)

    def _reap_server(self, server: Server) -> None:
        if server.pidfd < 0:
            return
        self.shepherd.forget(server.proc.pid)
        with contextlib.suppress(ChildProcessError):
            result = os.waitid(os.P_PIDFD, server.pidfd, os.WEXITED | os.WNOHANG)
            if result is not None:
                server.proc.returncode = procs.exit_code(result)
        os.close(server.pidfd)
        server.pidfd = -1
        if server.cgroup is not None:
            JobCgroup.remove_child(server.cgroup)

    def _on_exit(self, standby: Standby) -> None:
        """A standby died while waiting (not yet a worker): reap it and ask for another (up to MAX_LOSSES)."""
        self._release(standby)
        code = self._reap(standby)
        self._lost(standby.local_rank, f"exit code {code}")

    def _lost(self, local_rank: int, how: str) -> None:
        if self.off:
            return
        self.losses += 1
        self.log.warning("standby_lost", local_rank=local_rank, how=how)
        if self.losses >= MAX_LOSSES:
            self.turn_off(f"{self.losses} fork servers or standbys died while waiting")
            return
        if local_rank not in self.pending and local_rank not in self.waiting:
            self._request(local_rank)

    def turn_off(self, why: str) -> None:
        """No standby for the rest of the run: the server and every waiting standby are stopped; workers start cold."""
        if self.off:
            return
        self.off = why
        self.log.warning("standby_off", why=why, detail="workers start cold from now on")
        self.close()

    def close(self) -> None:
        """Stop the server and every waiting standby and reap them (bounded); later takes return None."""
        if not self.off:
            self.off = "closed"
        self._signal()
        left = list(self.waiting.values())
        for standby in left:
            self._release(standby)
        server = self.server
        if server is not None:
            self._drop_server(server)
            if server.cgroup is not None:
                JobCgroup.kill(server.cgroup)
            if server.pidfd >= 0:
                procs.send(server.pidfd, signal.SIGKILL)
        self._kill(left)
        if server is not None and server.pidfd >= 0:
            procs.wait_exited([server.pidfd], KILL_WAIT_S)
            if procs.exited(server.pidfd):
                self._reap_server(server)

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
        if standby.pidfd < 0 or not procs.exited(standby.pidfd):
            return None
        self.shepherd.forget(standby.pid)
        code = None
        with contextlib.suppress(ChildProcessError):
            result = os.waitid(os.P_PIDFD, standby.pidfd, os.WEXITED | os.WNOHANG)
            if result is not None:
                code = procs.exit_code(result)
        os.close(standby.pidfd)
        standby.pidfd = -1
        if standby.cgroup is not None:
            JobCgroup.remove_child(standby.cgroup)
        return code

    def summary(self) -> dict[str, object]:
        """For report.json and status: on/off and why, hand-offs, cold starts, the server's warm-up and memory."""
        out: dict[str, object] = {
            "enabled": not self.off or self.off == "closed",
            "mode": "fork server",
            "preload": list(self.spec.restart.preload),
            "handed_off": self.handed_off,
            "forked": self.serial,
            "cold_starts": self.cold[-20:],
        }
        if self.off and self.off != "closed":
            out["off"] = self.off
        if self.ready_after:
            out["warm_up_s_max"] = round(max(self.ready_after), 3)
        if self.rss:
            out["rss_mb_max"] = round(max(self.rss), 1)
        return out
