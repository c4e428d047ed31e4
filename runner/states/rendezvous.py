"""RENDEZVOUS: join a round, learn ranks and the master address, plan this node's workers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runner.core.machine import Step, Trigger
from runner.errors import EXIT_INFRA, JobClosed, RendezvousError, RendezvousTimeout
from runner.outcomes import FailureKind, Outcome
from runner.states.waiting import Stopped, unless_stopped
from runner.workers.failures import Failure

if TYPE_CHECKING:
    from runner.core.context import Context


async def handle(ctx: Context) -> Step:
    """Wait for the round to close (or a stop), then build the LaunchPlan."""
    try:
        result = await unless_stopped(ctx, ctx.rendezvous.next_round(ctx.run.attempt))
    except Stopped:
        return Step(Trigger.stop_requested, "stop requested during rendezvous")
    except JobClosed as e:
        return Step(Trigger.job_closed, e.message, Outcome.STOPPED, EXIT_INFRA)
    except RendezvousTimeout as e:
        ctx.run.failure = Failure(kind=FailureKind.RENDEZVOUS, reason=e.message, attempt=ctx.run.attempt, hint=e.fix)
        return Step(Trigger.rendezvous_timeout, e.message)
    except RendezvousError as e:
        ctx.run.failure = Failure(kind=FailureKind.RENDEZVOUS, reason=e.message, attempt=ctx.run.attempt, hint=e.fix)
        return Step(Trigger.fatal, e.message, Outcome.ERROR, EXIT_INFRA)
    ctx.run.result = result
    ctx.run.plan = ctx.make_plan()
    return Step(
        Trigger.rendezvous_complete,
        f"round {result.round}: {result.group_world_size} node(s), world size {result.world_size}, "
        f"master {result.master_addr}:{result.master_port}",
    )
