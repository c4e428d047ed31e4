"""The kernel both machines share: a transition table as data, executed by `transitions`.

A table is a tuple of Edges over three enums of its own: states, triggers, guards. An edge takes the machine from
any of its sources to its destination when its trigger fires and its guard (if any) holds; guarded edges are tried
in table order. A guard is a pure function of the facts passed with the trigger (`facts=` keyword): the group
machine passes its Context, the job machine a frozen JobFacts snapshot. What an edge does runs outside, in whoever
fires it (a Step says why, and, when it settles the run, the outcome).

The two tables: runner/core/machine.py (a replica group's, or a job of one group: INIT ... SHUTDOWN) and
runner/core/job_machine.py (the job of replica groups above them: STARTING ... ENDED).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from transitions.extensions.asyncio import AsyncMachine

from runner.outcomes import Outcome

if TYPE_CHECKING:
    from transitions import EventData

S = TypeVar("S", bound=enum.Enum)  # the table's states
T = TypeVar("T", bound=enum.Enum)  # its triggers
G = TypeVar("G", bound=enum.Enum)  # its guards
F = TypeVar("F")  # the facts its guards read


@dataclass(frozen=True)
class Edge(Generic[S, T, G]):
    """One row of a table: `trigger` takes the machine from any of `sources` to `dest` (when `when` holds)."""

    trigger: T
    sources: tuple[S, ...]
    dest: S
    when: G | None = None
    fired_by: T | None = None  # the event that fires it, when not its own name (a policy's `decide`, `review`)


@dataclass(frozen=True)
class Step(Generic[T]):
    """What fires an edge: its trigger and why; when the step settles the run, its outcome, exit code and a fix."""

    trigger: T
    reason: str = ""
    outcome: Outcome | None = None
    exit_code: int | None = None
    fix: str = ""


class Model(Generic[S, T, G]):
    """The object `transitions` drives: the current state and the edge taken last."""

    state: S
    taken: Edge[S, T, G] | None = None
    trigger: Callable[..., Awaitable[bool]]  # added by `transitions`


def build(states: type[S], initial: S, table: Sequence[Edge[S, T, G]],
          guards: Mapping[G, Callable[[F], bool]]) -> tuple[Model[S, T, G], AsyncMachine]:
    """The machine of `table`; a guarded edge asks `guards[edge.when](facts)`, facts given as `trigger(facts=...)`.

    Not `queued`: nothing inside a transition fires a trigger (the driver fires one at a time), so `trigger()` says
    whether an edge was taken (a queue would return True before the edge ran).
    """
    model: Model[S, T, G] = Model()
    machine = AsyncMachine(model=model, states=states, initial=initial, auto_transitions=False, send_event=True)
    for edge in table:

        def took(_event: EventData, edge: Edge[S, T, G] = edge) -> None:
            model.taken = edge

        conditions = []
        if edge.when is not None:
            check = guards[edge.when]

            def holds(event: EventData, check: Callable[[F], bool] = check) -> bool:
                facts: F = event.kwargs["facts"]
                return check(facts)

            conditions.append(holds)
        machine.add_transition((edge.fired_by or edge.trigger).value, list(edge.sources), edge.dest,
                               conditions=conditions, before=took)
    return model, machine


def rows(table: Sequence[Edge[S, T, G]]) -> list[tuple[S, T, S, G | None]]:
    """Every (source, trigger, destination, guard) of `table`, one per source state."""
    return [(src, e.trigger, e.dest, e.when) for e in table for src in e.sources]


def mermaid(table: Sequence[Edge[S, T, G]], initial: S, terminal: S, note: tuple[S, str]) -> str:
    """`table` as a Mermaid state diagram, with one note beside a state."""
    lines = ["stateDiagram-v2", f"    [*] --> {initial.value}"]
    for src, trigger, dest, when in rows(table):
        label = trigger.value + (f" [{when.name}]" if when is not None else "")
        lines.append(f"    {src.value} --> {dest.value}: {label}")
    lines.append(f"    {terminal.value} --> [*]")
    lines.append(f"    note right of {note[0].value}: {note[1]}")
    return "\n".join(lines)
