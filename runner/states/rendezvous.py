"""RENDEZVOUS: join a round, learn ranks and the master address, plan this node's workers."""

from __future__ import annotations

from typing import Any

from runner.errors import EXIT_INFRA, JobClosed, RendezvousError, RendezvousTimeout
from runner.machine import Trigger
from runner.states.waiting import Stopped, unless_stopped
from runner.workers.failures import Failure


async def handle(ctx: Any) -> Trigger:
    """Wait for the round to close (or a stop), then build the LaunchPlan."""
    try:
        result = await unless_stopped(ctx, ctx.rendezvous.next_round(ctx.attempt))
    except Stopped:
        ctx.reason = "stop requested during rendezvous"
        return Trigger.stop_requested
    except JobClosed as e:
        ctx.reason, ctx.outcome, ctx.exit_code = e.message, "stopped", EXIT_INFRA
        return Trigger.job_closed
    except RendezvousTimeout as e:
        ctx.failure = Failure(kind="rendezvous", reason=e.message, attempt=ctx.attempt, hint=e.fix)
        ctx.reason = e.message
        return Trigger.rendezvous_timeout
    except RendezvousError as e:
        ctx.failure = Failure(kind="rendezvous", reason=e.message, attempt=ctx.attempt, hint=e.fix)
        ctx.reason, ctx.outcome, ctx.exit_code = e.message, "error", EXIT_INFRA
        return Trigger.fatal
    ctx.result = result
    ctx.plan = ctx.make_plan()
    ctx.reason = (
        f"round {result.round}: {result.group_world_size} node(s), world size {result.world_size}, "
        f"master {result.master_addr}:{result.master_port}"
    )
    return Trigger.rendezvous_complete
