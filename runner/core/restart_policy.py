"""Where a restart is decided.

The guards of FAILED's edges (runner/core/machine.py lists them in order) and what each edge means for the job (reason,
outcome, exit code). Guards only read: FAILED's step gathers the one input that acts (`gather`: the restart charge)
before `decide`, and `settle` acts on the edge taken (telling the other nodes of a give-up).

A failure's class (runner.outcomes.FailureClass) picks its budget in restart.budgets; the
job-wide restart.max_restarts counts the classes that are charged (docs/failure_classes.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from runner.core.context import Charge
from runner.core.machine import TRANSITIONS, Edge, Guard, GuardCheck, Step, Trigger
from runner.diagnosis.evidence import traceback_parts
from runner.diagnosis.failure import peer_reported
from runner.errors import EXIT_INFRA, EXIT_WORKERS_FAILED, RendezvousError
from runner.outcomes import FailureClass, FailureKind, Outcome

if TYPE_CHECKING:
    from runner.config.spec import ClassBudget
    from runner.core.context import Context
    from runner.diagnosis.failure import Failure


def current(ctx: Context) -> Failure:
    """The failure FAILED recorded (every edge into FAILED sets it)."""
    assert ctx.run.failure is not None
    return ctx.run.failure


def budget_of(ctx: Context) -> ClassBudget:
    """restart.budgets' entry for the current failure's class."""
    return ctx.spec.restart.budgets.of(current(ctx).failure_class)


def used_here(ctx: Context) -> int:
    """Restarts this node has made after failures of the current failure's class (the earlier ones: all retried)."""
    cls = current(ctx).failure_class
    return sum(1 for f in ctx.run.failures[:-1] if f.failure_class is cls)


def looping(ctx: Context) -> list[Failure]:
    """The last restart.crash_loop failures when they are the same exception on consecutive attempts, else []."""
    n = ctx.spec.restart.crash_loop
    last = ctx.run.failures[-n:] if n else []
    if len(last) < n or not last or not last[-1].fingerprint:
        return []
    same = all(f.fingerprint == last[-1].fingerprint for f in last)
    consecutive = [f.attempt for f in last] == list(range(last[0].attempt, last[0].attempt + n))
    return last if same and consecutive else []


async def refuse_round(ctx: Context) -> None:
    """Tell the other nodes, through the round's charge, that this failure is not restarted (best effort).

    The first node to charge a round decides for all: a peer that lost this node charges the same round and gives
    up too, instead of waiting for it in the next rendezvous.
    """
    with contextlib.suppress(RendezvousError):
        await ctx.rendezvous.charge_restart(0)


async def claim_round_for_membership(ctx: Context) -> None:
    """Record, as the round's charge, that it ends for a membership change: no budget pays for it (best effort).

    Called before this node stops its workers for a node waiting to join. A peer's worker that then fails on the
    broken collective (its agent may see that exit before its own watch sees the waiting node) ends the same round:
    that peer's charge finds this one and is not charged either, as the membership change is the cause.
    """
    with contextlib.suppress(RendezvousError):
        await ctx.rendezvous.charge_restart(ctx.spec.restart.max_restarts, charged=False)


def stopping(ctx: Context) -> bool:
    """A stop (graceful or not) arrived: nothing restarts once the job is stopping."""
    return ctx.stop is not None


def class_spent(ctx: Context) -> bool:
    """The failure's class has no restart left here (`oom: 0` and `infra: 0` by default).

    Decided before any etcd call: an infrastructure failure is not retried even when etcd is gone.
    """
    limit = budget_of(ctx).max
    return limit is not None and used_here(ctx) >= limit


def crash_loop(ctx: Context) -> bool:
    """The same exception (type, message, innermost frame) on restart.crash_loop consecutive attempts."""
    return bool(looping(ctx))


