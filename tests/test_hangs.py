"""runner.hangs: a flight-recorder dump parsed in bounded time whatever it holds, and the culprit it implies."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from runner.hangs import (
    Answer,
    Culprit,
    Finding,
    RankRecord,
    Verdict,
    analyse,
    claims_of,
    mismatch_words,
    parse_dump,
    rank_list,
    read_dump,
)

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
    assert verdict.reason().startswith(("hang: ", "collective mismatch"))
    json.dumps(verdict.to_dict())


# -- the culprit is never a waiter (docs/hangs.md: each finding's precondition) -------------------------------

WAITER = st.sampled_from(["open", "timed_out", "exiting", "silent", "no_recorder", "exited"])
CULPRIT = st.sampled_from(["behind", "stopped", "silent", "elsewhere"])
TEARDOWN_ANSWER = {"timed_out": Answer.TIMED_OUT, "exiting": Answer.EXITING, "silent": Answer.SILENT,
                   "no_recorder": Answer.NO_RECORDER, "exited": Answer.EXITED, "stopped": Answer.STOPPED}


def as_seen(r: int, how: str, k: int, node: str) -> RankRecord:
    """What the query gets from rank `r` that behaves as `how` (a culprit's or a waiter's way)."""
    if how == "behind":
        return record(r, calls_up_to(k, last_open=False), node)
    if how == "open":
        return record(r, calls_up_to(k + 1, last_open=True), node)
    if how == "elsewhere":  # entered a collective of group 1 (with whom: not said) instead
        return record(r, [*calls_up_to(k, last_open=False), entry(1, done=False, pg=1, at=NOW - 10**9)], node)
    return RankRecord(r, node, TEARDOWN_ANSWER[how])


def expected(how: dict[int, str], culprits: set[int]) -> tuple[Finding, set[int]] | None:
    """The finding and the ranks named, where the culprits' own records or state show them (None: not decided)."""
    kinds = {how[r] for r in culprits}
    waiting_open = sum(how[r] == "open" for r in how if r not in culprits)
    if "stopped" in kinds:
        return Finding.STOPPED, {r for r in culprits if how[r] == "stopped"}
    if kinds == {"behind"}:
        return (Finding.NEVER_ENTERED if waiting_open else Finding.AWAY), culprits
    if kinds == {"silent"} and waiting_open == len(how) - len(culprits):
        return Finding.SILENT, culprits
    if "behind" in kinds and waiting_open:  # the others are stopped by nothing, or wait where the records show
        return Finding.NEVER_ENTERED, {r for r in culprits if how[r] == "behind"}
    if kinds == {"elsewhere"} and len(culprits) == 1 and waiting_open >= 2:
        return Finding.NEVER_ENTERED, culprits  # one rank alone elsewhere
    return None


@settings(max_examples=400, deadline=None)
@given(st.integers(2, 64), st.integers(1, 10), st.data())
def test_the_culprit_is_named_or_nobody_is_never_a_rank_that_was_waiting(n, k, data):
    """n ranks; a non-empty strict subset never enters collective #k+1 (it sleeps: its records end at #k; or it is
    stopped; or it cannot answer; or it waits in a collective of another group); the rest wait in #k+1. A waiter
    answers from inside the call, or is leaving after a collective timeout: then at least one waiter is seen to
    have timed out (the exit that asked), and the others answer anything a leaving process answers (exiting,
    nothing, no server, gone). Whatever the mix, every rank named is a culprit; and the culprits are named whenever
    their own records or state show them."""
    culprits = data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n - 1))
    how = {r: data.draw(CULPRIT) if r in culprits else data.draw(WAITER) for r in range(n)}
    waiters = sorted(set(range(n)) - culprits)
    if any(how[r] != "open" for r in waiters) and not any(how[r] == "timed_out" for r in waiters):
        how[data.draw(st.sampled_from(waiters))] = "timed_out"
    nodes = data.draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=n, max_size=n))
    verdict = analyse([as_seen(r, how[r], k, nodes[r]) for r in range(n)], NOW)
    named = {r for r, _ in verdict.culprits}
    assert named <= culprits, (verdict.finding, how)
    assert all(nodes[r] == node for r, node in verdict.culprits)
    assert not named & {r for r, _ in verdict.waiting}
    if (decided := expected(how, culprits)) is not None:
        assert (verdict.finding, named) == decided, how
    if not named:
        assert verdict.finding is Finding.UNKNOWN
    assert verdict.reason().startswith("hang: ")


