"""The job of replica groups: what its guards read (`JobFacts`), the guards, and the job's outcome at its end.

Guards only read a frozen snapshot; the supervisor takes one before every `review` (runner/agent/replicas.py).
The outcome rules, in order: the lighthouse gone for good (unless every group had finished) is an infrastructure
error (exit 3); a stop (not graceful) is a stop (128+N); at least min_active groups finished is a success; else the
job failed (exit 1, or 3 when a group ended on an infrastructure error).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from runner.core.group_state import GroupState
from runner.core.job_machine import JobGuard, JobStep, JobTrigger
from runner.errors import EXIT_INFRA, EXIT_OK, EXIT_STOPPED_BASE, EXIT_WORKERS_FAILED
from runner.events import StopRequested
from runner.outcomes import Outcome


@dataclass(frozen=True)
class GroupView:
    """One group as the job's guards see it."""

    index: int
    state: GroupState
    attempt: int
    outcome: Outcome | None
    exit_code: int
    ended: bool  # its run is over (SHUTDOWN's work done: its outcome is final)

    @property
    def up(self) -> bool:
        """Running, still on its first start, or finished: nothing of it is being recovered or lost."""
        if self.state is GroupState.RUNNING:
            return True
        if self.state in (GroupState.INIT, GroupState.RENDEZVOUS) and self.attempt == 0:
            return True
        return self.state is GroupState.SHUTDOWN and self.outcome is Outcome.SUCCEEDED

    @property
    def left(self) -> bool:
        """It ended without finishing (its budget spent, or stopped)."""
        return self.ended and self.outcome is not Outcome.SUCCEEDED


@dataclass(frozen=True)
class JobFacts:
    """What the job's guards read: the groups, the minimum, and what came from outside."""

    groups: tuple[GroupView, ...]
    min_active: int
    stop: StopRequested | None = None  # the first stop that ends the work, else the first (graceful) one
    lighthouse_gone: str = ""  # why the hosted lighthouse could not be restarted ("" while it serves)
    groups_stopping: bool = False  # a stop that ends the groups' work (not graceful) reached them

    @property
    def live(self) -> list[GroupView]:
        """The groups not in SHUTDOWN (those that can still take part in a step)."""
        return [g for g in self.groups if g.state is not GroupState.SHUTDOWN]

    @property
    def finished(self) -> list[GroupView]:
        """The groups that succeeded."""
        return [g for g in self.groups if g.outcome is Outcome.SUCCEEDED]


def every_group_ended(facts: JobFacts) -> bool:
    """Every group's run is over."""
    return bool(facts.groups) and all(g.ended for g in facts.groups)


def stop_requested(facts: JobFacts) -> bool:
    """A stop (graceful or not) reached the job."""
    return facts.stop is not None


def lighthouse_gone(facts: JobFacts) -> bool:
    """The hosted lighthouse is gone for good, and the groups are not being stopped already."""
    return bool(facts.lighthouse_gone) and not facts.groups_stopping


def minimum_lost(facts: JobFacts) -> bool:
    """Fewer than min_active groups can go on, and one left: none of the rest could take a step."""
    live = facts.live
    return bool(live) and any(g.left for g in facts.groups) and len(live) < facts.min_active


def group_down(facts: JobFacts) -> bool:
    """A group is being recovered, or left."""
    return any(not g.up for g in facts.groups)


def all_up(facts: JobFacts) -> bool:
    """Every group is up."""
    return not group_down(facts)


JobGuardCheck = Callable[["JobFacts"], bool]

GUARDS: Mapping[JobGuard, JobGuardCheck] = {
    JobGuard.every_group_ended: every_group_ended,
    JobGuard.stop_requested: stop_requested,
    JobGuard.lighthouse_gone: lighthouse_gone,
    JobGuard.minimum_lost: minimum_lost,
    JobGuard.group_down: group_down,
    JobGuard.all_up: all_up,
}


def minimum_reason(facts: JobFacts) -> str:
    """Why the job stops the groups left when the minimum is lost."""
    gone = ", ".join(str(g.index) for g in facts.groups if g.left)
    return (f"only {len(facts.live)} group(s) can go on, fewer than min_active {facts.min_active} "
            f"(group(s) {gone} left with their budget spent)")


def ended(facts: JobFacts, minimum: str = "") -> JobStep:
    """The job's outcome once every group ended. `minimum`: the reason the minimum was lost, if it was."""
    done, total = len(facts.finished), len(facts.groups)
    stop = facts.stop
    if facts.lighthouse_gone and done < total:
        return JobStep(JobTrigger.groups_ended, facts.lighthouse_gone, Outcome.ERROR, EXIT_INFRA)
    if stop is not None and not stop.graceful:
        return JobStep(JobTrigger.groups_ended, f"stop requested (signal {stop.signum})", Outcome.STOPPED,
                       EXIT_STOPPED_BASE + (stop.signum or signal.SIGTERM))
    if done >= facts.min_active:
        left = total - done
        spent = f"; {left} left after their budget was spent" if left else ""
        reason = f"{done} of {total} group(s) finished{spent}"
        return JobStep(JobTrigger.groups_ended, reason, Outcome.SUCCEEDED, EXIT_OK)
    infra = any(g.exit_code == EXIT_INFRA for g in facts.groups if g.outcome in (Outcome.FAILED, Outcome.ERROR))
    reason = minimum or f"{done} group(s) finished, fewer than min_active {facts.min_active}"
    return JobStep(JobTrigger.groups_ended, reason, Outcome.ERROR if infra else Outcome.FAILED,
                   EXIT_INFRA if infra else EXIT_WORKERS_FAILED)
