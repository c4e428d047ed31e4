"""WorkerGroup: spawn a LaunchPlan's workers, notice exits at once (pidfd), tee their output, stop them.

Every worker runs in its own session (so its own process group), carries the job's tag in its environment and,
where the machine allows, runs in its own cgroup (runner.system.shepherd). A worker is never reaped before
everything it started is gone: until then its pid, process-group id and session id cannot be given to another
process, so signalling them reaches only ours. Its exit is read without reaping (waitid WNOWAIT on its pidfd).
No preexec_fn: running Python between fork and exec is unsafe once the agent has threads (grpc's, with the etcd
backend) and forbids the fast vfork path.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import structlog

from runner.diagnosis.evidence import collateral
from runner.events import WorkerExited
from runner.observe.progress import Progress
from runner.system import procs
from runner.system.cgroup import JobCgroup
from runner.system.procs import exit_code
from runner.system.shepherd import TAG_VAR, Shepherd
from runner.system.soft_io import warn_once
from runner.workers.launch_plan import LaunchPlan, WorkerPlan
from runner.workers.standby import Standby, StandbyPool
from runner.workers.tee import Console, Tee

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

    from runner.events import Event

KILL_TIMEOUT_S = 10.0  # after SIGKILL: how long to wait before reporting a process that does not die
_POLL_S = 0.02
CONSOLE_DRAIN_S = 2.0  # at most, for the console to take the workers' last lines
ROOT_DRAIN_S = 0.5  # per stream, at most: for the root cause's traceback to reach the console

__all__ = ["KILL_TIMEOUT_S", "Shepherd", "Worker", "WorkerGroup", "exit_code", "signal_number"]  # Shepherd: moved


@dataclass
class Worker:
    """One running (or finished) worker process; `pidfd` names it for good, `reaped` once it is collected."""

    plan: WorkerPlan
    attempt: int
    pid: int  # also its process group and session id
    pidfd: int
    exited: asyncio.Future[int]
    tag: str
    cgroup: Path | None = None
    popen: subprocess.Popen[bytes] | None = None  # a cold worker's: kept until reaped, so nobody else waits for it
    returncode: int | None = None  # once reaped
    tees: list[Tee] = field(default_factory=list)
    reaped: bool = False

    def send_signal(self, sig: int) -> bool:
        """Signal this worker only (through its pidfd); False once it is reaped or gone."""
        return not self.reaped and procs.send(self.pidfd, sig)


def signal_number(sig: int | str) -> signal.Signals:
    """A signal given as number or name ('SIGTERM', 'TERM') as a Signals member."""
    if isinstance(sig, str):
        name = sig.strip().upper()
        return signal.Signals[name if name.startswith("SIG") else "SIG" + name]
    return signal.Signals(sig)


class WorkerGroup:
    """The workers of one node. Exits are reported as WorkerExited events on `events`.

    One concern over 20 methods: the processes of one attempt on one node, from spawn to reaped (start, root
    cause among exits, stop and kill, reap); each needs the same table of workers and their pidfds.

    `unkillable` lists the processes a stop left behind because SIGKILL did not take effect within `kill_timeout`
    seconds (uninterruptible sleep, a frozen cgroup): pid, state, wchan and command line of each.
    """

    def __init__(
        self,
        events: asyncio.Queue[Event],
        shepherd: Shepherd,
        *,
        tee: bool,
        prefix: str,
        log: FilteringBoundLogger | None = None,
        kill_timeout: float = KILL_TIMEOUT_S,
        standbys: StandbyPool | None = None,
    ) -> None:
        self.events = events
        self.shepherd = shepherd
        self.tee = tee
        self.prefix = prefix
        self.log = log or structlog.get_logger()
        self.kill_timeout = kill_timeout
        self.standbys = standbys  # where a worker starts warm (runner.workers.standby); None: always cold
        self.workers: dict[int, Worker] = {}  # by local rank
        self.stuck: list[Worker] = []  # stopped but not dead: never reaped by us, still watched by the shepherd
        self.unkillable: list[dict[str, object]] = []
        self.first_failed: int | None = None  # rank that failed first while nobody stopped us: the root cause
        self.stopping = False  # stop() began: exits from now on are ours, not failures of their own
        self.lost_bytes: dict[int, int] = {}  # by rank: output the logs disk refused (full, read-only, gone)

    def start(self, plan: LaunchPlan) -> None:
        """Spawn every worker of `plan`."""
        for wp in plan.workers:
            self.start_one(wp, plan)

    def start_one(self, wp: WorkerPlan, plan: LaunchPlan) -> Worker:
        """Spawn (or replace: stop the old one first) the worker of `wp.local_rank`: in its standby, else cold."""
        try:
            Path(wp.log_dir).mkdir(parents=True, exist_ok=True)
        except OSError as e:  # a full or read-only logs disk: the worker runs all the same, its logs are lost
            warn_once("worker_log_unwritable", wp.log_dir, e)
        # Both streams go through a pipe to a Tee that writes the rank's log file: a worker's own writes never fail
        # because the logs disk is full, read-only or gone (the Tee counts the loss and keeps the last lines). A
        # stream is also echoed on the console unless logs.tee is off, or torchrun's --redirects /
        # --local-ranks-filter leave this rank's stream out (logs.console_streams).
        echoed = (self.tee and wp.stdout_to_console, self.tee and wp.stderr_to_console)
        standby = self.standbys.take(wp) if self.standbys is not None else None
        popen: subprocess.Popen[bytes] | None = None
        if standby is None:
            popen, pipes, tag, cgroup = self._spawn(wp, plan)
            pid = popen.pid
            pidfd = os.pidfd_open(pid)  # not reaped by anyone but us: the pid is still this process's
            self.shepherd.watch(pid)
        else:
            pid, pidfd, tag, cgroup = standby.pid, standby.pidfd, standby.tag, standby.cgroup
            pipes = self._hand_off(standby, wp)
        loop = asyncio.get_running_loop()
        worker = Worker(wp, plan.attempt, pid, pidfd, loop.create_future(), tag, cgroup, popen)
        label = self.prefix.format(node=plan.node, rank=wp.rank, local_rank=wp.local_rank, attempt=plan.attempt)
        for pipe, path, console, echo in zip(pipes, (wp.stdout_path, wp.stderr_path), (sys.stdout, sys.stderr),
                                             echoed, strict=True):
            worker.tees.append(Tee(pipe, path, console if echo else None, label,
                                   functools.partial(self._count_lost, wp.rank)))
        loop.add_reader(pidfd, self._on_exit, worker)
        self.workers[wp.local_rank] = worker
        self.log.info("worker_started", rank=wp.rank, local_rank=wp.local_rank, pid=pid,
                      standby=standby is not None)
        return worker

    def _spawn(
        self, wp: WorkerPlan, plan: LaunchPlan
    ) -> tuple[subprocess.Popen[bytes], tuple[IO[bytes], IO[bytes]], str, Path | None]:
        """A cold worker: a new process for `wp`; (process, its stdout and stderr pipes, tag, cgroup)."""
        tag = self.shepherd.worker_tag(plan.attempt, wp.local_rank)
        cgroup = self.shepherd.worker_cgroup(plan.attempt, wp.local_rank)
        argv = list(wp.argv) if cgroup is None else JobCgroup.enter(cgroup, list(wp.argv))
        proc = subprocess.Popen(
            argv,
            env={**dict(wp.env), TAG_VAR: tag},
            cwd=wp.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        assert proc.stdout is not None  # PIPE
        assert proc.stderr is not None
        return proc, (proc.stdout, proc.stderr), tag, cgroup

    @staticmethod
    def _hand_off(standby: Standby, wp: WorkerPlan) -> tuple[IO[bytes], IO[bytes]]:
        """Give `standby` its orders with the write ends of two pipes for its stdout and stderr; our read ends."""
        ends: list[int] = []  # the worker's ends, ours to close once sent
        pipes: list[IO[bytes]] = []
        try:
            for _ in range(2):
                r, w = os.pipe()
                pipes.append(open(r, "rb", buffering=0))  # noqa: SIM115 - the Tee closes it at EOF
                ends.append(w)
            standby.hand_off(wp, TAG_VAR, ends[0], ends[1])
        finally:
            for fd in ends:
                os.close(fd)
        return pipes[0], pipes[1]

    def _on_exit(self, worker: Worker) -> None:
        """The pidfd is readable: read the exit status but leave the worker unreaped (its ids stay ours)."""
        try:
            result = os.waitid(os.P_PIDFD, worker.pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            result = None
        if result is None:
            return  # spurious wake-up
        asyncio.get_running_loop().remove_reader(worker.pidfd)
        code = exit_code(result)
        for tee in worker.tees:
            tee.finish()
        if code == 0 or self.stopping:
            self._release(worker)  # its output is nobody's collateral: a traceback it printed is shown
        elif self.first_failed is None and not (self.collateral(worker) and self._others_running(worker)):
            self.blame(worker)  # the root cause; a collateral-looking failure waits for RUNNING to settle it
        if not worker.exited.done():
            worker.exited.set_result(code)
        self.events.put_nowait(
            WorkerExited(worker.plan.local_rank, worker.plan.rank, worker.pid, code, worker.attempt)
        )

    def _count_lost(self, rank: int, size: int) -> None:
        self.lost_bytes[rank] = self.lost_bytes.get(rank, 0) + size

    def stderr_tail(self, local_rank: int) -> str:
        """The last lines the worker of `local_rank` wrote on stderr, from memory (the disk may have lost them)."""
        w = self.workers.get(local_rank)
        return w.tees[1].tail() if w is not None and len(w.tees) > 1 else ""

    @staticmethod
    def collateral(worker: Worker) -> bool:
        """Whether the worker's last exception says a peer died first (gloo's closed connection, a lost store...)."""
        return len(worker.tees) > 1 and collateral(worker.tees[1].tail())

    def _others_running(self, worker: Worker) -> bool:
        return any(w is not worker for w in self.running())

    @staticmethod
    def _release(worker: Worker) -> None:
        for tee in worker.tees:
            tee.release()

    def blame(self, failed: Worker) -> None:
        """`failed` is the root cause: its output is shown; the other ranks' from now on is collateral.

        Collateral output (a traceback they began before included) is folded on a terminal. Once per attempt: the
        first blame stays.
        """
        if self.first_failed is not None:
            return
        self.first_failed = failed.plan.rank
        self._release(failed)
        for tee in failed.tees:  # its traceback on the console before the agent's FAILED line (bounded)
            tee.drain(ROOT_DRAIN_S)
        for w in self.workers.values():
            if w is not failed:
                for tee in w.tees:
                    tee.fold(f"rank {failed.plan.rank}")

    async def settle(self, failed: Worker, within: float) -> Worker:
        """The root cause when `failed` exited with a collateral-looking error (a peer's closed connection).

        Waits up to `within` s, while other workers run, for one of them to fail of its own (`blame` in `_on_exit`);
        that one is the root cause. Else `failed` is: every other worker ended, none failed of its own, or the wait
        ran out (the root cause is then on another node, or the exception only looked collateral).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while self.first_failed is None and (pending := {w.exited for w in self.running() if w is not failed}):
            left = deadline - loop.time()
            if left <= 0:
                break
            await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        self.blame(failed)
        return next(w for w in self.workers.values() if w.plan.rank == self.first_failed)

    def _collateral_ends(self) -> None:
        """Every rank's output is echoed again (scope worker: the failed worker is replaced, the others go on)."""
        self.first_failed = None
        for tee in (t for w in self.workers.values() for t in w.tees):
            tee.unfold()

    def running(self) -> list[Worker]:
        """Workers that have not exited yet."""
        return [w for w in self.workers.values() if not w.exited.done()]

    def owner(self, pid: int) -> int | None:
        """Local rank of the running worker that `pid` is or descends from (its group, session or tag), else None."""
        st = procs.read_stat(pid)
        if st is None:
            return None
        for w in self.running():
            if w.pid in (st.pgid, st.sid) or procs.environ_has(pid, procs.tag_entry(w.tag)):
                return w.plan.local_rank
        return None

    async def stop(self, sig: int | str, grace: float, hurry: asyncio.Event | None = None) -> None:
        """Send `sig` to every live worker's group, grace, then SIGKILL all that is left of them, and reap.

        The grace lasts `grace` s, less if `hurry` is set. SIGKILL reaches the workers' children too, wherever they
        went (cgroup, session, tag). Returns after at most grace + kill_timeout seconds even if a process will not
        die (see `unkillable`).
        """
        live = self.running()
        self.stopping = True
        if live:
            signum = signal_number(sig)
            self.log.info("workers_stopping", signal=signum.name, grace_s=grace, ranks=[w.plan.rank for w in live])
            for w in live:
                self._signal_group(w, signum)
            ends = asyncio.get_running_loop().time() + grace
            with Progress(self.log, "grace", lambda: {"ranks": [w.plan.rank for w in self.running()],
                                                      "signal": signum.name}, ends):
                await self._wait(live, grace, hurry)
            left = self.running()
            if left:
                self.log.warning("workers_killed", signal="SIGKILL", after_s=grace, ranks=[w.plan.rank for w in left])
        await self._finish([w for w in self.workers.values() if not w.reaped])
        for tee in (t for w in self.workers.values() for t in w.tees):
            tee.finish()  # the pipes are at EOF now: the last lines, and the folded output's one-line notes
            tee.release()  # a traceback still held: shown (no rank was blamed) or counted (folded)
        Console.drain_all(CONSOLE_DRAIN_S)

    async def stop_one(self, local_rank: int, sig: int | str, grace: float) -> None:
        """Stop one worker (its whole group, its children) the same way."""
        self._collateral_ends()  # scope worker: only this one is replaced, the other ranks go on and are heard
        w = self.workers.get(local_rank)
        if w is None or w.reaped:
            return
        if not w.exited.done():
            self._signal_group(w, signal_number(sig))
            await self._wait([w], grace, None)
        await self._finish([w])

    @staticmethod
    def _signal_group(w: Worker, sig: int) -> None:
        """Signal the worker's process group. Safe: w is not reaped, so its id is still its group's.

        A stop signal is followed by SIGCONT, as systemd does: a stopped process (SIGSTOP, SIGTSTP, a hung tracer)
        only acts on it once continued, and would otherwise cost the whole grace period before SIGKILL.
        """
        if not w.reaped:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(w.pid, sig)
                if sig not in (signal.SIGKILL, signal.SIGCONT):
                    os.killpg(w.pid, signal.SIGCONT)

    def _kill(self, workers: list[Worker]) -> dict[int, int]:
        """SIGKILL everything of `workers`: cgroup, group, and (without cgroup) session members and tagged processes.

        Returns {pid: pidfd} of the processes found outside the groups (the caller waits for them and closes them).
        """
        for w in workers:
            if w.cgroup is not None:
                JobCgroup.kill(w.cgroup)
            self._signal_group(w, signal.SIGKILL)
        loose = [w for w in workers if w.cgroup is None and not w.reaped]
        if not loose:
            return {}
        matchers = [procs.in_session(w.pid, w.pidfd) for w in loose]
        tags = [procs.tag_entry(w.tag) for w in loose]

        def ours(pid: int) -> bool:
            return any(m(pid) for m in matchers) or any(procs.environ_has(pid, t) for t in tags)

        return procs.signal_matching(ours, signal.SIGKILL, skip=frozenset(self._not_loose()))

    def _not_loose(self) -> set[int]:
        """Pids a sweep leaves alone: the guard, and the workers themselves (each is killed and reaped on its own)."""
        own = {w.pid for w in self.workers.values()} | {w.pid for w in self.stuck}
        return own | ({self.shepherd.pid} if self.shepherd.pid is not None else set())

    async def _finish(self, workers: list[Worker]) -> None:
        """SIGKILL what is left of `workers`, wait (bounded) until it is gone, reap; report what will not die."""
        if not workers:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.kill_timeout
        loose = self._kill(workers)
        try:
            await self._wait(workers, self.kill_timeout, None)
            while loop.time() < deadline and self._left(workers, loose):
                await asyncio.sleep(_POLL_S)
                for pid, fd in self._kill(workers).items():  # whatever forked meanwhile
                    if pid in loose:
                        os.close(fd)
                    else:
                        loose[pid] = fd
            self._reap_children(loose)
            stuck = self._left(workers, loose)
        finally:
            procs.close_all(loose)
        for w in workers:
            if w.exited.done():
                self._reap(w)
            elif w not in self.stuck:
                self.stuck.append(w)
        if stuck:
            report = [procs.describe(pid) for pid in stuck]
            self.unkillable.extend(report)
            self.log.error("workers_unkillable", after_s=self.kill_timeout, processes=report,
                           detail="SIGKILL did not take effect (uninterruptible sleep?); left behind")

    @staticmethod
    def _left(workers: list[Worker], loose: dict[int, int]) -> list[int]:
        """Pids of `workers` and `loose` that still run (a worker's cgroup counts while populated)."""
        left = [w.pid for w in workers if not w.exited.done()]
        for w in workers:
            if w.cgroup is not None and JobCgroup.populated(w.cgroup):
                left += [p for p in JobCgroup.procs(w.cgroup) if p != w.pid and p not in left]
        left += [pid for pid, fd in loose.items() if not procs.exited(fd)]
        return left

    @staticmethod
    def _reap_children(loose: dict[int, int]) -> None:
        """Collect the killed processes that were our children (orphans that reparented to us, the subreaper)."""
        me = os.getpid()
        for pid, fd in loose.items():
            st = procs.read_stat(pid)
            if st is not None and st.ppid == me and procs.exited(fd):
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG)

    def _reap(self, w: Worker) -> None:
        """Collect an exited worker whose processes are gone; only now may its ids go to another process."""
        if w.reaped:
            return
        self.shepherd.forget(w.pid)
        try:
            result = os.waitid(os.P_PIDFD, w.pidfd, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            result = None
        if result is not None:
            w.returncode = exit_code(result)
            if w.popen is not None:
                w.popen.returncode = w.returncode
        w.reaped = True
        os.close(w.pidfd)
        if w.cgroup is not None:
            JobCgroup.remove_child(w.cgroup)
        if w in self.stuck:
            self.stuck.remove(w)

    def collect(self) -> int:
        """Reap the stuck workers that have died since (e.g. an uninterruptible sleep ended); how many."""
        done = [w for w in self.stuck if procs.exited(w.pidfd)]
        for w in done:
            with contextlib.suppress(ChildProcessError):
                result = os.waitid(os.P_PIDFD, w.pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                if result is not None and not w.exited.done():
                    w.exited.set_result(exit_code(result))
            asyncio.get_running_loop().remove_reader(w.pidfd)
            self._reap(w)
        return len(done)

    async def _wait(self, workers: list[Worker], timeout: float | None, hurry: asyncio.Event | None) -> None:
        """Until every worker in `workers` exited, `timeout` passed, or `hurry` was set. Never cancels `exited`."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        hurry_task = asyncio.ensure_future(hurry.wait()) if hurry is not None else None
        try:
            while True:
                pending: set[asyncio.Future[Any]] = {w.exited for w in workers if not w.exited.done()}
                if not pending or (hurry_task is not None and hurry_task.done()):
                    return
                left = None if deadline is None else deadline - loop.time()
                if left is not None and left <= 0:
                    return
                if hurry_task is not None:
                    pending.add(hurry_task)
                await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if hurry_task is not None and not hurry_task.done():
                hurry_task.cancel()

    def kill_all(self) -> None:
        """Last resort (the agent itself is failing, no loop to wait in): SIGKILL everything of every worker.

        Waits up to kill_timeout for it to die and reaps what died; never longer: the guard still knows the rest.
        """
        workers = [w for w in self.workers.values() if not w.reaped]
        if not workers:
            return
        loose = self._kill(workers)
        try:
            procs.wait_exited([w.pidfd for w in workers] + list(loose.values()), self.kill_timeout)
            self._reap_children(loose)
        finally:
            procs.close_all(loose)
        for w in workers:
            if procs.exited(w.pidfd):
                with contextlib.suppress(RuntimeError, ValueError):
                    asyncio.get_running_loop().remove_reader(w.pidfd)
                self._reap(w)
