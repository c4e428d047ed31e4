"""The agent's watchdog: the file-timer server and the heartbeat monitor, turned into TimerExpired events.

An expiry is a failure of the attempt, never the agent's suicide: the hung worker's stacks are captured,
the worker is signalled, and RUNNING turns the event into FAILED so the restart policy decides.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

import structlog

from runner.config.spec import Watchdog as WatchdogSpec
from runner.contract import HEARTBEAT_FILE_VAR
from runner.events import TimerExpired
from runner.hangs import Culprit
from runner.rundir.layout import stacks_file
from runner.system.soft_io import warn_once
from runner.watchdog.clock import Clock, SystemClock
from runner.watchdog.flight import FlightRecorder
from runner.watchdog.heartbeat import HeartbeatMonitor
from runner.watchdog.stacks import capture_stacks
from runner.watchdog.steps import reported_step
from runner.watchdog.timer_server import Expiry, FileTimerServer
from runner.workers.group import Worker, WorkerGroup

TIMER_ENV = "TORCHELASTIC_TIMER_FILE"
HEARTBEAT_HINT = (f'add at every training step: Path(os.environ["{HEARTBEAT_FILE_VAR}"]).touch()  '
                  "(or runner.watchdog.heartbeat.beat()); docs/watchdog.md#heartbeat")


class EventSink(Protocol):
    """Where TimerExpired goes: the agent's event queue."""

    def put_nowait(self, item: TimerExpired, /) -> None:
        """Queue one event without waiting."""
        ...


