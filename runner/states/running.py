"""RUNNING: start the planned workers, then turn the first decisive event into a trigger."""

from __future__ import annotations

import asyncio
from typing import Any

from runner.errors import EXIT_OK, EXIT_WORKERS_FAILED
from runner.events import (
    DeadlineReached,
    MembershipChanged,
    PeerLost,
    StopRequested,
    TimerExpired,
    WorkerExited,
)
from runner.machine import Trigger
from runner.workers.failures import Failure, worker_failure
from runner.workers.group import WorkerGroup


async def handle(ctx: Any) -> Trigger:
    """Start workers if this attempt has none yet; wait for events until one decides the next state."""
    if ctx.group is None:
        ctx.group = WorkerGroup(
            ctx.events, ctx.shepherd, tee=ctx.spec.logs.tee, prefix=ctx.spec.logs.prefix, log=ctx.log
        )
        ctx.group.start(ctx.plan)
        if ctx.timer is not None:
            ctx.timer.watch(ctx.group)
        arm_deadline(ctx)
        await ctx.publish()
    while True:
        trigger = await on_event(ctx, await ctx.events.get())
        if trigger is not None:
            return trigger


async def on_event(ctx: Any, event: Any) -> Trigger | None:  # noqa: PLR0911 - one return per event kind
    """The trigger `event` causes, or None to keep running."""
    if isinstance(event, WorkerExited):
        return await on_worker_exit(ctx, event)
    if isinstance(event, TimerExpired):
        ctx.failure = Failure(
            kind="watchdog", reason=event.reason, attempt=ctx.attempt, rank=event.rank,
            local_rank=event.local_rank, stacks=event.stacks, log_dir=rank_dir(ctx, event.local_rank),
        )
        ctx.reason = event.reason
        return Trigger.timer_expired
    if isinstance(event, StopRequested):
        ctx.stop = event
        if event.graceful:
            ctx.log.info("graceful_stop", detail="workers finish; no restart", signum=event.signum)
            return None
        ctx.reason = f"stop requested (signal {event.signum})" if event.signum else "stop requested (runner stop)"
        return Trigger.stop_requested
    if isinstance(event, PeerLost):
        ctx.failure = Failure(kind="peer", reason=f"node {event.node} lost: {event.why}", attempt=ctx.attempt)
        ctx.reason = ctx.failure.reason
        return Trigger.peer_lost
    if isinstance(event, MembershipChanged):
        ctx.reason = f"node(s) waiting to join: {', '.join(event.waiting)}"
        return Trigger.membership_changed
    if isinstance(event, DeadlineReached):
        ctx.reason = f"max_run_time ({event.max_run_time:g} s) reached"
        ctx.failure = Failure(kind="deadline", reason=ctx.reason, attempt=ctx.attempt)
        ctx.outcome, ctx.exit_code = "failed", EXIT_WORKERS_FAILED
        return Trigger.deadline_reached
    return None


async def on_worker_exit(ctx: Any, event: WorkerExited) -> Trigger | None:
    """A failure ends the attempt at once (the first failing rank is the root cause); all zero = success."""
    worker = ctx.group.workers.get(event.local_rank)
    if worker is None or worker.pid != event.pid:
        return None  # a worker of an earlier attempt
    ctx.log.info("worker_exited", rank=event.rank, pid=event.pid, exit_code=event.exit_code)
    await ctx.publish()
    if event.exit_code != 0:
        ctx.failure = worker_failure(ctx.attempt, event.rank, event.local_rank, event.exit_code, worker.plan.log_dir)
        ctx.reason = ctx.failure.reason
        return Trigger.worker_failed
    if not ctx.group.running():
        ctx.reason = f"all {len(ctx.group.workers)} worker(s) exited with code 0"
        ctx.outcome, ctx.exit_code = "succeeded", EXIT_OK
        return Trigger.workers_succeeded
    return None


def rank_dir(ctx: Any, local_rank: int) -> str:
    """Log dir of the current worker of `local_rank`."""
    worker = ctx.group.workers.get(local_rank) if ctx.group is not None else None
    return worker.plan.log_dir if worker is not None else ""


def arm_deadline(ctx: Any) -> None:
    """Once per run: put DeadlineReached on the queue when watchdog.max_run_time has passed since start."""
    limit = ctx.spec.watchdog.max_run_time
    if limit is None or ctx.deadline_armed:
        return
    ctx.deadline_armed = True
    loop = asyncio.get_running_loop()
    delay = max(0.0, ctx.started + limit - loop.time())
    loop.call_later(delay, ctx.events.put_nowait, DeadlineReached(limit))