def non_retryable_exit(ctx: Context) -> bool:
    """The failed worker's exit code is one the spec says never to retry."""
    code = current(ctx).exit_code
    return code is not None and code in ctx.spec.restart.non_retryable_exit_codes


def restart_charged(ctx: Context) -> bool:
    """A restart was charged to the class's budget and (unless the class is uncharged) the job's (`gather`)."""
    charge = ctx.run.charge
    return charge is not None and charge.used is not None


GUARDS: dict[Guard, GuardCheck] = {
    Guard.stopping: stopping,
    Guard.class_spent: class_spent,
    Guard.crash_loop: crash_loop,
    Guard.non_retryable_exit: non_retryable_exit,
    Guard.restart_charged: restart_charged,
}


PEER_CHARGE_WAIT_S = 2.0  # how long a node that saw a peer report FAILED lets that peer charge it first
BEFORE_CHARGE = tuple(e.when for e in TRANSITIONS if e.fired_by is Trigger.decide and e.when is not None)
BEFORE_CHARGE = BEFORE_CHARGE[: BEFORE_CHARGE.index(Guard.restart_charged)]  # in table order


async def gather(ctx: Context) -> None:
    """What the last guard needs before FAILED fires `decide`: the restart charge, when no earlier guard decides.

    Charging is the decision's one input that acts (a transaction on the budgets every node shares): it is made
    here, by the FAILED step, so that every guard only reads. False once either budget is spent, or when the
    budgets cannot be reached (etcd down past its connect timeout): no node restarts on a budget it cannot count.
    """
    ctx.run.charge = None
    if any(GUARDS[guard](ctx) for guard in BEFORE_CHARGE):
        return
    budget, cls = budget_of(ctx), current(ctx).failure_class
    defer = {"defer": PEER_CHARGE_WAIT_S} if peer_reported(current(ctx)) else {}  # its own node decides
    try:
        charged = await ctx.rendezvous.charge_restart(
            ctx.spec.restart.max_restarts, cls, budget.max, charged=budget.charged, **defer
        )
    except RendezvousError as e:
        ctx.run.charge = Charge(None, e.message)
        return
    ctx.run.charge = Charge(charged)
    if charged.count is not None:
        ctx.run.restarts = charged.count


def counted_as(ctx: Context, failure: Failure) -> tuple[FailureClass | None, bool]:
    """The class `failure`'s restart counts under here, and whether max_restarts paid for it (decided only here).

    The class is None for none (a membership change's round); the summary and the retry's words read this.
    As the round's charge says: the node that charged the round first decided it for every node, so a peer that saw
    another node's exception as a lost node counts it as that exception, charged, as the failing node does; a node
    really lost is charged as `node_lost` by whoever saw it first. Without a charge (none was made), or when the
    charge does not say (an older runner's), the class's budget in the spec decides.
    """
    charge = ctx.run.charge
    verdict = charge.round if charge is not None else None
    if verdict is not None and verdict.charged is not None:
        return verdict.failure_class, verdict.charged
    cls = (verdict.failure_class if verdict is not None else None) or failure.failure_class
    return cls, ctx.spec.restart.budgets.of(cls).charged


def as_counted(ctx: Context) -> Failure:
    """The current failure in the class its round counts under (`counted_as`), when it is a peer's.

    A peer's failure is what this node saw of another node (`node_lost` until then): the round's charge says what it
    was. Unchanged when it is this node's own, the round has no class, or the class is the same.
    """
    failure = current(ctx)
    cls, _ = counted_as(ctx, failure)
    if failure.kind is not FailureKind.PEER or cls is None or cls is failure.failure_class:
        return failure
    verdict = ctx.run.charge.round if ctx.run.charge is not None else None
    by = f"node {verdict.by}" if verdict is not None and verdict.by else "another node"
    return replace(failure, classified=cls, evidence=f"as {by} charged this round")


