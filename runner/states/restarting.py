"""RESTARTING: stop the survivors (or only the failed worker for scope 'worker'), back off, go again."""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING

from runner.core.machine import Step, Trigger
from runner.core.restart_policy import counted_as
from runner.errors import EXIT_WORKERS_FAILED
from runner.events import StopRequested
from runner.observe.progress import Progress
from runner.outcomes import Outcome
from runner.states.waiting import Stopped, unless_stopped

if TYPE_CHECKING:
    from runner.config.spec import Backoff
    from runner.core.context import Context
    from runner.diagnosis.failure import Failure


async def handle(ctx: Context) -> Step:
    """Tear down what failed, drop what the old workers still queued, wait the backoff, start the next attempt."""
    spec = ctx.spec
    failure = ctx.run.failure  # None for a membership change (not charged, no backoff)
    one = spec.restart.scope == "worker" and failure is not None and failure.kind.one_worker
    if one and ctx.run.group is not None and failure is not None and failure.local_rank is not None:
        await ctx.run.group.stop_one(failure.local_rank, spec.shutdown.signal, spec.shutdown.grace_period)
    elif ctx.run.group is not None:
        await ctx.run.group.stop(spec.shutdown.signal, spec.shutdown.grace_period, ctx.hurry)
        ctx.run.keep_lost_output()
        ctx.run.group = None
        if ctx.timer is not None:
            ctx.timer.clear()
    if ctx.recorder is not None:
        ctx.recorder.clear()  # the next attempt's hang is asked about afresh
    drop_stale(ctx)
    if ctx.run.standbys is not None:
        ctx.run.standbys.fill()  # normally a no-op: every hand-off already asked the fork server for the next one
    delay = backoff_delay(spec.restart.backoff, ctx.run.restarts) if failure is not None else 0.0
    try:
        if delay > 0:
            ctx.log.info("backoff", delay_s=round(delay, 3), restart=ctx.run.restarts)
            ends = asyncio.get_running_loop().time() + delay
            with Progress(ctx.log, "backoff", lambda: {"restart": ctx.run.restarts}, ends):  # a countdown meanwhile
                await unless_stopped(ctx, asyncio.sleep(delay))
    except Stopped:
        if ctx.stop is not None and ctx.stop.graceful and failure is not None:
            # A graceful stop means "no restart": the job ends with the result of the attempt that failed.
            return Step(Trigger.stop_requested, "graceful stop during backoff: no restart",
                        Outcome.FAILED, EXIT_WORKERS_FAILED)
        return Step(Trigger.stop_requested, "stop requested during backoff")
    ctx.run.attempt += 1
    count_uncharged(ctx, failure)
    ctx.run.failure = None
    if one and ctx.run.group is not None and failure is not None and failure.local_rank is not None:
        return await replace_worker(ctx, failure.rank, failure.local_rank)
    return Step(Trigger.restarted, f"attempt {ctx.run.attempt}")


async def replace_worker(ctx: Context, rank: int | None, local_rank: int) -> Step:
    """Scope worker: start the failed rank's next worker (in its standby when there is one); the others go on."""
    assert ctx.run.group is not None
    plan = ctx.make_plan()
    if ctx.run.standbys is not None:
        await ctx.run.standbys.warm()  # normally at once: the pool asked for this rank's next standby at hand-off
    worker = ctx.run.group.start_one(plan.workers[local_rank], plan)
    ctx.recovery.workers_spawned(ctx.run.attempt, [worker], scope="worker")  # the replaced worker: running
    if ctx.timer is not None:
        ctx.timer.watch(ctx.run.group)
    return Step(Trigger.worker_replaced, f"rank {rank} replaced (scope worker), attempt {ctx.run.attempt}")


def count_uncharged(ctx: Context, failure: Failure | None) -> None:
    """Count, by its cause, a next attempt that restart.max_restarts does not pay for (the summary says them).

    `membership` for a round ended by a node waiting to join; else the class the round counts under when it was not
    charged (restart_policy.counted_as: as the round's charge says on every node; node_lost and preempted by
    default: docs/failure_classes.md).
    """
    cls, charged = counted_as(ctx, failure) if failure is not None else (None, False)
    if charged:
        return
    cause = cls.value if cls is not None else "membership"
    ctx.run.uncharged[cause] = ctx.run.uncharged.get(cause, 0) + 1


def drop_stale(ctx: Context) -> None:
    """Forget queued events of the attempt that ended (exits, timer expiries); keep stop requests and the rest."""
    keep = []
    while not ctx.events.empty():
        event = ctx.events.get_nowait()
        if isinstance(event, StopRequested) or not ctx.run.is_stale(event):
            keep.append(event)
    for event in keep:
        ctx.events.put_nowait(event)


def backoff_delay(b: Backoff, restart: int, rand: random.Random | None = None) -> float:
    """Seconds to wait before restart number `restart` (1-based): the first is immediate."""
    if restart <= 1:
        return 0.0
    try:
        base = min(b.max, b.initial * b.multiplier ** (restart - 2))
    except OverflowError:  # a long crash loop with a large multiplier: the cap is the answer
        base = b.max
    spread = (rand or random).uniform(-b.jitter, b.jitter)
    return max(0.0, base * (1 + spread))