def test_the_reported_case_four_ranks_the_waiters_timed_out_and_leave_the_one_that_answered_is_named():
    """init_process_group(timeout=5s), no watchdog: rank 3 sleeps before the 4th all_reduce; ranks 0-2 time out at
    once. Rank 1's exit asks; ranks 0 and 2 are leaving (torch's handlers gone: 404). Was: `silent`, ranks 0, 2."""
    verdict = analyse([RankRecord(0, "vm", Answer.EXITING), RankRecord(1, "vm", Answer.TIMED_OUT),
                       RankRecord(2, "vm", Answer.EXITING), record(3, calls_up_to(3, last_open=False), "vm")], NOW)
    assert verdict.finding is Finding.AWAY and verdict.culprits == ((3, "vm"),)
    assert verdict.reason() == ("hang: rank 3 (node vm) was in no collective (last call: all_reduce [[10]] #3) "
                                "while rank 1 (node vm) timed out waiting in one (ranks 0, 2 not read)")


def test_a_rank_that_did_not_answer_is_named_only_when_every_other_rank_waits_from_inside_the_call():
    inside = [record(0, calls_up_to(4, last_open=True)), record(1, calls_up_to(4, last_open=True))]
    quiet = RankRecord(2, "a", Answer.SILENT)
    assert analyse([*inside, quiet], NOW).culprits == ((2, "a"),)
    leaving = analyse([*inside, quiet, RankRecord(3, "a", Answer.EXITING)], NOW)
    assert leaving.finding is Finding.UNKNOWN and not leaving.named
    assert "rank 2 (node a) did not answer, and 3 could not be read either" in leaving.reason()
    timed_out = analyse([*inside, quiet, RankRecord(3, "a", Answer.TIMED_OUT)], NOW)
    assert timed_out.finding is Finding.UNKNOWN and timed_out.waiting == ((0, "a"), (1, "a"), (3, "a"))


def test_after_a_timeout_a_rank_absent_from_the_call_the_others_entered_and_left_is_named():
    """The others' call is over (their peer's death ended it); the rank whose records end before it never came."""
    done = [entry(i) for i in range(1, 5)]
    verdict = analyse([RankRecord(0, "a", Answer.TIMED_OUT), record(1, done), record(2, done),
                       record(3, calls_up_to(3, last_open=False))], NOW)
    assert verdict.finding is Finding.NEVER_ENTERED and verdict.culprits == ((3, "a"),)
    assert verdict.waiting == ((0, "a"), (1, "a"), (2, "a")) and verdict.seq == 4


def test_a_dump_without_entries_says_the_recorder_is_off():
    off = b'{"comm_lib_version":"","nccl_comm_state":{},"pg_config":{},"pg_status":{},"version":"2.10"}'
    none_yet = b'{"pg_config":{"":{"desc":"","name":"","ranks":"[0]"}},"pg_status":{},"version":"2.10"}'
    assert read_dump(off) is None and parse_dump(off) == ()
    assert read_dump(none_yet) == ()  # on, no collective yet
    assert read_dump(b"[]") == () and read_dump(b"{}") == ()
    verdict = analyse([RankRecord(0, "a", Answer.RECORDER_OFF), RankRecord(1, "a", Answer.RECORDER_OFF)], NOW)
    assert verdict.finding is Finding.UNKNOWN and verdict.recorder_off == 2 and verdict.ranks == 0
    assert "the flight recorder is off in the workers" in verdict.reason()


