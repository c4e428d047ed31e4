"""RESTARTING: stop the survivors (or only the failed worker for scope 'worker'), back off, go again."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from runner.config.spec import Backoff
from runner.machine import Trigger
from runner.states.waiting import Stopped, unless_stopped


async def handle(ctx: Any) -> Trigger:
    """Tear down what failed, wait the backoff, and start the next attempt."""
    spec = ctx.spec
    failure = ctx.failure  # None for a membership change (not charged, no backoff)
    one = spec.restart.scope == "worker" and failure is not None and failure.kind in ("worker", "watchdog")
    if one:
        await ctx.group.stop_one(failure.local_rank, spec.shutdown.signal, spec.shutdown.grace_period)
    elif ctx.group is not None:
        await ctx.group.stop(spec.shutdown.signal, spec.shutdown.grace_period, ctx.hurry)
        ctx.group = None
        if ctx.timer is not None:
            ctx.timer.clear()
    delay = backoff_delay(spec.restart.backoff, ctx.restarts) if failure is not None else 0.0
    try:
        if delay > 0:
            ctx.log.info("backoff", delay_s=round(delay, 3), restart=ctx.restarts)
            await unless_stopped(ctx, asyncio.sleep(delay))
    except Stopped:
        ctx.reason = "stop requested during backoff"
        return Trigger.stop_requested
    ctx.attempt += 1
    ctx.failure = None
    if one:
        plan = ctx.make_plan()
        ctx.group.start_one(plan.workers[failure.local_rank], plan)
        if ctx.timer is not None:
            ctx.timer.watch(ctx.group)
        ctx.reason = f"rank {failure.rank} replaced (scope worker), attempt {ctx.attempt}"
        return Trigger.worker_replaced
    ctx.reason = f"attempt {ctx.attempt}"
    return Trigger.restarted


def backoff_delay(b: Backoff, restart: int, rand: random.Random | None = None) -> float:
    """Seconds to wait before restart number `restart` (1-based): the first is immediate."""
    if restart <= 1:
        return 0.0
    base = min(b.max, b.initial * b.multiplier ** (restart - 2))
    spread = (rand or random).uniform(-b.jitter, b.jitter)
    return max(0.0, base * (1 + spread))
