"""runner/core: the cases mutation testing found untested (bench/mutation.sh, docs/testing.md "Mutation score").

Each test names, in its docstring, what it pins: the exact words of a decision, the arguments of a budget charge, the
facts the driver hands on. A mutant that changed them passed every other unit test.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from test_job_machine import DONE, SPENT, STOPPED, facts, group
from test_machine import LOOP, TRACEBACK, Budget, decide, failed_ctx

from runner.config.spec import Budgets, ClassBudget
from runner.core import restart_policy, table_machine
from runner.core.job_machine import JobEdge, JobGuard, JobPhase, JobTrigger, job_mermaid, reviewed
from runner.core.job_policy import ended
from runner.core.machine import (
    TRANSITIONS,
    Edge,
    GroupState,
    Guard,
    Step,
    Trigger,
    build_machine,
    decided,
    drive,
    mermaid,
)
from runner.core.restart_policy import GUARDS, gather, settle
from runner.diagnosis.failure import Failure
from runner.errors import EXIT_INFRA, EXIT_WORKERS_FAILED, RendezvousError
from runner.events import StopRequested
from runner.outcomes import FailureClass, FailureKind, Outcome
from runner.rendezvous.base import RoundCharge

S, T, G = GroupState, Trigger, Guard


# -- the table helpers (called at import, so a mutant of them is only seen by calling them) ----------------------------


def test_decided_and_reviewed_build_the_policy_edges() -> None:
    """Kills job_machine reviewed__mutmut_*, machine decided__mutmut_*."""
    assert decided(T.retry, S.RESTARTING, G.restart_charged) == Edge(
        T.retry, (S.FAILED,), S.RESTARTING, G.restart_charged, fired_by=T.decide)
    assert decided(T.give_up, S.SHUTDOWN) == Edge(T.give_up, (S.FAILED,), S.SHUTDOWN, None, fired_by=T.decide)
    edge = reviewed(JobTrigger.recovered, (JobPhase.DEGRADED,), JobPhase.TRAINING, JobGuard.all_up)
    assert edge == JobEdge(JobTrigger.recovered, (JobPhase.DEGRADED,), JobPhase.TRAINING, JobGuard.all_up,
                           fired_by=JobTrigger.review)


def test_the_diagrams_end_with_their_note() -> None:
    """Kills machine mermaid__mutmut_9/10, job_machine job_mermaid__mutmut_9/10 (the note's words)."""
    assert mermaid().endswith("\n    note right of RUNNING: with replica_groups, every group runs this machine on its own")
    assert job_mermaid().endswith(
        "\n    note right of TRAINING: each replica group runs the agent's machine on its own")


def test_a_machine_has_only_the_tables_triggers() -> None:
    """Kills table_machine build__mutmut_11/13: transitions' automatic `to_<state>` triggers are off."""
    model, _ = build_machine(GUARDS)
    assert not hasattr(model, "to_SHUTDOWN")
    assert not hasattr(model, "to_RUNNING")


# -- the driver hands the context on ---------------------------------------------------------------------------


def test_the_driver_hands_the_context_to_handlers_guards_and_settle() -> None:
    """Kills machine drive__mutmut_4/9/11/15-19/28: every handler, the guards and `settle` get the context, and
    `on_transition` gets the settled step."""
    ctx = failed_ctx(budget=0)  # the budget spent: FAILED gives up through the last (unguarded) policy edge
    seen: list[tuple[GroupState, GroupState, Step]] = []
    script = {
        S.INIT: Step(T.initialized),
        S.RENDEZVOUS: Step(T.rendezvous_complete, "round 0"),
        S.RUNNING: Step(T.worker_failed, "rank 0 exited"),
    }
    handled: list[Any] = []

    def handler(state: GroupState) -> Any:
        async def run(c: Any) -> Step | None:
            handled.append(c)
            if state is S.FAILED:
                await gather(c)
                return Step(T.decide)
            return script.get(state)
        return run

    async def on_transition(src: GroupState, dst: GroupState, _edge: Edge, step: Step) -> None:
        seen.append((src, dst, step))

    async def settle_here(c: Any, edge: Edge) -> Step:
        assert c is ctx
        assert edge.fired_by is T.decide
        return await settle(c, edge)

    model, _ = build_machine(GUARDS)
    handlers = {s: handler(s) for s in GroupState}
    asyncio.run(drive(model, handlers, ctx, on_transition, settle_here))
    assert model.state is S.SHUTDOWN
    assert handled == [ctx] * 5  # INIT, RENDEZVOUS, RUNNING, FAILED, then SHUTDOWN once
    src, dst, step = seen[-1]
    assert (src, dst, step.trigger, step.outcome, step.exit_code) == (
        S.FAILED, S.SHUTDOWN, T.give_up, Outcome.FAILED, EXIT_WORKERS_FAILED)
    assert step.reason == "not retried: another node stopped this round's restart (its report says why)"


# -- the restart policy's inputs and words ---------------------------------------------------------------------


def failure(kind: str = "worker", attempt: int = 0, **kw: Any) -> Failure:
    return Failure(kind=FailureKind(kind), reason="rank 0 exited with code 1", attempt=attempt, exit_code=1, **kw)


def ctx_with(current: Failure, earlier: tuple[Failure, ...] = (), *, budgets: Budgets | None = None,
             restarts: int = 0, left: int = 5, max_restarts: int = 3, crash_loop: int = 3) -> SimpleNamespace:
    spec = SimpleNamespace(restart=SimpleNamespace(max_restarts=max_restarts, non_retryable_exit_codes=(),
                                                   budgets=budgets or Budgets(), crash_loop=crash_loop))
    run = SimpleNamespace(failure=current, failures=[*earlier, current], restarts=restarts, charge=None)
    return SimpleNamespace(run=run, spec=spec, stop=None, rendezvous=Recorder(left))


class Recorder(Budget):
    """Budget that also keeps every argument of each charge."""

    def __init__(self, left: int) -> None:
        super().__init__(left)
        self.args: list[tuple[Any, ...]] = []

    async def charge_restart(self, max_restarts: int, failure_class: FailureClass | None = None,
                             class_limit: int | None = None, *, charged: bool = True, **kw: Any) -> RoundCharge:
        self.args.append((max_restarts, failure_class, class_limit, charged, kw))
        return await super().charge_restart(max_restarts, failure_class, class_limit, charged=charged)


def test_used_here_counts_only_earlier_failures_of_the_same_class() -> None:
    """Kills restart_policy used_here__mutmut_1/4-7."""
    sig = failure(signal="SIGKILL")
    earlier = (failure(attempt=0), sig, failure(attempt=2), failure(attempt=3))
    assert restart_policy.used_here(ctx_with(failure(attempt=4), earlier)) == 3
    assert restart_policy.used_here(ctx_with(failure(attempt=4, signal="SIGKILL"), earlier)) == 1
    assert restart_policy.used_here(ctx_with(failure())) == 0


def test_gather_charges_with_the_class_its_limit_and_whether_it_is_charged() -> None:
    """Kills restart_policy gather__mutmut_1/8/10/11/16-18/20-23: the charge's arguments, a peer's report deferred."""
    budgets = Budgets(exception=ClassBudget(max=4, charged=True))
    ctx = ctx_with(failure(), budgets=budgets)
    ctx.run.charge = "stale"
    asyncio.run(gather(ctx))
    assert ctx.rendezvous.args == [(3, FailureClass.EXCEPTION, 4, True, {})]
    assert ctx.run.charge.used == 1
    assert ctx.run.restarts == 1

    peer = Failure(kind=FailureKind.PEER, reason="node b lost: reported FAILED", attempt=0)
    ctx = ctx_with(peer)
    asyncio.run(gather(ctx))
    assert ctx.rendezvous.args == [(3, FailureClass.NODE_LOST, None, False,
                                    {"defer": restart_policy.PEER_CHARGE_WAIT_S})]


def test_gather_leaves_no_charge_when_an_earlier_guard_decides() -> None:
    """Kills restart_policy gather__mutmut_1: the charge of an earlier attempt is cleared, to None."""
    ctx = ctx_with(failure(kind="rendezvous"))  # infra: class_spent decides, nothing is charged
    ctx.run.charge = "stale"
    asyncio.run(gather(ctx))
    assert ctx.run.charge is None
    assert ctx.rendezvous.args == []


def test_the_membership_claim_is_uncharged_and_swallows_a_rendezvous_error() -> None:
    """Kills restart_policy claim_round_for_membership__mutmut_1/2, refuse_round__mutmut_1."""
    ctx = ctx_with(failure())
    asyncio.run(restart_policy.claim_round_for_membership(ctx))
    assert ctx.rendezvous.args == [(3, None, None, False, {})]
    down = ctx_with(failure(), left=-1)  # charge_restart raises RendezvousError
    asyncio.run(restart_policy.claim_round_for_membership(down))
    asyncio.run(restart_policy.refuse_round(down))
    assert [a[0] for a in down.rendezvous.args] == [3, 0]


def test_a_retry_says_which_restart_of_which_budget() -> None:
    """Kills restart_policy retried__mutmut_3/6/8-10/17-21 (the reason's words and numbers)."""
    budgets = Budgets(exception=ClassBudget(max=5))
    ctx = ctx_with(failure(attempt=1), (failure(),), budgets=budgets)
    _, step = decide(ctx)
    assert step.trigger is T.retry
    assert step.reason == "restart 1 of 3; exception 2 of 5"
    lost = Failure(kind=FailureKind.PEER, reason="node b lost: gone", attempt=0)
    ctx = ctx_with(lost, restarts=2, budgets=Budgets(node_lost=ClassBudget(max=4, charged=False)))
    _, step = decide(ctx)
    assert step.trigger is T.retry
    assert step.reason == "restart after node_lost, not charged to max_restarts (1 of 3 used; node_lost 1 of 4)"  # the fake counts it


def test_the_words_of_each_give_up() -> None:
    """Kills restart_policy why_stopping__mutmut_1/2, why_class_spent__mutmut_5/6, settle__mutmut_14/21."""
    stop = failed_ctx(stop=object())
    _, step = decide(stop)
    assert (step.reason, step.outcome, step.exit_code) == ("stopping: no restart", Outcome.FAILED, EXIT_WORKERS_FAILED)
    oom = ctx_with(failure(classified=FailureClass.OOM))
    _, step = decide(oom)
    assert step.reason == "not retried: oom failures have no restart left (restart.budgets.oom: 0)"
    assert (step.outcome, step.exit_code) == (Outcome.FAILED, EXIT_WORKERS_FAILED)


def test_a_crash_loop_names_the_exception_and_where() -> None:
    """Kills restart_policy why_crash_loop__mutmut_3/5/7-15."""
    _, step = decide(failed_ctx(earlier=LOOP))
    assert step.reason == ("crash loop: the same exception on 3 consecutive attempts: ValueError: bad 0x7f "
                           "(in train.py:step)")
    # the traceback only in stderr's tail (the error file had none)
    tail = [Failure(kind=FailureKind.WORKER, reason="r", attempt=a, exit_code=1, stderr_tail=TRACEBACK)
            for a in range(3)]
    ctx = ctx_with(tail[-1], tuple(tail[:-1]))
    assert restart_policy.why_crash_loop(ctx)[0].endswith(": ValueError: bad 0x7f (in train.py:step)")
    # no traceback at all: the error file's message, no frame (such failures make no loop: 0 attempts)
    bare = Failure(kind=FailureKind.WORKER, reason="r", attempt=0, exit_code=1, error="boom")
    assert restart_policy.why_crash_loop(ctx_with(bare))[0] == (
        "crash loop: the same exception on 0 consecutive attempts: boom")
    # a traceback with no frame line: no "(in ...)"
    frameless = Failure(kind=FailureKind.WORKER, reason="r", attempt=0, exit_code=1,
                        traceback="Traceback (most recent call last):\nValueError: x")
    assert restart_policy.why_crash_loop(ctx_with(frameless))[0].endswith(": ValueError: x")


@pytest.mark.parametrize(("kw", "reason", "code"), [
    ({"restarts": 3}, "restart budget spent (3 of 3 used)", EXIT_WORKERS_FAILED),
    ({"restarts": 2, "budgets": Budgets(exception=ClassBudget(max=2))},
     "restart budget spent (max_restarts 3, or exception's 2 job-wide)", EXIT_WORKERS_FAILED),
    ({"restarts": 2}, "not retried: another node stopped this round's restart (its report says why)",
     EXIT_WORKERS_FAILED),
    ({"restarts": 3, "budgets": Budgets(exception=ClassBudget(charged=False))},
     "not retried: another node stopped this round's restart (its report says why)", EXIT_WORKERS_FAILED),
], ids=["job-spent", "class-job-wide", "peer-said-no", "uncharged-class-not-job-spent"])
def test_why_a_refused_charge_gave_up(kw: dict[str, Any], reason: str, code: int) -> None:
    """Kills restart_policy why_spent__mutmut_7/10-14: which budget the words name."""
    ctx = ctx_with(failure(), **kw)
    assert restart_policy.why_spent(ctx) == (reason, code)


def test_an_infrastructure_give_up_on_a_refused_charge_exits_3() -> None:
    """Kills restart_policy why_spent__mutmut_7."""
    ctx = ctx_with(failure(kind="rendezvous"), restarts=3, budgets=Budgets(infra=ClassBudget()))
    assert restart_policy.why_spent(ctx) == ("restart budget spent (3 of 3 used)", EXIT_INFRA)


def test_a_rendezvous_error_while_charging_is_the_reason() -> None:
    """gather keeps the error; why_spent says the budget is unreachable (exit 3)."""
    ctx = ctx_with(failure(), left=-1)
    asyncio.run(gather(ctx))
    assert ctx.run.charge.error == RendezvousError("etcd unreachable").message
    assert restart_policy.why_spent(ctx) == ("not retried: the restart budget is unreachable (etcd unreachable)",
                                             EXIT_INFRA)


# -- the job's outcome ----------------------------------------------------------------------------------------


def test_the_jobs_end_in_exact_words() -> None:
    """Kills job_policy ended__mutmut_1/26/32/33."""
    assert ended(facts(group(0, **DONE), group(1, **DONE))).reason == "2 of 2 group(s) finished"
    assert ended(facts(group(0, **SPENT), group(1, **SPENT))).reason == (
        "0 group(s) finished, fewer than min_active 1")
    killed = ended(facts(group(0, **STOPPED), stop=StopRequested(9, graceful=False)))
    assert killed.exit_code == 128 + 9
    assert ended(facts(group(0, **STOPPED), stop=StopRequested(0, graceful=False))).exit_code == 128 + 15


def test_table_rows_are_every_source() -> None:
    """rows() gives one row per source state, in table order."""
    rows = table_machine.rows(TRANSITIONS)
    assert rows[0] == (S.INIT, T.initialized, S.RENDEZVOUS, None)
    assert len(rows) == sum(len(e.sources) for e in TRANSITIONS)
