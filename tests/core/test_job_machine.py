"""The job machine of replica groups (runner/core/job_machine.py): a hand-written list of its edges, the order of
its review's guards, each guard on hand-made facts, the job's outcome, reachability and the Mermaid graph."""

from __future__ import annotations

import asyncio

import pytest

from runner.core.group_state import GroupState
from runner.core.job_machine import (
    JOB_TRANSITIONS,
    JobGuard,
    JobPhase,
    JobTrigger,
    build_job_machine,
    job_edges,
    job_mermaid,
)
from runner.core.job_policy import GUARDS, GroupView, JobFacts, ended, minimum_reason
from runner.events import StopRequested
from runner.outcomes import Outcome

P, T, G, S = JobPhase, JobTrigger, JobGuard, GroupState

# Written by hand from the design (docs/architecture.md), NOT derived from JOB_TRANSITIONS.
EXPECTED = {
    (P.STARTING, T.started, P.TRAINING, None),
    (P.STARTING, T.start_failed, P.ENDED, None),
    (P.STARTING, T.stop_requested, P.ENDED, None),
    (P.TRAINING, T.groups_ended, P.ENDED, G.every_group_ended),
    (P.DEGRADED, T.groups_ended, P.ENDED, G.every_group_ended),
    (P.STOPPING, T.groups_ended, P.ENDED, G.every_group_ended),
    (P.TRAINING, T.stop_requested, P.STOPPING, G.stop_requested),
    (P.DEGRADED, T.stop_requested, P.STOPPING, G.stop_requested),
    (P.TRAINING, T.lighthouse_lost, P.STOPPING, G.lighthouse_gone),
    (P.DEGRADED, T.lighthouse_lost, P.STOPPING, G.lighthouse_gone),
    (P.STOPPING, T.lighthouse_lost, P.STOPPING, G.lighthouse_gone),  # after a graceful stop: stop them for good
    (P.TRAINING, T.minimum_lost, P.STOPPING, G.minimum_lost),
    (P.DEGRADED, T.minimum_lost, P.STOPPING, G.minimum_lost),
    (P.TRAINING, T.group_down, P.DEGRADED, G.group_down),
    (P.DEGRADED, T.recovered, P.TRAINING, G.all_up),
}
# The review's order: every group ended beats everything (the job is over), a stop beats the job's own reasons,
# the lighthouse beats the minimum, and the job stops before it calls itself degraded.
REVIEW_ORDER = [G.every_group_ended, G.stop_requested, G.lighthouse_gone, G.minimum_lost, G.group_down, G.all_up]


def group(index: int = 0, state: GroupState = S.RUNNING, *, attempt: int = 0, outcome: Outcome | None = None,
          exit_code: int = 0, ended: bool = False) -> GroupView:
    return GroupView(index, state, attempt, outcome, exit_code, ended)


DONE = {"state": S.SHUTDOWN, "outcome": Outcome.SUCCEEDED, "ended": True}
SPENT = {"state": S.SHUTDOWN, "outcome": Outcome.FAILED, "exit_code": 1, "ended": True}
STOPPED = {"state": S.SHUTDOWN, "outcome": Outcome.STOPPED, "exit_code": 143, "ended": True}


def facts(*groups: GroupView, min_active: int = 1, **kw: object) -> JobFacts:
    return JobFacts(tuple(groups), min_active, **kw)  # type: ignore[arg-type]


def test_the_table_is_exactly_the_designed_edges():
    assert set(job_edges()) == EXPECTED
    assert len(job_edges()) == len(EXPECTED)


def test_review_guards_are_tried_in_the_designed_order():
    assert [e.when for e in JOB_TRANSITIONS if e.fired_by is T.review] == REVIEW_ORDER


def review(phase: JobPhase, f: JobFacts) -> tuple[bool, JobPhase, JobTrigger | None]:
    """Fire `review` from `phase` on `f`: whether an edge was taken, where the job is, and which edge."""
    model, machine = build_job_machine(GUARDS)
    machine.set_state(phase)

    async def go() -> bool:
        return bool(await model.trigger(T.review.value, facts=f))

    took = asyncio.run(go())
    return took, model.state, model.taken.trigger if took and model.taken is not None else None


# One case per review edge, and the cases where no edge holds (the job stays).
@pytest.mark.parametrize(("phase", "f", "dst", "trigger"), [
    (P.TRAINING, facts(group(0, **DONE), group(1, **DONE)), P.ENDED, T.groups_ended),
    (P.DEGRADED, facts(group(0, **DONE), group(1, **SPENT)), P.ENDED, T.groups_ended),
    (P.STOPPING, facts(group(0, **STOPPED), group(1, **STOPPED)), P.ENDED, T.groups_ended),
    (P.TRAINING, facts(group(0), stop=StopRequested(15, graceful=False)), P.STOPPING, T.stop_requested),
    (P.DEGRADED, facts(group(0), group(1, S.FAILED, attempt=1), stop=StopRequested(12, graceful=True)),
     P.STOPPING, T.stop_requested),
    (P.TRAINING, facts(group(0), lighthouse_gone="restarted 5 times"), P.STOPPING, T.lighthouse_lost),
    (P.DEGRADED, facts(group(0), group(1, S.RESTARTING), lighthouse_gone="x"), P.STOPPING, T.lighthouse_lost),
    (P.STOPPING, facts(group(0), stop=StopRequested(12, graceful=True), lighthouse_gone="x"),
     P.STOPPING, T.lighthouse_lost),
    (P.DEGRADED, facts(group(0), group(1, **SPENT), min_active=2), P.STOPPING, T.minimum_lost),
    (P.TRAINING, facts(group(0), group(1, **SPENT), min_active=2), P.STOPPING, T.minimum_lost),
    (P.TRAINING, facts(group(0), group(1, S.FAILED, attempt=0)), P.DEGRADED, T.group_down),
    (P.TRAINING, facts(group(0), group(1, S.RENDEZVOUS, attempt=1)), P.DEGRADED, T.group_down),
    (P.TRAINING, facts(group(0), group(1, **SPENT)), P.DEGRADED, T.group_down),
    (P.DEGRADED, facts(group(0), group(1, attempt=1)), P.TRAINING, T.recovered),
    (P.DEGRADED, facts(group(0), group(1, **DONE)), P.TRAINING, T.recovered),
], ids=["all-done", "done-and-spent", "stopped", "stop", "graceful-stop", "lighthouse", "lighthouse-degraded",
        "lighthouse-after-graceful", "minimum", "minimum-at-once", "failed", "rejoining", "left", "back",
        "back-done"])
