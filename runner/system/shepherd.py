"""The agent's side of the guard (runner.system.shepherd_main): what the job's processes are and who kills them.

`Shepherd` owns the job's containment: a random tag every worker carries in its environment, the job's cgroup when
the machine allows one, the agent as child subreaper (orphans of workers reparent to it), and the guard process
that kills all of it if the agent dies. The agent watches the guard through a pidfd: a guard that dies is replaced
at once with the current list of workers (or, if that fails, `on_lost` is called so the job can stop).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Protocol

import structlog

from runner.system import procs
from runner.system.cgroup import JobCgroup
from runner.system.environ import HELPER_ENV_KEEP

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

TAG_VAR = procs.TAG_VAR
_ROOT = str(Path(__file__).resolve().parents[2])  # where `import runner` works from
_BOOT = "import sys; sys.path.insert(0, sys.argv.pop(1)); from runner.system.shepherd_main import main; main()"


class DeathNote(Protocol):
    """Work the guard does for a dead agent after its kill passes (the etcd backends: revoke the node's lease).

    `handler()` names a runner module with `on_agent_death(payload: bytes) -> None`; `encode()` is that payload,
    one line. The guard imports the module only when the agent died holding a note, so this layer names no layer
    above it.
    """

    def handler(self) -> str:
        """The dotted name of the module whose `on_agent_death` the guard calls."""
        ...

    def encode(self) -> bytes:
        """The payload, one line (no newline in it)."""
        ...


class ShepherdLostError(RuntimeError):
    """The guard died and another could not be started."""


class Shepherd:
    """Tag, cgroup and guard process of one job; started on first use (the first worker), closed at the job's end.

    One concern over 20 methods: proving and containing the job's processes. Tags, cgroups and the guard are three
    means to that one end, opened and closed together (a tag without the guard could outlive the agent).

    `agent=True` (the runner's own agent) also makes this process the child subreaper and, at close, kills the
    orphans that reparented to it. Leave it False where this process has children of its own (tests).
    """

    def __init__(self, *, agent: bool = True, cgroup: bool = True, log: FilteringBoundLogger | None = None) -> None:
        self.agent = agent
        self.want_cgroup = cgroup
        self.log = log or structlog.get_logger()
        self.tag = ""  # job-wide tag; a worker's is f"{tag}{attempt}.{local_rank}."
        self.cgroup: JobCgroup | None = None
        self.on_lost: Callable[[str], None] | None = None  # called if a dead guard cannot be replaced
        self.restarts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._fd: int | None = None  # pidfd of the guard
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watched: dict[int, int] = {}  # worker pid -> start time
        self._lease_line = b""  # `L ...` line telling the guard which etcd lease to revoke if the agent dies
        self._folders: list[bytes] = []  # `D ...` lines: private temp folders the guard removes if the agent dies
        self._closed = False
        self._started = False

    def start(self) -> None:
        """Make the tag and the cgroup, become subreaper (agent), start the guard. Idempotent."""
        if self._started or self._closed:
            return
        self._started = True
        self.tag = f"{os.urandom(8).hex()}."
        if self.agent:
            procs.set_child_subreaper()
        if self.want_cgroup:
            self.cgroup = JobCgroup.create()
        self._spawn()

    def worker_tag(self, attempt: int, local_rank: int) -> str:
        """The value of RUNNER_WORKER_TAG for one worker (ends with '.', so rank 1's is no prefix of rank 10's)."""
        return self._tag(str(attempt), local_rank)

    def worker_cgroup(self, attempt: int, local_rank: int) -> Path | None:
        """A new cgroup for one worker under the job's, or None (no cgroup on this machine)."""
        return self._cgroup(f"attempt{attempt}-rank{local_rank}")

    def standby_tag(self, serial: int, local_rank: int) -> str:
        """RUNNER_WORKER_TAG of standby `serial` (runner.workers.standby): it keeps it as a worker."""
        return self._tag(f"s{serial}", local_rank)

    def standby_cgroup(self, serial: int, local_rank: int) -> Path | None:
        """A new cgroup for standby `serial` under the job's (it stays the worker's), or None."""
        return self._cgroup(f"standby{serial}-rank{local_rank}")

    def helper_tag(self, name: str) -> str:
        """RUNNER_WORKER_TAG of a helper of the workers (the fork server): under the job's, so the guard kills it."""
        return self._tag(name, 0)

    def helper_cgroup(self, name: str) -> Path | None:
        """A new cgroup for a helper of the job's workers under the job's, or None."""
        return self._cgroup(name)

    def _tag(self, slot: str, local_rank: int) -> str:
        self.start()
        return f"{self.tag}{slot}.{local_rank}."

    def _cgroup(self, name: str) -> Path | None:
        self.start()
        return None if self.cgroup is None else self.cgroup.child(name)

    def _spawn(self) -> None:
        argv = [sys.executable, "-S", "-I", "-c", _BOOT, _ROOT, self.tag]
        if self.cgroup is not None:
            argv.append(str(self.cgroup.path))
        env = {k: os.environ[k] for k in HELPER_ENV_KEEP if k in os.environ}  # no secret of the agent's
        self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, start_new_session=True, env=env)
        self._fd = os.pidfd_open(self._proc.pid)
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        if self._loop is not None:
            self._loop.add_reader(self._fd, self._on_guard_exit)
        for pid, start in self._watched.items():
            self._send(f"+ {pid} {start}\n")
        if self._lease_line:
            self._send_bytes(self._lease_line)
        for line in self._folders:
            self._send_bytes(line)

    @property
    def pid(self) -> int | None:
        """The guard's pid (None before start or after close)."""
        return self._proc.pid if self._proc is not None else None

    def _on_guard_exit(self) -> None:
        """The guard died while the job runs: reap it and start another with every worker still listed."""
        if self._closed or self._proc is None or self._fd is None:
            return
        if self._loop is not None:
            self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._fd = None
        code = self._proc.wait()
        with contextlib.suppress(OSError):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        self._proc = None
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        try:
            self._spawn()
        except OSError as e:
            error: OSError | None = e
        else:
            error = None
        if error is not None:
            why = f"the shepherd died ({how}) and could not be restarted: {error}"
            self.log.error("shepherd_lost", detail=why)
            if self.on_lost is not None:
                self.on_lost(why)
            return
        self.restarts += 1
        self.log.warning("shepherd_restarted", died_of=how, workers=len(self._watched), pid=self.pid)

    def check(self) -> None:
        """Replace the guard now if it died (for callers without a running loop); raises ShepherdLostError."""
        if self._fd is not None and procs.exited(self._fd):
            lost: list[str] = []
            previous = self.on_lost
            self.on_lost = lost.append
            try:
                self._on_guard_exit()
            finally:
                self.on_lost = previous
            if lost:
                raise ShepherdLostError(lost[0])

    def watch(self, pid: int) -> None:
        """Kill worker `pid` (its group, its session, its tag) if the agent dies. Call while it is not reaped."""
        st = procs.read_stat(pid)
        if st is None:
            return
        self.start()
        self._watched[pid] = st.start_time
        self._send(f"+ {pid} {st.start_time}\n")

    def forget(self, pid: int) -> None:
        """Worker `pid` is about to be reaped: never touch it again."""
        if self._watched.pop(pid, None) is not None:
            self._send(f"- {pid}\n")

    def revoke_at_death(self, ticket: DeathNote | None) -> None:
        """If the agent dies, the guard also revokes the etcd lease of `ticket` (None: the agent gave it up itself).

        Called whenever the lease is granted or replaced; starts the guard, so that an agent dying while it waits
        in a rendezvous is seen at once too. The ticket (the etcd password with it, when auth is on) goes over the
        guard's pipe only: never into an environment, a command line or a file.
        """
        if ticket is None:
            if not self._lease_line:
                return
            self._lease_line = b"L\n"
        else:
            self.start()
            self._lease_line = b"L " + ticket.handler().encode() + b" " + ticket.encode() + b"\n"
        self._send_bytes(self._lease_line)

    def remove_at_death(self, folder: Path) -> None:
        """If the agent dies, the guard removes `folder` last; starts the guard.

        `folder`: a private `runner-*` temp folder the agent made and removes itself at its end (the flight
        recorder's sockets).
        """
        line = b"D " + os.fsencode(folder.absolute()) + b"\n"
        if b"\n" in line[:-1] or line in self._folders:
            return  # a newline in the path cannot go over the pipe: the folder stays, as it would have
        self.start()
        self._folders.append(line)
        self._send_bytes(line)

    def _send(self, line: str) -> None:
        self._send_bytes(line.encode())

    def _send_bytes(self, line: bytes) -> None:
        pipe = self._pipe()
        if pipe is None:
            return
        try:
            pipe.write(line)
            pipe.flush()
        except OSError:
            pass  # the guard just died: its pidfd is readable and _on_guard_exit resends everything

    def _pipe(self) -> IO[bytes] | None:
        if self._closed or self._proc is None:
            return None
        return self._proc.stdin

    def close(self) -> None:
        """End of the job: the guard kills whatever of the job is left, removes the cgroup and exits; we reap it.

        With agent=True, orphans that reparented to this process are killed and reaped too. Later calls do nothing.
        """
        if self._closed:
            return
        self._closed = True
        if self._fd is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None
        if self._proc is not None:
            assert self._proc.stdin is not None
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
            self._proc.wait()
        self._proc = None
        if self.agent and self._started:
            killed, stuck = kill_orphans()
            if killed or stuck:
                self.log.warning("orphans_killed", pids=killed, unkillable=[procs.describe(p) for p in stuck])


def kill_orphans(timeout: float = 10.0) -> tuple[list[int], list[int]]:
    """SIGKILL and reap every child of this process: with the subreaper set, descendants that leaked.

    Only for a process whose every child is the job's (the runner's agent at the job's end, its guard reaped).
    Waits at most `timeout` s for them to die. Returns (pids killed, pids that would not die: left unreaped).
    """
    me = os.getpid()
    killed: list[int] = []
    stuck: list[int] = []
    for _ in range(20):  # an orphan's own children reparent here once it dies: a few passes
        hit = procs.signal_matching(
            lambda p: (st := procs.read_stat(p)) is not None and st.ppid == me, signal.SIGKILL, skip=frozenset(stuck)
        )
        left = procs.wait_exited(list(hit.values()), timeout)
        for pid, fd in hit.items():
            if fd in left:
                stuck.append(pid)
                continue
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG)
            killed.append(pid)
        procs.close_all(hit)
        if not hit:
            break
    return killed, stuck