def retried(ctx: Context, edge: Edge) -> Step:
    """The retry's reason: which restart this is, of which budget."""
    limit, budget = ctx.spec.restart.max_restarts, budget_of(ctx)
    own = f"; {current(ctx).failure_class} {used_here(ctx) + 1} of {budget.max}" if budget.max is not None else ""
    cls, charged = counted_as(ctx, current(ctx))
    if charged:
        return Step(edge.trigger, f"restart {ctx.run.restarts} of {limit}{own}")
    used, after = ctx.run.restarts, cls or "a membership change"
    return Step(edge.trigger, f"restart after {after}, not charged to max_restarts ({used} of {limit} used{own})")


Why = tuple[str, int]  # a give-up's reason and exit code


def why_stopping(_ctx: Context) -> Why:
    """A stop arrived: the job is stopping, nothing restarts."""
    return "stopping: no restart", EXIT_WORKERS_FAILED


def why_class_spent(ctx: Context) -> Why:
    """The class's own budget: an infrastructure failure keeps its own reason (and exit code 3)."""
    failure, cls = current(ctx), current(ctx).failure_class
    if cls is FailureClass.INFRA:
        return f"not retried: {failure.reason}", EXIT_INFRA
    reason = f"not retried: {cls} failures have no restart left (restart.budgets.{cls}: {budget_of(ctx).max})"
    return reason, EXIT_WORKERS_FAILED


def why_crash_loop(ctx: Context) -> Why:
    """The exception that repeats, as the last attempt raised it."""
    failure = current(ctx)
    parts = traceback_parts(failure.traceback or failure.stderr_tail)
    exc, frame = parts if parts is not None else (failure.error, "")
    where = f" (in {frame})" if frame else ""
    n = len(looping(ctx))
    return f"crash loop: the same exception on {n} consecutive attempts: {exc}{where}", EXIT_WORKERS_FAILED


def why_non_retryable(ctx: Context) -> Why:
    """The exit code the spec lists."""
    return f"exit code {current(ctx).exit_code} is non-retryable", EXIT_WORKERS_FAILED


def why_spent(ctx: Context) -> Why:
    """restart_charged refused: the budgets unreachable, the job's spent, the class's (job-wide), or a peer's no."""
    if ctx.run.charge is not None and ctx.run.charge.error:
        return f"not retried: the restart budget is unreachable ({ctx.run.charge.error})", EXIT_INFRA
    limit, budget, cls = ctx.spec.restart.max_restarts, budget_of(ctx), current(ctx).failure_class
    code = EXIT_INFRA if cls is FailureClass.INFRA else EXIT_WORKERS_FAILED
    if budget.charged and ctx.run.restarts >= limit:
        return f"restart budget spent ({limit} of {limit} used)", code
    if budget.max is not None:
        return f"restart budget spent (max_restarts {limit}, or {cls}'s {budget.max} job-wide)", code
    return "not retried: another node stopped this round's restart (its report says why)", code


WHY: dict[Guard, Callable[[Context], Why]] = {
    Guard.stopping: why_stopping,
    Guard.class_spent: why_class_spent,
    Guard.crash_loop: why_crash_loop,
    Guard.non_retryable_exit: why_non_retryable,
}


async def settle(ctx: Context, edge: Edge) -> Step:
    """Act on the policy edge `edge`, taken from FAILED, and give its reason, outcome and exit code.

    A give-up for a spent class (but infrastructure) or a crash loop tells the other nodes through the round's
    charge, so they give up too rather than wait for this one in the next rendezvous.
    """
    if edge.when is Guard.crash_loop or (edge.when is Guard.class_spent
                                         and current(ctx).failure_class is not FailureClass.INFRA):
        await refuse_round(ctx)
    if edge.trigger is Trigger.retry:
        return retried(ctx, edge)
    reason, exit_code = WHY[edge.when](ctx) if edge.when is not None else why_spent(ctx)
    return Step(edge.trigger, reason, Outcome.FAILED, exit_code)