def died(rank: int, words: str = "") -> RankRecord:
    return RankRecord(rank, "a", Answer.MISMATCHED, detail=words)


GLOO_SHORT = ("[enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 40 vs 20. Received data size doesn't "
              "match expected size. Is there a distributed collective mismatch in your code?")


def gathered(size: int) -> list[dict[str, object]]:
    """All_reduces #1-3, then all_gather #4 of `size` floats, ended (the peer that died closed the connections)."""
    return [*calls_up_to(3, last_open=False), entry(4, op="gloo:all_gather", sizes=((size,),))]


def test_a_mismatch_that_aborts_names_the_rank_whose_call_differed_with_both_calls():
    """Gloo: the rank that received more than its call expected dies; the ranks still alive are read."""
    # 3 ranks, rank 2 gathers 20 floats: rank 0 (receiving from it) dies; 1 and 2 disagree, 0 is the smaller side
    three = analyse([died(0, GLOO_SHORT), record(1, gathered(10)), record(2, gathered(20))], NOW)
    assert three.finding is Finding.MISMATCH and three.culprits == ((2, "a"),) and three.died == ((0, "a"),)
    assert three.waiting == ((0, "a"), (1, "a"))
    assert three.reason() == ("collective mismatch #4 (process group 0): rank 2 (node a) called all_gather [[20]] "
                              "while ranks 0-1 (node a) called all_gather [[10]]; rank 0 (node a) died of it")
    # rank 2 gathers 5 floats: it dies itself; the others agree
    itself = analyse([record(0, gathered(10)), record(1, gathered(10)), died(2, GLOO_SHORT)], NOW)
    assert itself.finding is Finding.MISMATCH and itself.culprits == ((2, "a"),)
    assert ("rank 2 (node a) called a smaller all_gather (it received 40 bytes where its own call expected 20) while "
            "ranks 0-1 (node a) called all_gather [[10]]; rank 2 (node a) died of it") in itself.reason()
    other = analyse([record(0, gathered(10)), record(1, gathered(10)), died(2, "[enforce at x:1] Is there a "
                                                                              "distributed collective mismatch")], NOW)
    assert "rank 2 (node a) called another call (its error: Is there a distributed collective mismatch)" in (
        other.reason())
    four = analyse([died(0, GLOO_SHORT), record(1, gathered(10)), record(2, gathered(10)), record(3, gathered(20))],
                   NOW)
    assert four.culprits == ((3, "a"),)


def test_a_mismatch_that_aborts_names_nobody_when_the_ranks_not_read_could_tip_it():
    gone = RankRecord(1, "a", Answer.EXITED)
    agree = analyse([died(0, GLOO_SHORT), gone, record(2, gathered(10))], NOW)  # rank 1 may have differed
    assert agree.finding is Finding.UNKNOWN and not agree.named
    assert agree.reason().startswith("collective mismatch: rank 0 (node a) died of it; which rank's call differed")
    tie = analyse([died(0), record(1, gathered(10)), record(2, gathered(20))], NOW)  # no words place rank 0
    assert tie.finding is Finding.UNKNOWN and "all_gather [[10]] (rank 1); all_gather [[20]] (rank 2)" in tie.reason()


@settings(max_examples=200, deadline=None)
@given(st.integers(3, 64), st.data())
def test_a_mismatch_that_aborts_never_names_a_rank_whose_call_was_right(n, data):
    """One rank gathers another size; the receiver of the larger data dies (the odd rank itself when its tensor is
    smaller, else a peer); any of the others may have exited before the query."""
    odd = data.draw(st.integers(0, n - 1))
    bigger = data.draw(st.booleans())
    dead = odd if not bigger else data.draw(st.sampled_from([r for r in range(n) if r != odd]))
    gone = data.draw(st.sets(st.sampled_from([r for r in range(n) if r != dead])))
    records = [died(r, GLOO_SHORT) if r == dead else RankRecord(r, "a", Answer.EXITED) if r in gone
               else record(r, gathered(20 if bigger else 5) if r == odd else gathered(10)) for r in range(n)]
    verdict = analyse(records, NOW)
    assert {r for r, _ in verdict.culprits} <= {odd}
    if not gone:
        assert verdict.culprits == ((odd, "a"),)