def test_review_edges(phase, f, dst, trigger):
    took, state, taken = review(phase, f)
    assert took
    assert (state, taken) == (dst, trigger)


@pytest.mark.parametrize(("phase", "f"), [
    (P.TRAINING, facts(group(0), group(1, S.RENDEZVOUS, attempt=0))),  # still starting: up
    (P.TRAINING, facts(group(0, **DONE), group(1))),  # one finished, one trains on
    (P.DEGRADED, facts(group(0), group(1, S.FAILED, attempt=2))),  # still down
    (P.DEGRADED, facts(group(0), group(1, **SPENT))),  # left for good, one trains on with min_active 1
    (P.STOPPING, facts(group(0, S.SHUTDOWN), group(1, **STOPPED), stop=StopRequested(15, graceful=False))),
    (P.STOPPING, facts(group(0), lighthouse_gone="x", groups_stopping=True)),  # already told
    (P.STOPPING, facts(group(0), group(1, **SPENT), min_active=2)),  # the minimum is not reviewed once stopping
], ids=["starting", "one-done", "still-down", "left-min-1", "not-all-ended", "lighthouse-heeded", "no-min-in-stop"])
def test_review_takes_no_edge_when_no_guard_holds(phase, f):
    took, state, _ = review(phase, f)
    assert not took
    assert state is phase


def test_guards_only_read():
    """Every guard on every kind of facts returns a bool and changes nothing (the facts are frozen)."""
    samples = [facts(), facts(group(0, **DONE)), facts(group(0), group(1, **SPENT), min_active=2,
                                                      stop=StopRequested(2, graceful=False), lighthouse_gone="x")]
    for f in samples:
        before = repr(f)
        for guard in GUARDS.values():
            assert isinstance(guard(f), bool)
        assert repr(f) == before


@pytest.mark.parametrize("src", list(JobPhase), ids=lambda s: s.value)
def test_triggers_outside_the_table_are_refused(src):
    """A trigger with no edge from the current phase raises and leaves the phase alone."""
    allowed = {e.fired_by or e.trigger for e in JOB_TRANSITIONS if src in e.sources}
    model, machine = build_job_machine(GUARDS)
    machine.set_state(src)
    for trigger in set(JobTrigger) - allowed:
        with pytest.raises(Exception):  # noqa: B017 - transitions raises MachineError
            asyncio.run(model.trigger(trigger.value, facts=facts()))
        assert model.state is src


@pytest.mark.parametrize(("f", "minimum", "outcome", "code", "reason"), [
    (facts(group(0, **DONE), group(1, **DONE)), "", Outcome.SUCCEEDED, 0, "2 of 2 group(s) finished"),
    (facts(group(0, **DONE), group(1, **SPENT)), "", Outcome.SUCCEEDED, 0, "1 left after their budget was spent"),
    (facts(group(0, **STOPPED), group(1, **STOPPED), stop=StopRequested(15, graceful=False)), "",
     Outcome.STOPPED, 143, "stop requested (signal 15)"),
    (facts(group(0, **DONE), group(1, **DONE), stop=StopRequested(12, graceful=True)), "",
     Outcome.SUCCEEDED, 0, "2 of 2"),
    (facts(group(0, **STOPPED), group(1, **DONE), lighthouse_gone="gone"), "", Outcome.ERROR, 3, "gone"),
    (facts(group(0, **DONE), group(1, **DONE), lighthouse_gone="gone"), "", Outcome.SUCCEEDED, 0, "2 of 2"),
    (facts(group(0, **STOPPED), group(1, **SPENT), min_active=2), "only 1", Outcome.FAILED, 1, "only 1"),
    (facts(group(0, **SPENT), group(1, state=S.SHUTDOWN, outcome=Outcome.ERROR, exit_code=3, ended=True)), "",
     Outcome.ERROR, 3, "0 group(s) finished, fewer than min_active 1"),
], ids=["succeeded", "one-left", "stopped", "graceful", "lighthouse", "lighthouse-after-all-done", "minimum",
        "infra"])
def test_the_jobs_outcome_at_its_end(f, minimum, outcome, code, reason):
    step = ended(f, minimum)
    assert (step.trigger, step.outcome, step.exit_code) == (T.groups_ended, outcome, code)
    assert reason in step.reason


def test_the_minimums_reason_names_the_groups_that_left():
    f = facts(group(0), group(1, **SPENT), group(2, **SPENT), min_active=2)
    assert minimum_reason(f) == ("only 1 group(s) can go on, fewer than min_active 2 (group(s) 1, 2 left with "
                                 "their budget spent)")


def test_mermaid_lists_every_edge():
    text = job_mermaid()
    assert text.startswith("stateDiagram-v2")
    for src, trigger, dst, when in job_edges():
        label = trigger.value + (f" [{when.name}]" if when else "")
        assert f"{src.value} --> {dst.value}: {label}" in text
