"""runner.hangs: a flight-recorder dump parsed in bounded time whatever it holds, and the culprit it implies."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from runner.hangs import Answer, Finding, RankRecord, analyse, parse_dump, rank_list

NOW = 1_800_000_000 * 10**9


def entry(seq: int, *, done: bool = True, op: str = "gloo:all_reduce", sizes: object = ((10,),), pg: int = 0,
          at: int | None = None) -> dict[str, object]:
    """One record as torch 2.13's fr_trace_json writes it (the fields read here)."""
    return {"collective_seq_id": seq, "pg_id": pg, "profiling_name": op, "input_sizes": [list(s) for s in sizes],
            "retired": done, "state": "scheduled", "is_p2p": False,
            "time_created_ns": at if at is not None else NOW - 10**9 * (100 - seq)}


def record(rank: int, entries: list[dict[str, object]], node: str = "a") -> RankRecord:
    return RankRecord(rank, node, Answer.ANSWERED, parse_dump(json.dumps({"entries": entries})))


def calls_up_to(n: int, *, last_open: bool) -> list[dict[str, object]]:
    return [entry(i, done=not (last_open and i == n)) for i in range(1, n + 1)]


def test_the_rank_that_never_entered_is_the_culprit_not_the_one_that_waits():
    verdict = analyse([record(0, calls_up_to(4, last_open=True)), record(1, calls_up_to(3, last_open=False))], NOW)
    assert verdict.finding is Finding.NEVER_ENTERED
    assert verdict.culprits == ((1, "a"),) and verdict.waiting == ((0, "a"),)
    assert verdict.seq == 4 and verdict.op == "all_reduce [[10]]"
    assert verdict.reason().startswith("hang: rank 1 (node a) never entered all_reduce #4 (process group 0); rank 0")


def test_a_mismatch_names_the_minority_and_without_a_majority_every_side():
    common = calls_up_to(3, last_open=False)
    odd = [*common, entry(4, done=False, op="gloo:all_gather")]
    normal = [*common, entry(4, done=False)]
    three = analyse([record(0, normal), record(1, normal, "b"), record(2, odd, "b")], NOW)
    assert three.finding is Finding.MISMATCH and three.culprits == ((2, "b"),)
    assert three.waiting == ((0, "a"), (1, "b"))
    assert "rank 2 (node b) called all_gather [[10]] while ranks 0 (node a), 1 (node b) called all_reduce" in (
        three.reason())
    two = analyse([record(0, normal), record(1, odd)], NOW)
    assert two.finding is Finding.MISMATCH and two.culprits == ((0, "a"), (1, "a")) and not two.waiting
    sizes = analyse([record(0, normal), record(1, normal), record(2, [*common, entry(4, done=False, sizes=((20,),))])],
                    NOW)
    assert sizes.culprits == ((2, "a"),) and "all_reduce [[20]]" in sizes.reason()


def test_a_stopped_or_silent_rank_is_the_culprit_of_peers_waiting_in_a_collective():
    waiting = record(0, calls_up_to(4, last_open=True))
    stopped = analyse([waiting, RankRecord(1, "b", Answer.STOPPED)], NOW)
    assert stopped.finding is Finding.STOPPED and stopped.culprits == ((1, "b"),) and stopped.missing == (1,)
    silent = analyse([waiting, RankRecord(1, "b", Answer.SILENT)], NOW)
    assert silent.finding is Finding.SILENT and silent.culprits == ((1, "b"),)


def test_after_a_collective_timeout_the_ranks_in_no_collective_are_named():
    """The rank that gave up is gone with its records; the others that are in no collective held it up."""
    gone = RankRecord(0, "a", Answer.TIMED_OUT)
    verdict = analyse([gone, record(1, calls_up_to(3, last_open=False), "b")], NOW)
    assert verdict.finding is Finding.AWAY and verdict.culprits == ((1, "b"),) and verdict.waiting == ((0, "a"),)
    assert verdict.reason() == ("hang: rank 1 (node b) was in no collective (last call: all_reduce [[10]] #3) "
                                "while rank 0 (node a) timed out waiting in one")
    waiting = analyse([gone, record(1, calls_up_to(4, last_open=True)), record(2, calls_up_to(3, last_open=False))],
                      NOW)
    assert waiting.finding is Finding.NEVER_ENTERED and waiting.culprits == ((2, "a"),)  # a waiter still answers