def test_a_culprit_whose_stack_cannot_be_read_says_why():
    culprit = Culprit(Verdict(Finding.STOPPED, ((1, "a"),)), {}, 0.1,
                      {1: "its process is stopped (state T): py-spy cannot read a stopped process"})
    why = "rank 1 (culprit): no stack: its process is stopped (state T): py-spy cannot read a stopped process"
    assert culprit.stacks_text() == [why]


C10D = ("RuntimeError: Detected mismatch between collectives on ranks. Rank {me} is running collective: "
        "CollectiveFingerPrint(SequenceNumber=3, OpType=ALLGATHER, TensorShape=[{mine}], TensorDtypes=Float, "
        "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu)), but Rank {other} is running collective: "
        "CollectiveFingerPrint(SequenceNumber=3, OpType=ALLGATHER, TensorShape=[{theirs}], TensorDtypes=Float)")


def test_c10d_fingerprints_name_the_rank_whose_call_differed_when_every_rank_leaves():
    """TORCH_DISTRIBUTED_DEBUG=DETAIL: every rank raises before the collective runs, each naming itself and one
    other; no record has the call. The words decide when they cover enough ranks."""
    said = {r: mismatch_words(C10D.format(me=r, mine=10, other=3, theirs=20)) for r in range(3)}
    said[3] = mismatch_words(C10D.format(me=3, mine=20, other=0, theirs=10))
    assert said[0] == "c10d: rank 0 ALLGATHER [10] #3; rank 3 ALLGATHER [20] #3"
    every = analyse([died(r, said[r]) for r in range(4)], NOW)
    assert every.finding is Finding.MISMATCH and every.culprits == ((3, "a"),)
    assert every.reason() == ("collective mismatch #3 (c10d's fingerprints): rank 3 (node a) called allgather [[20]] "
                              "while ranks 0-2 (node a) called allgather [[10]]; ranks 0-3 (node a) died of it")
    one = analyse([died(0, said[0]), *(RankRecord(r, "a", Answer.EXITING) for r in (1, 2, 3))], NOW)
    assert one.finding is Finding.UNKNOWN and "c10d's words name" in one.reason()  # 1-2 unknown: could tip it
    assert mismatch_words("x" * 5000 + " Is there a distributed collective mismatch") == "x" * 300


def test_one_rank_alone_in_a_call_elsewhere_is_named_and_a_rank_waiting_elsewhere_never_is():
    """Ranks 0-2 wait in all_reduce #4 of the default group; rank 3 waits alone in broadcast #2 of group 1 (ranks
    2-3): rank 3 never entered #4. Rank 2, a member of group 1 that never entered its #2, waits: it is not named."""
    crowd = [*calls_up_to(3, last_open=False), entry(1, pg=1, op="gloo:broadcast"), entry(4, done=False)]
    lone = [*calls_up_to(3, last_open=False), entry(1, pg=1, op="gloo:broadcast"),
            entry(2, pg=1, op="gloo:broadcast", done=False, at=NOW - 20 * 10**9)]  # entered first: the oldest call
    verdict = analyse([record(0, crowd), record(1, crowd), record(2, crowd), record(3, lone)], NOW)
    assert verdict.finding is Finding.NEVER_ENTERED and verdict.culprits == ((3, "a"),)
    assert verdict.waiting == ((0, "a"), (1, "a"), (2, "a")) and verdict.seq == 4 and verdict.group == "0"
    assert verdict.reason().startswith("hang: rank 3 (node a) never entered all_reduce #4 (process group 0) (it is in "
                                       "broadcast #2 (process group 1)); ranks 0-2 waited")
    older = [*lone[:-1], {**lone[-1], "time_created_ns": NOW - 200 * 10**9}]  # entered before the others entered #4
    assert analyse([record(0, crowd), record(1, crowd), record(2, crowd), record(3, older)], NOW).culprits == (
        (3, "a"),)  # was: rank 2, which never entered group 1's #2 (but waits in #4)
    two = analyse([record(0, crowd), record(1, crowd), record(2, lone), record(3, lone)], NOW)  # a cycle: nobody
    assert not two.named


