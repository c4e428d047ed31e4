"""The agent's state machine (a replica group's, or a job of one group).

States, triggers, the transition table (data, with the restart policy as guarded edges) and the driver loop. The
kernel (runner/core/table_machine.py) executes the table; each state's handler (runner/states/) returns a Step.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from runner.core import table_machine
from runner.core.group_state import GroupState

if TYPE_CHECKING:
    from transitions.extensions.asyncio import AsyncMachine

    from runner.core.context import Context


class Trigger(enum.Enum):
    """The name of an edge (what transitions.jsonl calls `trigger`)."""

    initialized = "initialized"
    fatal = "fatal"
    rendezvous_complete = "rendezvous_complete"
    rendezvous_timeout = "rendezvous_timeout"
    job_closed = "job_closed"
    workers_succeeded = "workers_succeeded"
    worker_failed = "worker_failed"
    timer_expired = "timer_expired"
    peer_lost = "peer_lost"
    deadline_reached = "deadline_reached"
    guard_lost = "guard_lost"
    fenced = "fenced"
    membership_changed = "membership_changed"
    decide = "decide"  # fired by FAILED: the restart policy's guarded edges below pick retry / give_up / non_retryable
    retry = "retry"
    give_up = "give_up"
    non_retryable = "non_retryable"
    restarted = "restarted"
    worker_replaced = "worker_replaced"
    stop_requested = "stop_requested"


class Guard(enum.Enum):
    """A condition on an edge of the restart policy (evaluated by runner/core/restart_policy.py, in table order)."""

    stopping = "a stop was requested"
    class_spent = "the failure's class has no restart left (restart.budgets: oom 0, infra 0 by default)"
    crash_loop = "the same exception on restart.crash_loop consecutive attempts"
    non_retryable_exit = "the exit code is in restart.non_retryable_exit_codes"
    restart_charged = "a restart could be charged to the class's and the job's budgets"


Edge = table_machine.Edge[GroupState, Trigger, Guard]
Step = table_machine.Step[Trigger]
Model = table_machine.Model[GroupState, Trigger, Guard]


S, T, G = GroupState, Trigger, Guard
LIVE = tuple(s for s in GroupState if s is not S.SHUTDOWN)


def decided(trigger: Trigger, dest: GroupState, when: Guard | None = None) -> Edge:
    """An edge out of FAILED, taken by the policy's `decide` when `when` holds (None: always, as a last resort)."""
    return Edge(trigger, (S.FAILED,), dest, when, fired_by=T.decide)


TRANSITIONS: tuple[Edge, ...] = (
    Edge(T.initialized, (S.INIT,), S.RENDEZVOUS),
    Edge(T.fatal, (S.INIT, S.RENDEZVOUS, S.RESTARTING), S.SHUTDOWN),
    Edge(T.rendezvous_complete, (S.RENDEZVOUS,), S.RUNNING),
    Edge(T.rendezvous_timeout, (S.RENDEZVOUS,), S.FAILED),
    Edge(T.job_closed, (S.RENDEZVOUS,), S.SHUTDOWN),
    Edge(T.workers_succeeded, (S.RUNNING,), S.SHUTDOWN),
    Edge(T.worker_failed, (S.RUNNING,), S.FAILED),
    Edge(T.timer_expired, (S.RUNNING,), S.FAILED),
    Edge(T.peer_lost, (S.RUNNING,), S.FAILED),
    Edge(T.deadline_reached, (S.RUNNING,), S.SHUTDOWN),
    Edge(T.guard_lost, (S.RUNNING,), S.SHUTDOWN),
    Edge(T.fenced, (S.RUNNING,), S.SHUTDOWN),
    Edge(T.membership_changed, (S.RUNNING,), S.RESTARTING),
    # The restart policy: FAILED fires `decide`; the first edge whose guard holds is taken.
    decided(T.give_up, S.SHUTDOWN, G.stopping),
    decided(T.give_up, S.SHUTDOWN, G.class_spent),
    decided(T.give_up, S.SHUTDOWN, G.crash_loop),
    decided(T.non_retryable, S.SHUTDOWN, G.non_retryable_exit),
    decided(T.retry, S.RESTARTING, G.restart_charged),
    decided(T.give_up, S.SHUTDOWN),  # a budget is spent (job-wide: max_restarts, or the class's)
    Edge(T.restarted, (S.RESTARTING,), S.RENDEZVOUS),
    Edge(T.worker_replaced, (S.RESTARTING,), S.RUNNING),
    Edge(T.stop_requested, LIVE, S.SHUTDOWN),
)

Handler = Callable[["Context"], Awaitable[Step | None]]
GuardCheck = Callable[["Context"], bool]  # reads only: FAILED gathers what acts (restart_policy.gather)
OnTransition = Callable[[GroupState, GroupState, Edge, Step], Awaitable[None]]


def build_machine(guards: Mapping[Guard, GuardCheck]) -> tuple[Model, AsyncMachine]:
    """The group machine from TRANSITIONS; a guarded edge asks `guards[edge.when](ctx)` in table order."""
    return table_machine.build(GroupState, GroupState.INIT, TRANSITIONS, guards)


async def drive(
    model: Model,
    handlers: Mapping[GroupState, Handler],
    ctx: Context,
    on_transition: OnTransition,
    settle: Callable[[Context, Edge], Awaitable[Step]],
) -> None:
    """Run each state's handler and fire the Step it returns until SHUTDOWN, then run SHUTDOWN's handler.

    A Step fired through `decide` is completed by `settle(ctx, edge taken)` (the policy acts, and gives the reason
    and outcome).
    `on_transition(src, dst, edge, step)` runs after every state change.
    """
    while model.state is not S.SHUTDOWN:
        src = model.state
        step = await handlers[src](ctx)
        if step is None:
            continue  # the handler wants to run again (e.g. it only recorded an event)
        took = await model.trigger(step.trigger.value, facts=ctx)
        edge = model.taken
        assert took, f"{step.trigger.value} took no edge from {src.value}"
        assert edge is not None
        if edge.fired_by is not None:
            step = await settle(ctx, edge)
        await on_transition(src, model.state, edge, step)
    await handlers[S.SHUTDOWN](ctx)


def edges() -> list[tuple[GroupState, Trigger, GroupState, Guard | None]]:
    """Every (source, trigger, destination, guard) of the table, one per source state."""
    return table_machine.rows(TRANSITIONS)


def mermaid() -> str:
    """The machine as a Mermaid state diagram (`runner graph`)."""
    return table_machine.mermaid(TRANSITIONS, S.INIT, S.SHUTDOWN,
                                 (S.RUNNING, "with replica_groups, every group runs this machine on its own"))
