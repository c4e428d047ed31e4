"""Where a restart is decided.

The guards of FAILED's edges (runner/machine.py lists them in order) and what each edge means for the job (reason,
outcome, exit code).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runner.errors import EXIT_INFRA, EXIT_WORKERS_FAILED, RendezvousError
from runner.machine import Edge, Guard, GuardCheck, Step, Trigger
from runner.outcomes import Outcome

if TYPE_CHECKING:
    from runner.context import Context


async def stopping(ctx: Context) -> bool:
    """A stop (graceful or not) arrived: nothing restarts once the job is stopping."""
    return ctx.stop is not None


async def infrastructure(ctx: Context) -> bool:
    """The failure is not the workers' (rendezvous, a lost guard): retrying the workers would not help."""
    return ctx.failure is not None and ctx.failure.kind.infrastructure


async def non_retryable_exit(ctx: Context) -> bool:
    """The failed worker's exit code is one the spec says never to retry."""
    code = ctx.failure.exit_code if ctx.failure is not None else None
    return code is not None and code in ctx.spec.restart.non_retryable_exit_codes


async def restart_charged(ctx: Context) -> bool:
    """Charge one restart to the job's budget (shared by every node with etcd).

    False once it is spent, or when the budget cannot be reached (etcd down past its connect timeout): no node
    restarts on a budget it cannot count.
    """
    try:
        used = await ctx.rendezvous.charge_restart(ctx.spec.restart.max_restarts)
    except RendezvousError as e:
        ctx.budget_error = e.message
        return False
    if used is None:
        return False
    ctx.restarts = used
    return True


GUARDS: dict[Guard, GuardCheck] = {
    Guard.stopping: stopping,
    Guard.infrastructure: infrastructure,
    Guard.non_retryable_exit: non_retryable_exit,
    Guard.restart_charged: restart_charged,
}


def settle(ctx: Context, edge: Edge) -> Step:
    """The reason, outcome and exit code of the policy edge `edge`, taken from FAILED."""
    failure = ctx.failure
    limit = ctx.spec.restart.max_restarts
    if edge.trigger is Trigger.retry:
        return Step(edge.trigger, f"restart {ctx.restarts} of {limit}")

    def gave_up(reason: str, exit_code: int = EXIT_WORKERS_FAILED) -> Step:
        return Step(edge.trigger, reason, Outcome.FAILED, exit_code)

    if edge.when is Guard.stopping:
        return gave_up("stopping: no restart")
    if edge.when is Guard.infrastructure:
        return gave_up(f"not retried: {failure.reason if failure else 'infrastructure failure'}", EXIT_INFRA)
    if edge.when is Guard.non_retryable_exit:
        return gave_up(f"exit code {failure.exit_code if failure else None} is non-retryable")
    if ctx.budget_error:
        return gave_up(f"not retried: the restart budget is unreachable ({ctx.budget_error})", EXIT_INFRA)
    return gave_up(f"restart budget spent ({limit} of {limit} used)")
