"""WorkerGroup: spawn a LaunchPlan's workers, notice exits at once (pidfd), tee their output, stop them.

Every worker runs in its own session (so its own process group); a shepherd process (runner.workers.shepherd_main)
SIGKILLs those groups if the agent dies, whatever kills it. No preexec_fn: running Python between fork and
exec is unsafe once the agent has threads (grpc's, with the etcd backend) and forbids the fast vfork path.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import structlog

from runner.events import WorkerExited
from runner.workers.launch_plan import LaunchPlan, WorkerPlan
from runner.workers.tee import Tee


@dataclass
class Worker:
    """One running (or finished) worker process."""

    plan: WorkerPlan
    attempt: int
    proc: subprocess.Popen[bytes]
    started_at: float
    exited: asyncio.Future[int]
    tees: list[Tee] = field(default_factory=list)

    @property
    def pid(self) -> int:
        """The worker's pid (also its process group id)."""
        return self.proc.pid


class Shepherd:
    """The agent's side of runner.workers.shepherd_main: tells it which process groups to kill if the agent dies."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._closed = False

    def _pipe(self) -> IO[bytes] | None:
        if self._closed:
            return None
        if self._proc is None:
            script = Path(__file__).with_name("shepherd_main.py")
            self._proc = subprocess.Popen(
                [sys.executable, "-S", "-I", str(script)], stdin=subprocess.PIPE, start_new_session=True
            )
        assert self._proc.stdin is not None
        return self._proc.stdin

    def watch(self, pgid: int) -> None:
        """Kill group `pgid` if the agent dies."""
        self._send(f"+ {pgid}\n")

    def forget(self, pgid: int) -> None:
        """Group `pgid` is gone; never kill it."""
        self._send(f"- {pgid}\n")

    def _send(self, line: str) -> None:
        pipe = self._pipe()
        if pipe is not None:
            pipe.write(line.encode())
            pipe.flush()

    def close(self) -> None:
        """Stop the shepherd (after every group was forgotten) and reap it; later calls do nothing."""
        self._closed = True
        if self._proc is not None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            self._proc.wait()
            self._proc = None


class WorkerGroup:
    """The workers of one node. Exits are reported as WorkerExited events on `events`."""

    def __init__(
        self,
        events: asyncio.Queue[Any],
        shepherd: Shepherd,
        *,
        tee: bool,
        prefix: str,
        log: Any = None,
    ) -> None:
        self.events = events
        self.shepherd = shepherd
        self.tee = tee
        self.prefix = prefix
        self.log = log or structlog.get_logger()
        self.workers: dict[int, Worker] = {}  # by local rank

    def start(self, plan: LaunchPlan) -> None:
        """Spawn every worker of `plan`."""
        for wp in plan.workers:
            self.start_one(wp, plan)

    def start_one(self, wp: WorkerPlan, plan: LaunchPlan) -> Worker:
        """Spawn (or replace) the worker of `wp.local_rank`."""
        Path(wp.log_dir).mkdir(parents=True, exist_ok=True)
        stdout: Any
        stderr: Any
        if self.tee:
            stdout = stderr = subprocess.PIPE
        else:
            stdout = Path(wp.stdout_path).open("ab")  # noqa: SIM115 - handed to the child, closed below
            stderr = Path(wp.stderr_path).open("ab")  # noqa: SIM115
        try:
            proc = subprocess.Popen(
                list(wp.argv),
                env=dict(wp.env),
                cwd=wp.cwd,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
            )
        finally:
            if not self.tee:
                stdout.close()
                stderr.close()
        self.shepherd.watch(proc.pid)
        loop = asyncio.get_running_loop()
        worker = Worker(wp, plan.attempt, proc, time.monotonic(), loop.create_future())
        if self.tee:
            label = self.prefix.format(node=plan.node, rank=wp.rank, local_rank=wp.local_rank, attempt=plan.attempt)
            assert proc.stdout is not None
            assert proc.stderr is not None
            worker.tees = [
                Tee(proc.stdout, wp.stdout_path, sys.stdout, label),
                Tee(proc.stderr, wp.stderr_path, sys.stderr, label),
            ]
        self._watch_exit(worker)
        self.workers[wp.local_rank] = worker
        self.log.info("worker_started", rank=wp.rank, local_rank=wp.local_rank, pid=proc.pid)
        return worker

    def _watch_exit(self, worker: Worker) -> None:
        loop = asyncio.get_running_loop()
        pidfd = os.pidfd_open(worker.pid)

        def on_exit() -> None:
            code = worker.proc.poll()
            if code is None:
                return  # spurious wake-up
            loop.remove_reader(pidfd)
            os.close(pidfd)
            for tee in worker.tees:
                tee.finish()
            if not worker.exited.done():
                worker.exited.set_result(code)
            self.events.put_nowait(
                WorkerExited(worker.plan.local_rank, worker.plan.rank, worker.pid, code, worker.attempt)
            )

        loop.add_reader(pidfd, on_exit)

    def running(self) -> list[Worker]:
        """Workers that have not exited yet."""
        return [w for w in self.workers.values() if not w.exited.done()]

    def exit_codes(self) -> dict[int, int | None]:
        """Exit code by global rank (None while running)."""
        return {w.plan.rank: (w.exited.result() if w.exited.done() else None) for w in self.workers.values()}

    def owner(self, pid: int) -> int | None:
        """Local rank of the worker that `pid` is, or descends from (same process group), else None."""
        try:
            pgid = os.getpgid(pid)
        except OSError:
            return None
        for w in self.workers.values():
            if not w.exited.done() and pgid == w.pid:
                return w.plan.local_rank
        return None

    async def stop(self, signame: str, grace: float, hurry: asyncio.Event | None = None) -> None:
        """Signal every live group, wait up to `grace` s (less if `hurry` is set), then SIGKILL what is left."""
        live = self.running()
        if live:
            sig = signal.Signals[signame]
            self.log.info("workers_stopping", signal=signame, grace_s=grace, ranks=[w.plan.rank for w in live])
            for w in live:
                _killpg(w.pid, sig)
            await self._wait(live, grace, hurry)
            left = self.running()
            if left:
                self.log.warning("workers_killed", signal="SIGKILL", after_s=grace, ranks=[w.plan.rank for w in left])
            for w in left:
                _killpg(w.pid, signal.SIGKILL)
            await self._wait(left, None, None)
        self.reap()

    async def stop_one(self, local_rank: int, signame: str, grace: float) -> None:
        """Stop one worker (its whole group) the same way."""
        w = self.workers.get(local_rank)
        if w is None:
            return
        if not w.exited.done():
            _killpg(w.pid, signal.Signals[signame])
            await self._wait([w], grace, None)
            if not w.exited.done():
                _killpg(w.pid, signal.SIGKILL)
                await self._wait([w], None, None)
        _killpg(w.pid, signal.SIGKILL)
        self.shepherd.forget(w.pid)

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
        """Last resort (the agent itself is failing): SIGKILL every group at once, then forget them."""
        for w in self.workers.values():
            _killpg(w.pid, signal.SIGKILL)
            self.shepherd.forget(w.pid)

    def reap(self) -> None:
        """Kill anything left in the workers' process groups (e.g. leaked grandchildren) and forget the groups."""
        for w in self.workers.values():
            if w.exited.done():
                _killpg(w.pid, signal.SIGKILL)
                self.shepherd.forget(w.pid)


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