def test_no_open_collective_or_everyone_inside_one_names_nobody_and_says_so():
    done = analyse([record(0, calls_up_to(3, last_open=False)), record(1, calls_up_to(3, last_open=False))], NOW)
    assert done.finding is Finding.UNKNOWN and not done.named
    assert "outside collectives" in done.reason()
    inside = analyse([record(0, calls_up_to(4, last_open=True)), record(1, calls_up_to(4, last_open=True))], NOW)
    assert inside.finding is Finding.UNKNOWN and "the collective itself is stuck" in inside.reason()
    nothing = analyse([RankRecord(0, "a", Answer.NO_RECORDER), RankRecord(1, "a", Answer.NO_RECORDER)], NOW)
    assert nothing.finding is Finding.UNKNOWN and nothing.ranks == 0 and nothing.missing == (0, 1)


def test_the_waiter_that_has_waited_longest_dates_the_hang():
    a = [*calls_up_to(3, last_open=False), entry(4, done=False, at=NOW - 7 * 10**9)]
    b = [*calls_up_to(3, last_open=False), entry(4, done=False, at=NOW - 2 * 10**9)]
    verdict = analyse([record(0, a), record(1, b), record(2, calls_up_to(3, last_open=False))], NOW)
    assert verdict.culprits == ((2, "a"),) and verdict.waited_s == 7.0


def test_point_to_point_and_malformed_entries_are_left_out():
    entries = [entry(1), {**entry(2), "is_p2p": True}, {"collective_seq_id": "3"}, {**entry(4), "pg_id": True},
               {**entry(5), "input_sizes": [[1, "x"]]}, 7, None]
    calls = parse_dump(json.dumps({"entries": entries}))
    assert [c.seq for c in calls] == [1, 5]
    assert calls[1].sizes == ()


def test_rank_lists_fold_runs():
    assert rank_list([5, 0, 1, 2, 7, 8]) == "0-2, 5, 7-8"
    assert rank_list([]) == ""


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=20), inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000) | JSONISH.map(lambda v: json.dumps(v).encode())
       | st.lists(st.dictionaries(st.sampled_from(["collective_seq_id", "pg_id", "profiling_name", "input_sizes",
                                                    "retired", "state", "is_p2p", "time_created_ns"]), JSONISH),
                  max_size=20).map(lambda es: json.dumps({"entries": es}).encode()))
def test_any_dump_parses_without_raising(raw):
    calls = parse_dump(raw)
    for c in calls:
        assert isinstance(c.seq, int) and isinstance(c.op, str) and len(c.op) <= 80


SCENARIO = st.tuples(st.integers(2, 8), st.integers(1, 30), st.data())


@settings(max_examples=200, deadline=None)
@given(SCENARIO)
def test_any_set_of_ranks_behind_the_others_is_named_exactly(scenario):
    """n ranks, k collectives done by all; a non-empty strict subset never enters #k+1, which the rest wait in."""
    n, k, data = scenario
    behind = data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n - 1))
    nodes = data.draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=n, max_size=n))
    records = [record(r, calls_up_to(k, last_open=False) if r in behind else calls_up_to(k + 1, last_open=True),
                      nodes[r]) for r in range(n)]
    verdict = analyse(records, NOW)
    assert verdict.finding is Finding.NEVER_ENTERED
    assert [r for r, _ in verdict.culprits] == sorted(behind)
    assert [r for r, _ in verdict.waiting] == sorted(set(range(n)) - behind)
    assert all(nodes[r] == node for r, node in verdict.culprits)
    assert verdict.to_dict()["reason"] == verdict.reason()


CALL = st.tuples(st.integers(1, 6), st.booleans(), st.sampled_from(["gloo:all_reduce", "gloo:broadcast"]),
                 st.integers(0, 1))
RANK = st.tuples(st.sampled_from(list(Answer)), st.lists(CALL, max_size=8))


@settings(max_examples=200, deadline=None)
@given(st.lists(RANK, min_size=1, max_size=6))
def test_any_records_give_a_verdict_whose_culprits_and_waiters_are_known_ranks(ranks):
    records = [RankRecord(r, "n", answer, parse_dump(json.dumps({"entries": [
        entry(seq, done=done, op=op, pg=pg) for seq, done, op, pg in calls]})) if answer is Answer.ANSWERED else ())
        for r, (answer, calls) in enumerate(ranks)]
    verdict = analyse(records, NOW)
    known = {r.rank for r in records}
    assert {r for r, _ in verdict.culprits} <= known and {r for r, _ in verdict.waiting} <= known
    assert not {r for r, _ in verdict.culprits} & {r for r, _ in verdict.waiting}
    assert verdict.reason().startswith("hang: ")
    json.dumps(verdict.to_dict())
