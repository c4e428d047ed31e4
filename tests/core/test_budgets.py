"""Per-class restart budgets and crash-loop detection: real jobs, the backends' shared counts, the spec's parsing."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any

import pytest
from failing_jobs import WORKER, failing_job, report, worker_pid
from hypothesis import given, settings
from hypothesis import strategies as st
from rdzv_helpers import close_all, make_spec, open_nodes, rounds

from runner.config import load_spec_text
from runner.config.spec import Budgets, ClassBudget
from runner.errors import SpecError
from runner.outcomes import FailureClass
from runner.rendezvous.base import RoundCharge
from runner.rendezvous.etcd.budget import Charge, decide
from runner.rendezvous.etcd.keys import JobKeys
from runner.rendezvous.local import LocalRendezvous
from runner.testing.etcd_server import EtcdServer

CLASSES = [c.value for c in FailureClass]
HANG, LOST, EXC = FailureClass.HANG, FailureClass.NODE_LOST, FailureClass.EXCEPTION
WORDS = st.text(alphabet=st.characters(categories=("L", "N")), min_size=1, max_size=10)  # YAML itself is tested elsewhere


def last_reason(j: Any) -> str:
    """The reason of the run's last transition (the policy's give-up)."""
    reason: str = j.transitions()[-1]["reason"]
    return reason


@pytest.mark.integration
def test_a_class_with_budget_0_stops_at_once_although_max_restarts_is_3(job: Any) -> None:
    """signal: 0 — a worker SIGKILLed by the test is not restarted, with max_restarts 3 left untouched."""
    j = failing_job(job, "wait", fails=99, max_restarts=3, extra="  budgets: {signal: 0}")
    j.start()
    os.kill(worker_pid(j), signal.SIGKILL)
    assert j.proc is not None and j.proc.wait(60) == 1
    data = report(j)
    assert (data["attempts"], data["restarts"]) == (1, 0)
    assert last_reason(j) == "not retried: signal failures have no restart left (restart.budgets.signal: 0)"
    assert j.edges()[-1] == ("FAILED", "give_up", "SHUTDOWN")


@pytest.mark.integration
def test_a_class_with_budget_2_stops_after_2_of_its_kind(job: Any) -> None:
    """exception: 2 and max_restarts 5: different exceptions (no crash loop) are restarted twice, then not."""
    j = failing_job(job, "vary", fails=99, max_restarts=5, extra="  budgets: {exception: 2}")
    res = j.run()
    assert res.returncode == 1, res.stderr
    data = report(j)
    assert (data["attempts"], data["restarts"]) == (3, 2)
    assert [f["class"] for f in data["failures"]] == ["exception"] * 3
    retries = [t["reason"] for t in j.transitions() if t["trigger"] == "retry"]
    assert retries == ["restart 1 of 5; exception 1 of 2", "restart 2 of 5; exception 2 of 2"]
    assert last_reason(j) == "not retried: exception failures have no restart left (restart.budgets.exception: 2)"


@pytest.mark.integration
def test_the_same_exception_on_3_attempts_is_a_crash_loop(job: Any) -> None:
    """A worker raising the same error (its address varies) stops after crash_loop (3) attempts, max_restarts 5."""
    j = failing_job(job, "raise", fails=99, max_restarts=5)
    res = j.run()
    assert res.returncode == 1, res.stderr
    data = report(j)
    assert (data["attempts"], data["restarts"]) == (3, 2)
    assert len({f["fingerprint"] for f in data["failures"]}) == 1
    reason = last_reason(j)
    assert reason.startswith("crash loop: the same exception on 3 consecutive attempts: ValueError: bad batch at 0x")
    assert reason.endswith(f"(in {WORKER}:fail)")
    assert "crash loop: the same exception on 3 consecutive attempts" in res.stderr


@pytest.mark.integration
def test_different_exceptions_use_the_whole_budget(job: Any) -> None:
    """A new exception every attempt is no loop: max_restarts (3) restarts, then the budget is spent."""
    j = failing_job(job, "vary", fails=99, max_restarts=3)
    assert j.run().returncode == 1
    data = report(j)
    assert (data["attempts"], data["restarts"]) == (4, 3)
    assert last_reason(j) == "restart budget spent (3 of 3 used)"


@pytest.mark.integration
def test_crash_loop_0_turns_the_detection_off(job: Any) -> None:
    j = failing_job(job, "raise", fails=99, max_restarts=3, extra="  crash_loop: 0")
    assert j.run().returncode == 1
    assert report(j)["attempts"] == 4 and last_reason(j) == "restart budget spent (3 of 3 used)"


# --- the backends count classes job-wide ---


def test_local_backend_counts_each_class_and_the_job() -> None:
    async def body() -> list[int | None]:
        rdzv = LocalRendezvous("n", 1)
        return [c.count for c in [
            await rdzv.charge_restart(2, HANG, 1),  # hang 1 of 1, job 1 of 2
            await rdzv.charge_restart(2, HANG, 1),  # the class is spent
            await rdzv.charge_restart(2, LOST, None, charged=False),  # counted apart: job stays 1
            await rdzv.charge_restart(2, EXC, None),  # job 2 of 2
            await rdzv.charge_restart(2, LOST, None, charged=False),  # uncharged: still restarts
            await rdzv.charge_restart(2, EXC, None),  # the job's budget is spent
        ]]

    assert asyncio.run(body()) == [1, None, 1, 2, 2, None]


@pytest.mark.integration
def test_etcd_counts_classes_job_wide_and_every_node_gets_the_rounds_answer(etcd: EtcdServer) -> None:
    """Two nodes charging one round get one answer; the class's count is the key restarts/<class>."""
    async def body() -> None:
        spec = make_spec(etcd.endpoint)
        nodes = await open_nodes(spec, ["a", "b"])
        try:
            await rounds(nodes)
            got = await asyncio.gather(*(n.rdzv.charge_restart(5, HANG, 1) for n in nodes))
            assert [c.count for c in got] == [1, 1]
            assert got[0] == got[1] and got[0].failure_class is HANG and got[0].charged  # one answer, every node
            await rounds(nodes, attempt=1)
            spent = await asyncio.gather(*(n.rdzv.charge_restart(5, HANG, 1) for n in nodes))
            assert [c.count for c in spent] == [None, None]
            await rounds(nodes, attempt=1)  # a round not restarted: the next failure is another round's
            await rounds(nodes, attempt=2)
            lost = await asyncio.gather(*(n.rdzv.charge_restart(5, LOST, None, charged=False) for n in nodes))
            assert [(c.count, c.failure_class, c.charged) for c in lost] == [(1, LOST, False)] * 2  # job stays 1
            keys = JobKeys(spec.rendezvous.prefix, spec.name)
            session = nodes[0].rdzv.session
            counts = [await session.call(lambda c, k=k: c.get(keys.restarts + b"/" + k)) for k in (b"hang", b"node_lost")]
            assert [int(kv.value) for kv in counts] == [1, 1]
        finally:
            await close_all(nodes)

    asyncio.run(body())