def test_a_chain_of_waits_names_the_rank_at_its_end():
    """Ranks 0-1 wait in all_reduce #4 for rank 2, which waits in group 1's #2 for rank 3, asleep: rank 3."""
    first = [*calls_up_to(3, last_open=False), entry(1, pg=1), entry(4, done=False)]
    chained = [*calls_up_to(3, last_open=False), entry(1, pg=1), entry(2, pg=1, done=False, at=NOW - 200 * 10**9)]
    asleep = [*calls_up_to(3, last_open=False), entry(1, pg=1)]
    verdict = analyse([record(0, first), record(1, first), record(2, chained), record(3, asleep)], NOW)
    assert verdict.finding is Finding.NEVER_ENTERED and verdict.culprits == ((3, "a"),)
    assert verdict.group == "1" and verdict.waiting == ((2, "a"),)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=600) | st.builds(lambda a, b, c: C10D.format(me=a, mine=b, other=a + 1, theirs=c),
                                          st.integers(0, 10**6), st.text("0123456789, ", max_size=12),
                                          st.text("0123456789, ", max_size=12)))
def test_any_error_text_shortens_and_parses_without_raising(text):
    """A worker's error line, shortened to travel (bounded) and read back as c10d's claims: never raises."""
    words = mismatch_words(text)
    assert len(words) <= 300 or words.startswith("c10d: ")
    for rank, call in claims_of(words).items():
        assert rank >= 0 and call.op == "allgather"


NCCL_ENTRY = {"collective_seq_id": 3, "pg_id": 0, "profiling_name": "nccl:all_reduce", "input_sizes": [[4]],
              "is_p2p": False, "state": "scheduled", "time_created_ns": 5}
OFF = b'{"comm_lib_version":"","nccl_comm_state":{},"pg_config":{},"pg_status":{},"version":"2.10"}'


def test_nccls_own_recorder_is_read_with_the_other() -> None:
    """Under NCCL, `fr_trace_json` has no entries and `dump_nccl_trace_json` has them (seen with torch 2.11 on an
    H100, bench/gpu_nccl_check.py): merged, the rank's calls are read, not "the recorder is off"."""
    from runner.hangs import merge_dumps, read_dump

    nccl = json.dumps({"version": "2.10", "entries": [NCCL_ENTRY], "pg_config": {"0": {"name": "0"}}}).encode()
    assert read_dump(OFF) is None  # alone: reads as a recorder that is off
    calls = read_dump(merge_dumps(OFF, nccl))
    assert calls is not None and [(c.group, c.seq, c.op) for c in calls] == [("0", 3, "all_reduce")]
    gloo = json.dumps({"version": "2.10", "entries": [{**NCCL_ENTRY, "pg_id": 1, "collective_seq_id": 7,
                                                        "profiling_name": "gloo:broadcast"}]}).encode()
    both = read_dump(merge_dumps(gloo, nccl))
    assert both is not None and sorted((c.group, c.op) for c in both) == [("0", "all_reduce"), ("1", "broadcast")]


@given(st.binary(max_size=200) | st.none())
def test_a_second_dump_that_is_not_one_leaves_the_first_as_it_was(second: bytes | None) -> None:
    from runner.hangs import merge_dumps

    assert merge_dumps(OFF, second) == OFF or json.loads(merge_dumps(OFF, second))["entries"]