class Watchdog:
    """Owns the timer server and (when heartbeat_timeout is set) the heartbeat monitor of one agent.

    group() is the current WorkerGroup (None between attempts): the owner lookup for pids and the source of
    each rank's plan (rank, log dir, heartbeat file).
    """

    def __init__(
        self,
        cfg: WatchdogSpec,
        *,
        run_dir: Path,
        events: EventSink,
        log: structlog.typing.FilteringBoundLogger,
        group: Callable[[], WorkerGroup | None],
        clock: Clock | None = None,
        recorder: FlightRecorder | None = None,
    ) -> None:
        self.cfg = cfg
        self.recorder = recorder  # every rank's flight recorder (docs/hangs.md); None: off
        self.events = events
        self.log = log
        self.group = group
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.server = FileTimerServer(
            run_dir,
            owner=self.owner,
            on_expiry=self.on_expiry,
            clock=self.clock,
            check_interval=cfg.check_interval,
            capture_stacks=cfg.capture_stacks,
            log=log,
            on_first_request=self.first_request,
            before_signal=self.culprit,
        )
        self.on_first_request: Callable[[int, float], None] | None = None  # readiness (runner/watchdog/readiness.py)
        self.monitor = (  # a worker is timed from its first heartbeat: one that never sent any is not hung
            HeartbeatMonitor(cfg.heartbeat_timeout, self.on_silent, clock=self.clock,
                             activity=self.server.last_activity, log=log, first_sign=True, on_unsent=self.on_unsent)
            if cfg.heartbeat_timeout
            else None
        )
        self.progress = (  # a progress stall: the step in the heartbeat file stays the same (a worker that reports)
            HeartbeatMonitor(cfg.progress_timeout, self.on_stalled, clock=self.clock, log=log, sign=reported_step,
                             first_sign=True, event="progress_stalled")
            if cfg.progress_timeout
            else None
        )
        self._pids: dict[int, int] = {}  # local rank -> pid of the worker last watched
        self._tasks: set[asyncio.Task[None]] = set()

    def owner(self, pid: int) -> int | None:
        """Local rank of the current worker that `pid` is (or descends from)."""
        group = self.group()
        return group.owner(pid) if group is not None else None

    def worker_env(self, local_ranks: Iterable[int]) -> dict[int, dict[str, str]]:
        """Per local rank: TORCHELASTIC_TIMER_FILE, that rank's own FIFO (FileTimerClient's channel)."""
        return {r: {TIMER_ENV: self.server.channel(r)} for r in local_ranks}

    async def culprit(self) -> Culprit | None:
        """Every worker's flight recorder, read once per attempt (the first expiry asks; the others wait for it)."""
        group = self.group()
        if group is None or self.recorder is None:
            return None
        return await self.recorder.named(group.workers.values())

    def found(self) -> Culprit | None:
        """The culprit this attempt's query found, once it is done."""
        return self.recorder.found() if self.recorder is not None else None

    def first_request(self, local_rank: int, at: float) -> None:
        """The first timer request of `local_rank`'s current worker was read at `at`: pass it on (readiness)."""
        if self.on_first_request is not None:
            self.on_first_request(local_rank, at)

    def _worker(self, local_rank: int) -> Worker | None:
        group = self.group()
        return group.workers.get(local_rank) if group is not None else None

    def watch(self, group: WorkerGroup) -> None:
        """Note every live worker not yet watched (call after spawning): a replaced one's timers are forgotten."""
        for w in group.running():
            rank = w.plan.local_rank
            if self._pids.get(rank, w.pid) != w.pid:
                self.server.forget(rank)
            self._pids[rank] = w.pid
            path = Path(w.plan.heartbeat_file)
            for monitor in (self.monitor, self.progress):
                if monitor is not None and not monitor.watching(rank, path):
                    monitor.watch(rank, path)

    def on_expiry(self, e: Expiry) -> None:
        """A FileTimerClient scope expired and the worker was signalled: report it as TimerExpired."""
        worker = self._worker(e.local_rank)
        if worker is None:
            return
        rank = worker.plan.rank
        reason = f"watchdog: scope '{e.scope}' on rank {rank} expired after {e.timeout_s:.1f} s"
        self.emit(TimerExpired(e.local_rank, rank, e.pid, e.scope, e.signalled_at - e.deadline, e.stacks, reason,
                               self.found()))

    def on_silent(self, local_rank: int, silent_s: float) -> None:
        """No heartbeat (file change or timer request) for heartbeat_timeout: hung. Stacks, SIGKILL, report."""
        timeout = self.cfg.heartbeat_timeout
        if timeout is not None:
            self.kill_hung(local_rank, silent_s, timeout, "heartbeat",
                           f"sent no heartbeat for {silent_s:.1f} s (heartbeat_timeout {timeout:g} s)")

    def on_unsent(self, local_rank: int, waited_s: float) -> None:
        """A worker sent no heartbeat in its first heartbeat_timeout: not timed (no first beat), said once a run."""
        worker = self._worker(local_rank)
        rank = worker.plan.rank if worker is not None else local_rank
        self.log.warning("heartbeat_never_sent", rank=rank, local_rank=local_rank, waited_s=round(waited_s, 1),
                         message=(f"rank {rank} sent no heartbeat in its first {waited_s:.1f} s: the script does not "
                                  f"touch {HEARTBEAT_FILE_VAR}, so watchdog.heartbeat_timeout does not time its "
                                  "workers (a worker is timed from its first heartbeat)"),
                         hint=HEARTBEAT_HINT)

    def on_stalled(self, local_rank: int, silent_s: float) -> None:
        """The step a worker reports has not moved for progress_timeout: a progress stall, hung like a silence."""
        timeout, path = self.cfg.progress_timeout, self._heartbeat_file(local_rank)
        if timeout is not None:
            step = reported_step(path) if path is not None else None
            self.kill_hung(local_rank, silent_s, timeout, "progress",
                           f"reported no new step for {silent_s:.1f} s (last step {step}; progress_timeout "
                           f"{timeout:g} s)")

    def _heartbeat_file(self, local_rank: int) -> Path | None:
        worker = self._worker(local_rank)
        return Path(worker.plan.heartbeat_file) if worker is not None else None

    def kill_hung(self, local_rank: int, silent_s: float, timeout: float, scope: str, what: str) -> None:
        """Read every rank's recorder, take stacks, SIGKILL the worker (its pidfd), report it as TimerExpired."""
        worker = self._worker(local_rank)
        if worker is None or worker.exited.done():
            return
        task = asyncio.get_running_loop().create_task(self._kill_silent(worker, silent_s, timeout, scope, what))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _kill_silent(self, worker: Worker, silent_s: float, timeout: float, scope: str, what: str) -> None:
        found = await self.culprit()
        stacks = await capture_stacks(worker.pid, log=self.log) if self.cfg.capture_stacks else ""
        if worker.exited.done():  # not reaped before exited is set: until then the pid is still our worker's
            return
        if not worker.send_signal(signal.SIGKILL):  # through its pidfd: never a recycled pid
            return
        rank = worker.plan.rank
        reason = f"watchdog: rank {rank} {what}"
        overdue = silent_s - timeout
        self.emit(TimerExpired(worker.plan.local_rank, rank, worker.pid, scope, overdue, stacks, reason, found))

    def emit(self, event: TimerExpired) -> None:
        """Queue the event for RUNNING and keep the stacks beside the rank's logs."""
        worker = self._worker(event.local_rank)
        if event.stacks and worker is not None:
            path = stacks_file(worker.plan.log_dir)
            try:
                path.write_text(event.stacks, encoding="utf-8")
            except OSError as e:  # a full or read-only logs disk: the failure (report.json) keeps them too
                warn_once("stacks_write_failed", path, e)
        self.events.put_nowait(event)

    def clear(self) -> None:
        """Forget every timer and heartbeat (workers are being replaced)."""
        self.server.clear()
        for monitor in (self.monitor, self.progress):
            if monitor is not None:
                monitor.clear()

    async def start(self) -> None:
        """Open every worker's FIFO and start serving timer requests."""
        await self.server.start()

    async def stop(self) -> None:
        """Stop both; cancel kills in flight."""
        for task in list(self._tasks):
            task.cancel()
        self.clear()
        await self.server.stop()