@pytest.mark.integration
def test_a_peer_that_saw_a_reported_failure_lets_the_failing_node_charge_it(etcd: EtcdServer) -> None:
    """The peer (node_lost, uncharged) asks first but defers: the failing node's own class is what the round counts.

    Without `defer`, whichever node charged first decided: a peer that won the race made the restart uncharged, so
    a crash loop on the other node could restart past max_restarts.
    """
    async def body() -> None:
        spec = make_spec(etcd.endpoint)
        nodes = await open_nodes(spec, ["a", "b"])
        try:
            await rounds(nodes)
            peer = asyncio.ensure_future(nodes[0].rdzv.charge_restart(5, LOST, None, charged=False, defer=5.0))
            await asyncio.sleep(0.3)  # the peer asked first
            own = await nodes[1].rdzv.charge_restart(5, EXC, None)
            assert (await peer).count == own.count == 1  # the restart is charged: the job-wide count is 1 for both
            # and the peer gets the failing node's class and charge, not what it asked (node_lost, uncharged)
            assert await peer == own == RoundCharge(1, EXC, charged=True, by="b")
        finally:
            await close_all(nodes)

    asyncio.run(body())


@pytest.mark.integration
def test_a_failure_caused_by_a_peers_membership_restart_is_not_charged(etcd: EtcdServer) -> None:
    """Node b stops its workers for a node waiting to join, after claiming the round (uncharged); node a's worker
    fails on the broken collective before a's own watch sees the waiting node: a's charge finds b's claim, and
    neither the job's count nor the class's moves (CI once saw a late node cost the elastic example a restart)."""
    async def body() -> None:
        spec = make_spec(etcd.endpoint)
        nodes = await open_nodes(spec, ["a", "b"])
        try:
            await rounds(nodes)
            claim = await nodes[1].rdzv.charge_restart(5, charged=False)  # b: the membership change's claim
            assert claim == RoundCharge(0, None, charged=False, by="b")
            assert await nodes[0].rdzv.charge_restart(5, EXC, None) == claim  # a: its worker's failure: b's claim
            keys = JobKeys(spec.rendezvous.prefix, spec.name)
            session = nodes[0].rdzv.session
            assert await session.call(lambda c: c.get(keys.restarts)) is None
            assert await session.call(lambda c: c.get(keys.restarts + b"/exception")) is None
            await rounds(nodes, attempt=1)  # the next round's failure is charged as usual
            assert (await nodes[0].rdzv.charge_restart(5, EXC, None)).count == 1
        finally:
            await close_all(nodes)

    asyncio.run(body())


