"""RENDEZVOUS: check this node's health, join a round, learn ranks and the master address, plan this node's workers."""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING

from runner.config.durations import format_duration
from runner.core.machine import Step, Trigger
from runner.diagnosis.failure import Failure
from runner.errors import EXIT_INFRA, EXIT_STOPPED_BASE, JobClosed, RendezvousError, RendezvousTimeout
from runner.outcomes import FailureKind, Outcome
from runner.states.waiting import Stopped, unless_stopped

if TYPE_CHECKING:
    from runner.core.context import Context
    from runner.health.report import HealthReport
    from runner.rendezvous.base import RendezvousResult

HEALTH_KEPT = 20  # failed tries of the health checks kept for report.json


async def handle(ctx: Context) -> Step:
    """Pass the health checks (when the spec has some), wait for the round to close (or a stop), build the plan.

    A node that held up the last attempt's hang sits this round out (docs/hangs.md): it leaves with exit 3.
    """
    if (step := await kept_out_step(ctx) or (await health_step(ctx) if ctx.spec.health.configured else None)):
        return step
    try:
        result = await unless_stopped(ctx, ctx.rendezvous.next_round(ctx.run.attempt))
    except Stopped:
        return Step(Trigger.stop_requested, "stop requested during rendezvous")
    except JobClosed as e:
        # A member of the job (it ran an attempt) stopped while it waits for the next round ends as its peers that
        # ran workers did (143); a node that arrives at a closed job, or finds it ended, exits 3 (nothing ran).
        member_stopped = e.stopping and ctx.run.attempt > 0
        code = EXIT_STOPPED_BASE + signal.SIGTERM if member_stopped else EXIT_INFRA
        return Step(Trigger.job_closed, e.message, Outcome.STOPPED, code)
    except RendezvousTimeout as e:
        ctx.run.failure = Failure(kind=FailureKind.RENDEZVOUS, reason=e.message, attempt=ctx.run.attempt, hint=e.fix)
        return Step(Trigger.rendezvous_timeout, e.message)
    except RendezvousError as e:
        ctx.run.failure = Failure(kind=FailureKind.RENDEZVOUS, reason=e.message, attempt=ctx.run.attempt, hint=e.fix)
        return Step(Trigger.fatal, e.message, Outcome.ERROR, EXIT_INFRA)
    ctx.run.result = result
    return await planned(ctx, result)


async def planned(ctx: Context, result: RendezvousResult) -> Step:
    """The attempt's plan, once what it needs is ready (a replica group's lighthouse: Context.before_plan)."""
    if ctx.before_plan is not None:
        try:
            await unless_stopped(ctx, ctx.before_plan())
        except Stopped:
            return Step(Trigger.stop_requested, "stop requested while the lighthouse moved")
    ctx.run.plan = ctx.make_plan()
    return Step(
        Trigger.rendezvous_complete,
        f"round {result.round}: {result.group_world_size} node(s), world size {result.world_size}, "
        f"master {result.master_addr}:{result.master_port}",
    )


async def kept_out_step(ctx: Context) -> Step | None:
    """The step out (exit 3, no worker started) for a node kept out (docs/hangs.md); None for any other.

    Kept out: it held up the last hang, or its own failures in the node ledger reached health.max_failures. The
    first round also marks the node seen in the ledger.
    """
    if ctx.run.attempt == 0:
        await ctx.rendezvous.note_node(None)
    if not ctx.run.kept_out and ctx.spec.health.max_failures:
        ctx.run.kept_out = await ledger_verdict(ctx)
    if not ctx.run.kept_out:
        return None
    ctx.run.failure = Failure(kind=FailureKind.HEALTH, reason=ctx.run.kept_out, attempt=ctx.run.attempt,
                              hint="the other nodes go on without it; the hang's root cause is in report.json "
                                   "(watchdog.keep_out_culprit: false keeps such a node in)")
    return Step(Trigger.fatal, ctx.run.kept_out, Outcome.ERROR, EXIT_INFRA)


async def ledger_verdict(ctx: Context) -> str:
    """Why the node ledger keeps this node out ('' when it does not): its own failures within the window."""
    health = ctx.spec.health
    record = (await ctx.rendezvous.node_ledger()).get(ctx.inputs.node)
    counts = record.counts(since=time.time() - health.failure_window) if record is not None else {}
    total = sum(counts.values())
    if total < health.max_failures:
        return ""
    by_class = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    return (f"kept out by the node ledger: {total} failures of this node in the last "
            f"{format_duration(health.failure_window)} ({by_class}), health.max_failures is {health.max_failures}")


async def health_step(ctx: Context) -> Step | None:
    """None once the node is healthy; else the step out: a stop, or giving up (exit 3, no worker started)."""
    from runner.health.check import Unhealthy  # only a spec with a health section needs the checks

    try:
        await unless_stopped(ctx, healthy(ctx))
    except Stopped:
        return Step(Trigger.stop_requested, "stop requested during the health checks")
    except Unhealthy as e:
        ctx.run.failure = Failure(kind=FailureKind.HEALTH, reason=e.message, attempt=ctx.run.attempt, hint=e.fix,
                                  extra={"health": e.report.to_dict()})
        return Step(Trigger.fatal, e.message, Outcome.ERROR, EXIT_INFRA)
    return None


async def healthy(ctx: Context) -> None:
    """Try the health checks until they pass (docs/health.md); Unhealthy after health.give_up_after.

    The node stays out of the round meanwhile: it joins only once healthy. Each failed try is kept (the last
    HEALTH_KEPT) and published as this node's `unhealthy` state; it is cleared once a try passes.
    """
    from runner.health.check import check_spec, until_healthy

    run = ctx.run

    async def failed(report: HealthReport) -> None:
        run.unhealthy = {**report.to_dict(), "attempt": run.attempt}
        run.health = [*run.health, run.unhealthy][-HEALTH_KEPT:]
        await ctx.status.publish()

    try:
        await until_healthy(ctx.spec.health, lambda limit: check_spec(ctx.spec, timeout=limit, guard=ctx.shepherd),
                            log=ctx.log, on_failed=failed)
    finally:
        run.unhealthy = None
