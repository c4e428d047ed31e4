"""A round's restart charge counts under one class on every node (issue 40).

The first node to charge a round writes its marker (runner/rendezvous/etcd/budget.py) with the count, the class and
whether max_restarts paid for it; every node reads it back (`marker_charge`) and counts the restart as it says
(runner/core/restart_policy.py `counted_as`): a peer that saw another node's exception as a lost node counts it as
that exception, charged, not as a re-rendezvous after a lost node besides the restart. The real-process test is in
tests/multinode/test_multinode.py (`test_a_peers_charged_restart_is_counted_as_its_class_on_every_node`).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from runner.config.spec import Budgets, ClassBudget, Entrypoint, JobSpec
from runner.core import restart_policy
from runner.core.context import Charge, GroupRun
from runner.diagnosis.failure import Failure
from runner.outcomes import FailureClass, FailureKind
from runner.rendezvous.base import RoundCharge
from runner.rendezvous.etcd.budget import marker_charge, marker_record
from runner.rendezvous.etcd.keys import dump, load
from runner.states.restarting import count_uncharged

EXC, LOST = FailureClass.EXCEPTION, FailureClass.NODE_LOST

# --- the marker, written and read back (the etcd boundary) ---

CHARGES = st.builds(RoundCharge, count=st.none() | st.integers(0, 10**6),
                    failure_class=st.none() | st.sampled_from(FailureClass), charged=st.booleans(),
                    by=st.text(max_size=20))
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
MARKERS = st.fixed_dictionaries({}, optional={
    "count": JSONISH | st.integers(-3, 10), "by": JSONISH, "charged": JSONISH | st.booleans(),
    "class": JSONISH | st.sampled_from([c.value for c in FailureClass]),
}) | JSONISH


@settings(max_examples=200)
@given(CHARGES)
def test_a_marker_reads_back_as_the_charge_written(charge: RoundCharge) -> None:
    """What a node writes (through etcd's JSON) is what every other node of the round reads."""
    assert marker_charge(load(dump(marker_record(charge)))) == charge


@settings(max_examples=300)
@given(MARKERS)
def test_any_marker_reads_as_a_charge_without_raising(record: Any) -> None:
    """A damaged or foreign marker never raises; an unreadable count is a refusal (no restart on it)."""
    got = marker_charge(record)
    count = record.get("count") if isinstance(record, dict) else None
    if not (isinstance(count, int) and not isinstance(count, bool) and count >= 0):
        assert got.count is None
    assert got.failure_class is None or isinstance(got.failure_class, FailureClass)
    assert got.charged in (None, True, False)
    assert isinstance(got.by, str)


def test_an_older_runners_marker_says_nothing_of_the_charge_but_a_membership_claim() -> None:
    """Before `charged` was written: a class's charge leaves it to the spec's budget (None); the classless charge
    that restarts was only ever the membership change's claim (not charged); a class of a newer runner: unknown."""
    assert marker_charge({"count": 2, "by": "a", "class": "exception"}) == RoundCharge(2, EXC, charged=None, by="a")
    assert marker_charge({"count": 0, "by": "b", "class": ""}) == RoundCharge(0, None, charged=False, by="b")
    assert marker_charge({"count": 1, "by": "a", "class": "cosmic_ray"}) == RoundCharge(1, None, charged=None,
                                                                                         by="a")
    assert marker_charge({"count": None, "class": ""}).count is None


# --- what a restart counts under on this node: one decision ---


def ctx_of(failure: Failure, charge: RoundCharge | None, budgets: Budgets | None = None) -> Any:
    spec = JobSpec(name="j", entrypoint=Entrypoint(script="t.py"))
    if budgets is not None:
        spec = SimpleNamespace(restart=SimpleNamespace(budgets=budgets, max_restarts=3))  # type: ignore[assignment]
    run = GroupRun(failure=failure, failures=[failure], restarts=charge.count or 0 if charge else 0,
                   charge=Charge(charge) if charge is not None else None)
    return SimpleNamespace(spec=spec, run=run)


PEER = Failure(FailureKind.PEER, "node a lost: reported FAILED: rank 0 exited with code 3", attempt=0)
GONE = Failure(FailureKind.PEER, "node a lost: lease expired", attempt=0)
OWN = Failure(FailureKind.WORKER, "rank 1 exited with code 1: ValueError: x (t.py:3)", 1, exit_code=1)


def test_a_peers_charged_exception_counts_as_a_restart_not_a_lost_node() -> None:
    """Node a's exception, charged by a: b saw it as a lost node, and counts it as a's exception, charged."""
    ctx = ctx_of(PEER, RoundCharge(1, EXC, charged=True, by="a"))
    assert restart_policy.counted_as(ctx, PEER) == (EXC, True)
    count_uncharged(ctx, PEER)
    assert ctx.run.uncharged == {}  # the restart is the budget's count (1), not also a lost node's re-rendezvous
    counted = restart_policy.as_counted(ctx)
    assert (counted.failure_class, counted.evidence) == (EXC, "as node a charged this round")
    assert counted.kind is FailureKind.PEER and counted.reason == PEER.reason


def test_a_node_really_lost_stays_node_lost_and_uncharged() -> None:
    """Its lease lapsed: whoever saw it first charged `node_lost`, uncharged; every node counts it so."""
    ctx = ctx_of(GONE, RoundCharge(0, LOST, charged=False, by="b"))
    assert restart_policy.counted_as(ctx, GONE) == (LOST, False)
    count_uncharged(ctx, GONE)
    assert ctx.run.uncharged == {"node_lost": 1}
    assert restart_policy.as_counted(ctx) is GONE


def test_an_uncharged_class_of_a_peer_counts_uncharged_under_that_class() -> None:
    """Charged or not, the round's class and decision: a peer's preemption charged as such by the peer."""
    ctx = ctx_of(PEER, RoundCharge(0, FailureClass.PREEMPTED, charged=False, by="a"))
    count_uncharged(ctx, PEER)
    assert ctx.run.uncharged == {"preempted": 1}
    assert restart_policy.as_counted(ctx).failure_class is FailureClass.PREEMPTED


def test_an_own_failure_in_a_round_claimed_for_a_membership_change_counts_as_membership() -> None:
    """b claimed the round for a joining node (no class, uncharged); a's worker died of it: a's restart is that
    re-rendezvous, not a charged restart; a's own failure keeps its class (it is what a's worker did)."""
    ctx = ctx_of(OWN, RoundCharge(0, None, charged=False, by="b"))
    count_uncharged(ctx, OWN)
    assert ctx.run.uncharged == {"membership": 1}
    assert restart_policy.as_counted(ctx) is OWN


def test_a_charge_that_does_not_say_leaves_it_to_the_classs_budget() -> None:
    """An older runner's marker (charged None): the spec's budget for the round's class (or the failure's own)."""
    budgets = Budgets(exception=ClassBudget(charged=False))
    ctx = ctx_of(PEER, RoundCharge(1, EXC, charged=None, by="a"), budgets)
    assert restart_policy.counted_as(ctx, PEER) == (EXC, False)
    ctx = ctx_of(GONE, RoundCharge(1, None, charged=None, by="a"))
    assert restart_policy.counted_as(ctx, GONE) == (LOST, False)
    ctx = ctx_of(OWN, None)  # no charge made: the failure's own class
    assert restart_policy.counted_as(ctx, OWN) == (EXC, True)