# --- restart.budgets and restart.crash_loop in the spec ---

LIMITS = st.one_of(st.none(), st.integers(0, 1000))
ENTRY = st.one_of(
    LIMITS,
    st.fixed_dictionaries({}, optional={"max": LIMITS, "charged": st.booleans()}),
)


def load(restart: dict[str, Any]) -> Any:
    text = json.dumps({"name": "j", "entrypoint": "t.py", "restart": restart}, ensure_ascii=False)
    return load_spec_text(text, source="job.json", base_dir="/tmp", environ={})


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(CLASSES), ENTRY, max_size=7))
def test_any_valid_budgets_load_as_written_and_keep_the_other_defaults(raw: dict[str, Any]) -> None:
    budgets = load({"budgets": raw}).restart.budgets
    default = Budgets()
    for cls in FailureClass:
        base, value = default.of(cls), raw.get(cls.value, "absent")
        if value == "absent":
            expected = base
        elif isinstance(value, dict):
            expected = ClassBudget(max=value.get("max", base.max), charged=value.get("charged", base.charged))
        else:
            expected = ClassBudget(max=value, charged=base.charged)
        assert budgets.of(cls) == expected, cls


BAD = st.one_of(
    st.integers(max_value=-1),
    WORDS,
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer()),
    st.lists(st.integers(), max_size=2),
    st.fixed_dictionaries({"max": st.integers(max_value=-1)}),
    st.fixed_dictionaries({"charged": WORDS}),
    st.fixed_dictionaries({"limit": st.integers(0, 3)}),
)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(CLASSES), BAD)
def test_invalid_budgets_are_refused_with_the_field_named(cls: str, value: Any) -> None:
    with pytest.raises(SpecError) as err:
        load({"budgets": {cls: value}})
    assert f"restart.budgets.{cls}" in str(err.value)


@settings(max_examples=30, deadline=None)
@given(WORDS.filter(lambda s: s not in CLASSES))
def test_an_unknown_class_is_refused(name: str) -> None:
    with pytest.raises(SpecError) as err:
        load({"budgets": {name: 1}})
    assert "restart.budgets" in str(err.value)


@given(st.integers(0, 1000))
def test_crash_loop_values(n: int) -> None:
    if n == 1:
        with pytest.raises(SpecError, match="crash_loop"):
            load({"crash_loop": n})
    else:
        assert load({"crash_loop": n}).restart.crash_loop == n


def test_defaults_a_user_would_choose() -> None:
    b = load({}).restart.budgets
    assert (b.oom, b.infra) == (ClassBudget(max=0), ClassBudget(max=0))
    assert b.node_lost == b.preempted == ClassBudget(max=None, charged=False)
    assert b.exception == b.signal == b.hang == ClassBudget()
    assert load({}).restart.crash_loop == 3


@given(max_restarts=st.integers(0, 20), count=st.integers(0, 25), used=st.integers(0, 25),
       class_limit=st.none() | st.integers(0, 20), job_wide=st.booleans())
def test_a_charge_decides_as_the_two_budgets_say(max_restarts: int, count: int, used: int, class_limit: int | None,
                                                job_wide: bool) -> None:
    """The pure decision of runner/rendezvous/etcd/budget.py: spent (None) exactly when a job-wide charge finds the
    job's budget used up or the class's limit is reached; otherwise the job's count moves by one only job-wide."""
    new = decide(Charge(max_restarts, HANG, class_limit, job_wide), count, used)
    spent = (job_wide and count >= max_restarts) or (class_limit is not None and used >= class_limit)
    assert (new is None) == spent
    if new is not None:
        assert new == count + (1 if job_wide else 0)
        assert not job_wide or new <= max_restarts
