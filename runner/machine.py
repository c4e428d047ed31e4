"""The agent's state machine: states, triggers, the transition table (data) and the driver loop."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from transitions.extensions.asyncio import AsyncMachine


class JobState(enum.Enum):
    """Where the agent is. SHUTDOWN is terminal."""

    INIT = "INIT"
    RENDEZVOUS = "RENDEZVOUS"
    RUNNING = "RUNNING"
    FAILED = "FAILED"
    RESTARTING = "RESTARTING"
    SHUTDOWN = "SHUTDOWN"


class Trigger(enum.Enum):
    """What a state handler returns: the name of the edge to take."""

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
    membership_changed = "membership_changed"
    retry = "retry"
    give_up = "give_up"
    non_retryable = "non_retryable"
    restarted = "restarted"
    worker_replaced = "worker_replaced"
    stop_requested = "stop_requested"


S, T = JobState, Trigger
# (trigger, source(s), destination). "*" = every state but SHUTDOWN.
TRANSITIONS: tuple[tuple[Trigger, tuple[JobState, ...] | str, JobState], ...] = (
    (T.initialized, (S.INIT,), S.RENDEZVOUS),
    (T.fatal, (S.INIT, S.RENDEZVOUS, S.RESTARTING), S.SHUTDOWN),
    (T.rendezvous_complete, (S.RENDEZVOUS,), S.RUNNING),
    (T.rendezvous_timeout, (S.RENDEZVOUS,), S.FAILED),
    (T.job_closed, (S.RENDEZVOUS,), S.SHUTDOWN),
    (T.workers_succeeded, (S.RUNNING,), S.SHUTDOWN),
    (T.worker_failed, (S.RUNNING,), S.FAILED),
    (T.timer_expired, (S.RUNNING,), S.FAILED),
    (T.peer_lost, (S.RUNNING,), S.FAILED),
    (T.deadline_reached, (S.RUNNING,), S.SHUTDOWN),
    (T.membership_changed, (S.RUNNING,), S.RESTARTING),
    (T.retry, (S.FAILED,), S.RESTARTING),
    (T.give_up, (S.FAILED,), S.SHUTDOWN),
    (T.non_retryable, (S.FAILED,), S.SHUTDOWN),
    (T.restarted, (S.RESTARTING,), S.RENDEZVOUS),
    (T.worker_replaced, (S.RESTARTING,), S.RUNNING),
    (T.stop_requested, "*", S.SHUTDOWN),
)

Handler = Callable[[Any], Awaitable[Trigger | None]]
OnTransition = Callable[[JobState, JobState, Trigger], None]


class Model:
    """The object `transitions` drives; it only carries the current state."""

    state: JobState


def build_machine(on_transition: OnTransition) -> tuple[Model, AsyncMachine]:
    """Build the machine from TRANSITIONS; `on_transition(src, dst, trigger)` runs after every state change."""
    model = Model()

    def after(event: Any) -> None:
        on_transition(JobState(event.transition.source), JobState(event.transition.dest), Trigger(event.event.name))

    machine = AsyncMachine(
        model=model,
        states=JobState,
        initial=JobState.INIT,
        auto_transitions=False,
        queued=True,
        send_event=True,
        after_state_change=after,
    )
    live = [s for s in JobState if s is not S.SHUTDOWN]
    for trigger, sources, dest in TRANSITIONS:
        machine.add_transition(trigger.value, live if sources == "*" else list(sources), dest)
    return model, machine


async def drive(
    model: Model,
    handlers: Mapping[JobState, Handler],
    ctx: Any,
    entered: Callable[[JobState], Awaitable[None]] | None = None,
) -> JobState:
    """Run each state's handler and fire the trigger it returns, until SHUTDOWN; then run SHUTDOWN's handler.

    `entered(state)` runs after every transition (the agent publishes its new state there).
    """
    while model.state is not S.SHUTDOWN:
        trigger = await handlers[model.state](ctx)
        if trigger is None:
            continue  # the handler wants to run again (e.g. it only recorded an event)
        await model.trigger(trigger.value)
        if entered is not None:
            await entered(model.state)
    await handlers[S.SHUTDOWN](ctx)
    return model.state


def mermaid() -> str:
    """The machine as a Mermaid state diagram (`runner graph`)."""
    lines = ["stateDiagram-v2", f"    [*] --> {S.INIT.value}"]
    for trigger, sources, dest in TRANSITIONS:
        srcs = [s for s in JobState if s is not S.SHUTDOWN] if sources == "*" else list(sources)
        lines += [f"    {src.value} --> {dest.value}: {trigger.value}" for src in srcs]
    lines.append(f"    {S.SHUTDOWN.value} --> [*]")
    return "\n".join(lines)
