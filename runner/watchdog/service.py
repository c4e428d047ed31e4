"""The agent's watchdog: the file-timer server and the heartbeat monitor, turned into TimerExpired events.

An expiry is a failure of the attempt, never the agent's suicide: the hung worker's stacks are captured,
the worker is signalled, and RUNNING turns the event into FAILED so the restart policy decides.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from runner.events import TimerExpired
from runner.watchdog.heartbeat import HeartbeatMonitor
from runner.watchdog.stacks import capture_stacks
from runner.watchdog.timer_server import Expiry, FileTimerServer


class Watchdog:
    """Owns the timer server and (when heartbeat_timeout is set) the heartbeat monitor of one agent."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        cfg = ctx.spec.watchdog
        self.server = FileTimerServer(
            ctx.run_dir,
            owner=self.owner,
            on_expiry=self.on_expiry,
            check_interval=cfg.check_interval,
            capture_stacks=cfg.capture_stacks,
            log=ctx.log,
        )
        self.monitor = (
            HeartbeatMonitor(cfg.heartbeat_timeout, self.on_silent, log=ctx.log) if cfg.heartbeat_timeout else None
        )
        self._tasks: set[asyncio.Task[None]] = set()

    def owner(self, pid: int) -> int | None:
        """Local rank of the current worker that `pid` is (or descends from)."""
        return self.ctx.group.owner(pid) if self.ctx.group is not None else None

    def worker_env(self) -> dict[str, str]:
        """What every worker gets: TORCHELASTIC_TIMER_FILE (FileTimerClient's FIFO)."""
        return {"TORCHELASTIC_TIMER_FILE": self.server.path}

    def watch(self, group: Any) -> None:
        """Start heartbeat watching for every live worker not yet watched (call after spawning)."""
        if self.monitor is None:
            return
        for w in group.running():
            path = Path(w.plan.heartbeat_file)
            if not self.monitor.watching(w.plan.local_rank, path):
                self.monitor.watch(w.plan.local_rank, path)

    def on_expiry(self, e: Expiry) -> None:
        """A FileTimerClient scope expired and the worker was signalled: report it as TimerExpired."""
        local_rank = self.owner(e.pid)
        if local_rank is None:
            return
        rank = self.ctx.group.workers[local_rank].plan.rank
        timeout = e.reason.rsplit(" after ", 1)[-1] if " after " in e.reason else "?"
        reason = f"watchdog: scope '{e.scope}' on rank {rank} expired after {timeout}"
        self.emit(TimerExpired(local_rank, rank, e.pid, e.scope, e.signalled_at - e.deadline, e.stacks, reason))

    def on_silent(self, local_rank: int, silent_s: float) -> None:
        """No heartbeat (file touch or timer request) for heartbeat_timeout: hung. Stacks, SIGKILL, report."""
        worker = self.ctx.group.workers.get(local_rank) if self.ctx.group is not None else None
        if worker is None or worker.exited.done():
            return
        last = self.server.last_activity(worker.pid)
        loop = asyncio.get_running_loop()
        timeout = self.ctx.spec.watchdog.heartbeat_timeout
        if last is not None and loop.time() - last < timeout:
            self.monitor.watch(local_rank, Path(worker.plan.heartbeat_file))  # timer traffic counts
            return
        task = loop.create_task(self._kill_silent(worker, silent_s, timeout))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _kill_silent(self, worker: Any, silent_s: float, timeout: float) -> None:
        stacks = await capture_stacks(worker.pid, log=self.ctx.log) if self.ctx.spec.watchdog.capture_stacks else ""
        if worker.exited.done():
            return
        try:
            os.kill(worker.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        rank = worker.plan.rank
        reason = f"watchdog: rank {rank} sent no heartbeat for {silent_s:.1f} s (heartbeat_timeout {timeout:g} s)"
        self.emit(TimerExpired(worker.plan.local_rank, rank, worker.pid, "heartbeat", silent_s - timeout, stacks, reason))

    def emit(self, event: TimerExpired) -> None:
        """Queue the event for RUNNING and keep the stacks beside the rank's logs."""
        worker = self.ctx.group.workers.get(event.local_rank)
        if event.stacks and worker is not None:
            Path(worker.plan.log_dir, "stacks.txt").write_text(event.stacks, encoding="utf-8")
        self.ctx.events.put_nowait(event)

    def clear(self) -> None:
        """Forget every timer and heartbeat (workers are being replaced)."""
        self.server.clear()
        if self.monitor is not None:
            self.monitor.clear()

    async def stop(self) -> None:
        """Stop both; cancel kills in flight."""
        for task in list(self._tasks):
            task.cancel()
        self.clear()
        await self.server.stop()


async def start(ctx: Any) -> Watchdog:
    """Create and start the watchdog for `ctx`."""
    dog = Watchdog(ctx)
    await dog.server.start()
    return dog
