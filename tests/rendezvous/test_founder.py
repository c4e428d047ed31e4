"""The founder's rule (runner/rendezvous/etcd/founder.py): when the first member may go on as a cluster of one.

Only with exactly two voters, only the founder, only without a leader, only when the other voter's etcd does not
answer: every other case must leave the cluster as it is (a second rendezvous behind a cut link is worse than none).
The whole path, on hosts: tests/rendezvous/test_hosted_members.py (two member hosts lost one after the other).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runner.rendezvous.etcd.client import MemberInfo
from runner.rendezvous.etcd.founder import Look, alone_with


def member(i: int, name: str, *, learner: bool = False) -> MemberInfo:
    return MemberInfo(i, name, (f"https://{name}:2380",), () if learner else (f"https://{name}:2379",), learner)


A, B, C = member(1, "a"), member(2, "b"), member(3, "c")


def test_the_founder_with_one_other_voter_lost_and_no_leader_goes_on_alone() -> None:
    assert alone_with(Look(0, (A, B)), "a", up=set()) == B
    assert alone_with(Look(0, (A, B, member(4, "d", learner=True))), "a", up=set()) == B  # a learner does not vote


def test_every_other_case_leaves_the_cluster_alone() -> None:
    assert alone_with(Look(7, (A, B)), "a", up=set()) is None  # a leader: nothing is lost
    assert alone_with(Look(0, (A, B)), "a", up={2}) is None  # b's etcd answers: slow, not lost
    assert alone_with(Look(0, (A, B, C)), "a", up=set()) is None  # three voters: b and c may be live behind a cut
    assert alone_with(Look(0, (A,)), "a", up=set()) is None  # alone already
    assert alone_with(Look(0, (B, C)), "a", up=set()) is None  # a is no voter here


@given(st.lists(st.tuples(st.sampled_from("abcde"), st.booleans()), max_size=6, unique_by=lambda m: m[0]),
       st.integers(0, 3), st.sets(st.integers(0, 5)))
def test_the_founder_goes_on_alone_only_as_the_one_of_two_voters_left(members, leader, up) -> None:
    """Any member list, leader and set of answering members: a forced cluster only from exactly two voters, the
    founder one of them, no leader, and the other neither answering nor the founder itself."""
    look = Look(leader, tuple(member(i, name, learner=learner) for i, (name, learner) in enumerate(members)))
    lost = alone_with(look, "a", up)
    voting = [m for m in look.members if not m.learner]
    if lost is not None:
        assert leader == 0 and len(voting) == 2 and "a" in {m.name for m in voting}
        assert lost in voting and lost.name != "a" and lost.id not in up
    elif leader == 0 and len(voting) == 2 and "a" in {m.name for m in voting}:
        assert next(m for m in voting if m.name != "a").id in up
