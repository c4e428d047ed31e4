"""The machine of a job of replica groups (docs/replica_groups.md): the job's own states above the groups' machines.

Each group runs the agent's machine (runner/core/machine.py) on its own. The job above them has a table of its own,
on the same kernel (runner/core/table_machine.py): states, triggers, guarded edges (data). The guards are pure
functions of a `JobFacts` snapshot (runner/core/job_policy.py); what happens after an edge (stopping the groups with the
edge's cause, the job's outcome) runs after the guard decided, in the supervisor (runner/agent/replicas.py).

STARTING: the node takes its place (its groups, the lighthouse). TRAINING: every group is up (running, still
starting, or done). DEGRADED: a group is down (recovering, or left with its budget spent) but the job goes on.
STOPPING: the groups are being stopped, or finish after a graceful stop. ENDED (terminal): every group ended; the
edge that ended it carries the job's outcome.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

from runner.core import table_machine

if TYPE_CHECKING:
    from transitions.extensions.asyncio import AsyncMachine

F = TypeVar("F")  # the facts the guards read: runner/core/job_policy.py's JobFacts (which imports this table)


class JobPhase(enum.Enum):
    """Where the job of replica groups is on this node. ENDED is terminal."""

    STARTING = "STARTING"
    TRAINING = "TRAINING"
    DEGRADED = "DEGRADED"
    STOPPING = "STOPPING"
    ENDED = "ENDED"


class JobTrigger(enum.Enum):
    """The name of an edge of the job's table (what its `job_transition` events call `trigger`)."""

    started = "started"
    start_failed = "start_failed"
    stop_requested = "stop_requested"
    review = "review"  # fired after anything changed: the guarded edges below, tried in order, pick the edge
    groups_ended = "groups_ended"
    lighthouse_lost = "lighthouse_lost"
    minimum_lost = "minimum_lost"
    group_down = "group_down"
    recovered = "recovered"


class JobGuard(enum.Enum):
    """A condition on an edge of the job's table (runner/core/job_policy.py evaluates it)."""

    every_group_ended = "every group's run ended"
    stop_requested = "a stop was requested (a signal, or `runner stop`)"
    lighthouse_gone = "the hosted lighthouse is gone for good and the groups are not stopping yet"
    minimum_lost = "fewer than min_active groups can go on, and one left with its budget spent"
    group_down = "a group is down (recovering, or left)"
    all_up = "every group is up again"


JobEdge = table_machine.Edge[JobPhase, JobTrigger, JobGuard]
JobStep = table_machine.Step[JobTrigger]
JobModel = table_machine.Model[JobPhase, JobTrigger, JobGuard]


P, T, G = JobPhase, JobTrigger, JobGuard
ON = (P.TRAINING, P.DEGRADED)  # the job trains (with every group, or fewer)


def reviewed(trigger: JobTrigger, sources: tuple[JobPhase, ...], dest: JobPhase, when: JobGuard) -> JobEdge:
    """An edge `review` takes when `when` holds (tried in table order)."""
    return JobEdge(trigger, sources, dest, when, fired_by=T.review)


JOB_TRANSITIONS: tuple[JobEdge, ...] = (
    JobEdge(T.started, (P.STARTING,), P.TRAINING),
    JobEdge(T.start_failed, (P.STARTING,), P.ENDED),
    JobEdge(T.stop_requested, (P.STARTING,), P.ENDED),
    # After every change (a group's transition or end, a stop, the lighthouse), `review`: the first edge that holds.
    reviewed(T.groups_ended, (*ON, P.STOPPING), P.ENDED, G.every_group_ended),
    reviewed(T.stop_requested, ON, P.STOPPING, G.stop_requested),
    reviewed(T.lighthouse_lost, (*ON, P.STOPPING), P.STOPPING, G.lighthouse_gone),
    reviewed(T.minimum_lost, ON, P.STOPPING, G.minimum_lost),
    reviewed(T.group_down, (P.TRAINING,), P.DEGRADED, G.group_down),
    reviewed(T.recovered, (P.DEGRADED,), P.TRAINING, G.all_up),
)

def build_job_machine(guards: Mapping[JobGuard, Callable[[F], bool]]) -> tuple[JobModel, AsyncMachine]:
    """The job's machine from JOB_TRANSITIONS; a guarded edge asks `guards[edge.when](facts)` in table order.

    A `review` with no guard holding takes no edge: the job stays where it is.
    """
    return table_machine.build(JobPhase, JobPhase.STARTING, JOB_TRANSITIONS, guards)


def job_edges() -> list[tuple[JobPhase, JobTrigger, JobPhase, JobGuard | None]]:
    """Every (source, trigger, destination, guard) of the job's table, one per source phase."""
    return table_machine.rows(JOB_TRANSITIONS)


def job_mermaid() -> str:
    """The job's machine as a Mermaid state diagram (`runner graph --job`)."""
    return table_machine.mermaid(JOB_TRANSITIONS, P.STARTING, P.ENDED,
                                 (P.TRAINING, "each replica group runs the agent's machine on its own"))
