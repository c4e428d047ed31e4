"""runner/rendezvous/etcd/round.py's pure part, its result record included (round_result.py until issue 41): the
cases mutation testing found untested (bench/mutation.sh, docs/testing.md "Mutation score")."""

from __future__ import annotations

import json
import time

import pytest

from runner.errors import RendezvousError
from runner.rendezvous.etcd.round import (
    MAX_RESULT_NODES,
    Roster,
    RoundResult,
    build_result,
    is_gone,
    parse_result,
    reforms_previous,
    result_of,
    result_with,
    stays_out,
)

FIX = ("something other than runner wrote under this job's etcd prefix: give the job a new name, or forget its state "
       "(runner reset --force job.yaml)")
JOIN = {"addr": "10.0.0.1", "port": 29500, "nproc": 2}


def test_a_node_with_an_outcome_is_gone() -> None:
    """Kills round is_gone__mutmut_8-11."""
    assert is_gone({"state": "RUNNING", "outcome": "failed"})
    assert not is_gone({"state": "RUNNING", "outcome": ""})
    assert not stays_out({"state": "RUNNING"})


def test_a_round_reforms_the_previous_one_only_without_newcomers() -> None:
    """Kills round reforms_previous__mutmut_1-4 and Roster.reforms_previous__mutmut_1-4."""
    assert reforms_previous(["a", "b"], {"a": 1})
    assert reforms_previous(["a", "b"], {})
    assert not reforms_previous(["a", "b"], {"a": 1, "c": 1})
    assert not reforms_previous([], {"a": 1})
    assert not reforms_previous([], {})
    roster = Roster(["a", "b"])
    assert roster.reforms_previous()
    roster.join("a", b"{}")
    assert roster.reforms_previous()
    roster.join("c", b"{}")
    assert not roster.reforms_previous()
    assert not Roster([]).reforms_previous()


def test_the_roster_counts_newcomers_as_they_join_and_leave() -> None:
    """Kills Roster.__init__ mutmut_8/9 and Roster.join mutmut_2-17."""
    roster = Roster(["a"])
    assert roster.newcomers == 0
    roster.join("c", b"1")
    roster.join("c", b"2")  # the same newcomer twice: counted once, its last record kept
    assert roster.newcomers == 1
    assert roster.joined == {"c": b"2"}
    roster.join("a", b"3")  # a node of the previous round is no newcomer
    assert roster.newcomers == 1
    roster.join("a", None)
    assert roster.newcomers == 1
    roster.join("x", None)  # a node that never joined leaves: nothing changes
    assert roster.newcomers == 1
    roster.join("c", None)
    assert roster.newcomers == 0
    assert roster.joined == {}
    assert roster.waiting_list() == []  # a's live state is unknown: not waited for


def test_a_vanished_or_unreadable_state_drops_the_node_from_the_live_states() -> None:
    """Kills Roster.state mutmut_4/7-9."""
    roster = Roster(["a", "b"])
    roster.state("a", None)  # never seen: nothing to drop, no error
    roster.state("b", b"")
    assert roster.live == {}
    roster.state("a", json.dumps({"state": "RUNNING"}).encode())
    roster.state("b", json.dumps({"state": "RUNNING"}).encode())
    assert roster.waiting_list() == ["a", "b"]
    roster.state("a", None)
    assert roster.live == {"b": {"state": "RUNNING"}}
    assert roster.waiting_list() == ["b"]


def test_build_result_decodes_rank_0s_raw_record() -> None:
    """Kills round build_result__mutmut_1/9/10/47/48/53/54."""
    before = time.time()
    result = build_result({"a": json.dumps(JOIN).encode(), "b": b"not json at all"}, ["a", "b"], 2)
    assert result.nodes == ("a", "b")
    assert (result.master_addr, result.master_port, result.nproc, result.rev) == ("10.0.0.1", 29500, 2, 0)
    assert before <= result.closed_at <= time.time()
    assert build_result({"a": JOIN}, [], 1, rev=7).rev == 7


def test_build_result_refuses_a_foreign_record_of_rank_0_with_the_fix() -> None:
    """Kills round build_result__mutmut_33/34/36/38-42."""
    junk = {"addr": 1, "x": "y" * 200}
    with pytest.raises(RendezvousError) as e:
        build_result({"a": junk}, [], 1)
    assert e.value.fix == FIX
    assert f"not one runner writes: {str(junk)[:120]!r}" in e.value.message


def test_the_longest_result_is_accepted_and_one_more_node_refused() -> None:
    """Kills round_result parse_result__mutmut_8, result_with__mutmut_37 (> against >=)."""
    record = {"master_addr": "h", "master_port": 1, "nproc": 1}
    longest = ["n"] * MAX_RESULT_NODES
    result = parse_result({**record, "nodes": longest})
    assert result is not None
    assert len(result.nodes) == MAX_RESULT_NODES
    assert result_with(record, tuple(longest)) is not None
    assert parse_result({**record, "nodes": [*longest, "n"]}) is None
    assert result_with(record, (*longest, "n")) is None


def test_a_result_without_closed_at_closed_at_zero() -> None:
    """Kills round_result result_with__mutmut_6/8/11."""
    result = parse_result({"nodes": ["a"], "master_addr": "h", "master_port": 1, "nproc": 1})
    assert result == RoundResult(("a",), "h", 1, 1, 0.0, 0)


def test_result_of_reads_a_result_and_refuses_anything_else_with_the_fix() -> None:
    """Kills round_result result_of__mutmut_1/2/5/6/8/10-14."""
    record = RoundResult(("a",), "h", 1, 2, 3.0, 4).record()
    assert result_of(record, 3) == RoundResult(("a",), "h", 1, 2, 3.0, 4)
    value = {"nodes": "x" * 300}
    with pytest.raises(RendezvousError) as e:
        result_of(value, 3)
    assert e.value.message == (f"the result of rendezvous round 3 in etcd is not a result record: "
                               f"{str(value)[:120]!r}")
    assert e.value.fix == FIX
