"""runner.hangs: a flight-recorder dump parsed in bounded time whatever it holds, and the culprit it implies."""

from __future__ import annotations

import json
import re

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from runner.diagnosis.hang import watchdog_failure
from runner.events import TimerExpired
from runner.hangs import (
    C10D_PRINT,
    MAX_CYCLE_CALLS,
    MAX_NAME,
    WIRE_CALLS,
    WIRE_RANKS,
    Answer,
    Call,
    Culprit,
    Finding,
    RankRecord,
    Verdict,
    Waited,
    analyse,
    claims_of,
    from_wire,
    mismatch_words,
    parse_dump,
    rank_list,
    read_dump,
    to_wire,
)
from runner.report.page import hang_lines

NOW = 1_800_000_000 * 10**9


# A verdict's line in words that agree: "rank" with one rank, "ranks" with several, the verb with its subject.
MISAGREED = {
    "'ranks' before one rank": re.compile(r"\branks \d+(?![\d,\-]| \(node [^)]*\)(,| and))"),
    "'rank' before several": re.compile(r"\brank \d+(-\d|, \d)"),
    "'1 ... calls'": re.compile(r"\b1 other calls\b"),
    "'ranks ... was'": re.compile(r"\branks [^;:]*? was\b"),
    "'rank ... were'": re.compile(r"\brank \d+ \([^)]*\) were\b"),
}


def agrees(line: str) -> str:
    """The line itself when its words agree; else what disagrees in it (an assert shows it)."""
    wrong = [name for name, pattern in MISAGREED.items() if pattern.search(line)]
    return f"{line!r}: {', '.join(wrong)}" if wrong else line


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
    assert agrees(verdict.reason()) == verdict.reason()
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
    assert agrees(verdict.reason()) == verdict.reason()


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
    assert agrees(verdict.reason()) == verdict.reason()
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


def test_one_rank_alone_in_a_group_the_others_never_called_is_named_and_in_one_they_called_a_circular_wait():
    """Ranks 0-2 wait in all_reduce #4 of the default group; rank 3 waits alone in broadcast #1 of group 1, which
    no other rank's records show (its first call, as in hang_culprit.py `elsewhere`): the records show rank 3
    waiting for none of them, and it never entered #4: it is named. When group 1 has a past (ranks 2-3 called its
    #1), rank 3 in its #2 waits for rank 2, which waits in #4 for rank 3: a circular wait, nobody is named. (Was:
    rank 3, a waiter; before that, with rank 3 entering first, rank 2.)"""
    crowd = [*calls_up_to(3, last_open=False), entry(4, done=False)]
    first = [*calls_up_to(3, last_open=False), entry(1, pg=1, op="gloo:broadcast", done=False, at=NOW - 20 * 10**9)]
    verdict = analyse([record(0, crowd), record(1, crowd), record(2, crowd), record(3, first)], NOW)
    assert verdict.finding is Finding.NEVER_ENTERED and verdict.culprits == ((3, "a"),)
    assert verdict.waiting == ((0, "a"), (1, "a"), (2, "a")) and verdict.seq == 4 and verdict.group == "0"
    assert verdict.reason().startswith("hang: rank 3 (node a) never entered all_reduce #4 (process group 0) (it is in "
                                       "broadcast #1 (process group 1)); ranks 0-2 waited")
    later = [*first[:-1], {**first[-1], "time_created_ns": NOW - 10**9}]  # entered after the others entered #4
    assert analyse([record(0, crowd), record(1, crowd), record(2, crowd), record(3, later)], NOW).culprits == (
        (3, "a"),)
    past = entry(1, pg=1, op="gloo:broadcast")
    member = [*calls_up_to(3, last_open=False), past, entry(4, done=False)]
    lone = [*calls_up_to(3, last_open=False), past, entry(2, pg=1, op="gloo:broadcast", done=False,
                                                             at=NOW - 20 * 10**9)]
    for at in (NOW - 20 * 10**9, NOW - 200 * 10**9):  # entered after or before the others entered #4
        cycle = analyse([record(0, crowd), record(1, crowd), record(2, member),
                         record(3, [*lone[:-1], {**lone[-1], "time_created_ns": at}])], NOW)
        assert not cycle.named and cycle.finding is Finding.CIRCULAR_WAIT
        assert [w.ranks for w in cycle.cycle] == [((2, "a"),), ((3, "a"),)] and cycle.waiting == tuple((r, "a") for r in range(4))
        assert cycle.reason() == (
            "hang: a circular wait between ranks 2 (node a) and 3 (node a): rank 2 waits in all_reduce #4 (process "
            "group 0), which rank 3 never entered; rank 3 waits in broadcast #2 (process group 1), which rank 2 never "
            "entered; ranks 0-1 wait behind them; which of them skipped a call the records cannot tell")
    two = analyse([record(0, crowd), record(1, crowd), record(2, lone), record(3, lone)], NOW)  # group 1 all in #2
    assert not two.named and two.finding is Finding.UNKNOWN
    assert two.reason() == ("hang: no culprit can be told (ranks read wait in other calls too (ranks 2-3 in broadcast "
                            "#2 (process group 1)): no wait among them ends at a rank read in no call or closes a "
                            "cycle)")


def test_a_chain_of_waits_names_the_rank_at_its_end():
    """Ranks 0-1 wait in all_reduce #4 for rank 2, which waits in group 1's #2 for rank 3, asleep: rank 3."""
    first = [*calls_up_to(3, last_open=False), entry(1, pg=1), entry(4, done=False)]
    chained = [*calls_up_to(3, last_open=False), entry(1, pg=1), entry(2, pg=1, done=False, at=NOW - 200 * 10**9)]
    asleep = [*calls_up_to(3, last_open=False), entry(1, pg=1)]
    verdict = analyse([record(0, first), record(1, first), record(2, chained), record(3, asleep)], NOW)
    assert verdict.finding is Finding.NEVER_ENTERED and verdict.culprits == ((3, "a"),)
    assert verdict.group == "1" and verdict.waiting == ((2, "a"),)


# -- waits across process groups (issue 39, point 6) ----------------------------------------------------------

def grouped(rank_calls: list[tuple[int, int, bool]], *, history: list[int], at: int) -> list[dict[str, object]]:
    """A rank's records: the calls of `history` (process groups, in order: each the group's next number on every
    member) done, then its own `(group, seq, open)` calls entered at `at` s before NOW."""
    seqs: dict[int, int] = {}
    out = []
    for i, pg in enumerate(history):
        seqs[pg] = seqs.get(pg, 0) + 1
        out.append(entry(seqs[pg], pg=pg, op="gloo:broadcast" if pg else "gloo:all_reduce", at=NOW - (500 - i) * 10**9))
    out += [entry(seq, pg=pg, done=not opened, op="gloo:broadcast" if pg else "gloo:all_reduce", at=NOW - at * 10**9)
            for pg, seq, opened in rank_calls]
    return out


def test_two_ranks_waiting_in_each_others_group_are_a_circular_wait_and_nobody_is_named():
    """Process group 0 (the world) and group 1 (both ranks): rank 0 waits in the world's all_reduce #4, rank 1 in
    group 1's broadcast #2. Each waits for the other; their records end each just before the call the other is in,
    so which one skipped its call cannot be told. Was: `unknown`, "every rank read is inside all_reduce #4 ... the
    collective itself is stuck" (rank 1 was not)."""
    history = [0, 0, 0, 1]
    records = [record(0, grouped([(0, 4, True)], history=history, at=9)),
               record(1, grouped([(1, 2, True)], history=history, at=5), "b")]
    verdict = analyse(records, NOW)
    assert not verdict.named
    assert verdict.finding is Finding.CIRCULAR_WAIT
    assert verdict.reason() == (
        "hang: a circular wait between ranks 0 (node a) and 1 (node b): rank 0 waits in all_reduce #4 (process "
        "group 0), which rank 1 never entered; rank 1 waits in broadcast #2 (process group 1), which rank 0 never "
        "entered; which of them skipped a call the records cannot tell")
    assert verdict.waited_s == 9.0 and verdict.waiting == ((0, "a"), (1, "b"))
    assert verdict.to_dict()["cycle"] == [
        {"process_group": "0", "collective_seq": 4, "collective": "all_reduce [[10]]",
         "ranks": [{"rank": 0, "node": "a"}], "never_entered": [1]},
        {"process_group": "1", "collective_seq": 2, "collective": "broadcast [[10]]",
         "ranks": [{"rank": 1, "node": "b"}], "never_entered": [0]}]
    assert verdict.to_dict()["culprits"] == [] and verdict.to_dict()["finding"] == "circular_wait"


def test_a_rank_waiting_alone_while_its_peers_moved_on_to_another_groups_call_is_not_named():
    """The issue's case: rank 0 waits in the world's all_reduce #4; ranks 1-2 moved on to group 1's broadcast #2
    (group 1: all three, as their records show), which rank 0 never reaches. Was: rank 0 named, `never_entered`
    broadcast #2 "(it is in all_reduce #4)": a waiter. Now a circular wait of the three, each rank's call said."""
    history = [0, 1, 0, 0]
    records = [record(0, grouped([(0, 4, True)], history=history, at=9)),
               *(record(r, grouped([(1, 2, True)], history=history, at=5)) for r in (1, 2))]
    verdict = analyse(records, NOW)
    assert not verdict.named, verdict.reason()
    assert verdict.finding is Finding.CIRCULAR_WAIT
    assert verdict.reason().startswith(
        "hang: a circular wait between ranks 0 (node a), 1 (node a) and 2 (node a): rank 0 waits in all_reduce #4 "
        "(process group 0), which ranks 1-2 never entered; ranks 1-2 wait in broadcast #2 (process group 1), which "
        "rank 0 never entered")


def test_a_cycle_over_three_overlapping_groups_and_the_ranks_waiting_behind_it():
    """Groups 1 = {0, 1}, 2 = {1, 2}, 3 = {0, 2}: rank 0 waits in group 1's call for rank 1, rank 1 in group 2's
    for rank 2, rank 2 in group 3's for rank 0. Rank 3 waits in the world's all_reduce #3 behind them all."""
    history = [0, 0, 1, 2, 3]
    mine = {0: [1, 3], 1: [1, 2], 2: [2, 3], 3: []}
    at = {0: (1, 2), 1: (2, 2), 2: (3, 2), 3: (0, 3)}

    def records_of(r: int) -> list[dict[str, object]]:
        return grouped([(*at[r], True)], history=[pg for pg in history if pg == 0 or pg in mine[r]], at=10 + r)

    verdict = analyse([record(r, records_of(r)) for r in range(4)], NOW)
    assert not verdict.named and verdict.finding is Finding.CIRCULAR_WAIT
    assert [w.ranks for w in verdict.cycle] == [((0, "a"),), ((1, "a"),), ((2, "a"),)]
    assert verdict.reason() == (
        "hang: a circular wait between ranks 0 (node a), 1 (node a) and 2 (node a): rank 0 waits in broadcast #2 "
        "(process group 1), which rank 1 never entered; rank 1 waits in broadcast #2 (process group 2), which rank "
        "2 never entered; rank 2 waits in broadcast #2 (process group 3), which rank 0 never entered; rank 3 waits "
        "behind them; which of them skipped a call the records cannot tell")


def test_a_chain_through_another_group_names_its_end_whichever_call_was_entered_first():
    """Groups 2 = {0, 1, 2} and 1 = {2, 3}: ranks 0-1 wait in group 2's #2 for rank 2, which waits in group 1's #2
    for rank 3, asleep (in no call). Rank 2 entered its call after the others entered theirs. Was: rank 2 named,
    alone elsewhere (a waiter)."""
    crowd = grouped([(2, 2, True)], history=[0, 2, 0], at=20)
    middle = grouped([(1, 2, True)], history=[0, 2, 1, 0], at=5)
    asleep = grouped([], history=[0, 1, 0], at=0)
    verdict = analyse([record(0, crowd), record(1, crowd), record(2, middle), record(3, asleep, "b")], NOW)
    assert verdict.culprits == ((3, "b"),), verdict.reason()
    assert verdict.finding is Finding.NEVER_ENTERED and verdict.group == "1" and verdict.waiting == ((2, "a"),)
    assert verdict.reason().startswith("hang: rank 3 (node b) never entered broadcast #2 (process group 1); rank 2")


def test_a_circular_wait_reads_well_in_the_failure_and_the_report_page():
    """No single culprit: the watchdog's rank stays the root cause, the circular wait is the culprit line (the
    console and report.json), report.json's `hang` has each call of the cycle, the report page says where each waits."""
    history = [0, 0, 0, 1]
    verdict = analyse([record(0, grouped([(0, 4, True)], history=history, at=9)),
                       record(1, grouped([(1, 2, True)], history=history, at=5), "b")], NOW)
    expired = TimerExpired(local_rank=0, rank=0, pid=1, scope="heartbeat", overdue_s=1.0,
                           reason="watchdog: rank 0 sent no heartbeat for 4.0 s", culprit=Culprit(verdict, {}, 0.1))
    failure = watchdog_failure(expired, 0, local_ranks={0: 0}, log_dir="/logs/0", recorder=True,
                               rank_dir=lambda local: f"/logs/{local}")
    assert failure.reason == "watchdog: rank 0 sent no heartbeat for 4.0 s" and failure.rank == 0
    assert "  culprit: hang: a circular wait between ranks 0 (node a) and 1 (node b): rank 0 waits in all_reduce #4" in (
        failure.report())
    hang = json.loads(json.dumps(failure.to_dict()))["hang"]
    assert hang["finding"] == "circular_wait" and hang["culprits"] == [] and len(hang["cycle"]) == 2
    lines = hang_lines(hang)
    assert '<div class="hang">finding: circular_wait</div>' in lines
    assert ('<div class="hang">circular wait: rank 0 (node a) in all_reduce [[10]] #4 (process group 0); rank 1 '
            '(node b) in broadcast [[10]] #2 (process group 1)</div>') in lines
    assert not any("collective:" in line or "culprit:" in line for line in lines)


def test_a_long_circular_wait_stays_one_short_line():
    """4096 ranks on each side, interleaved: the line counts the ranks instead of listing them."""
    history = [0, 1]
    records = [record(r, grouped([(r % 2, 2, True)], history=history, at=5), f"n{r // 8}") for r in range(8192)]
    verdict = analyse(records, NOW)
    assert verdict.finding is Finding.CIRCULAR_WAIT and len(verdict.cycle) == 2
    assert verdict.reason().startswith(
        "hang: a circular wait among 8192 ranks on 1024 node(s): ranks 0, 2, 4, 6, 8, 10, 12, 14, ... (4096 ranks) "
        "wait in all_reduce #2 (process group 0), which ranks 1, 3, 5")
    assert len(verdict.reason()) < 500


# -- the oracle across process groups: subgroups, overlapping groups ------------------------------------------

@st.composite
def across_groups(draw: st.DrawFn) -> tuple[list[set[int]], list[int], dict[int, int | None], list[int]]:
    """n ranks; group 0 is the world, groups 1-3 any sets of two ranks or more (subgroups, overlapping, equal);
    a past in which every group called at least once (so the records show its members), in any order; then each
    rank is asleep (None: in no call) or waits in the next call of one of its groups, entered in any order. No call
    has every member of its group in it (such a call would complete)."""
    n = draw(st.integers(2, 8))
    groups = [set(range(n)), *draw(st.lists(st.sets(st.integers(0, n - 1), min_size=2), min_size=1, max_size=3))]
    past = [*draw(st.permutations(range(len(groups)))), *draw(st.lists(st.integers(0, len(groups) - 1), max_size=6))]
    where = {r: draw(st.sampled_from([None, *(g for g, members in enumerate(groups) if r in members)]))
             for r in range(n)}
    assume(any(g is not None for g in where.values()))
    assume(all(any(where[m] != g for m in groups[g]) for g in set(where.values()) if g is not None))
    return groups, past, where, draw(st.permutations(range(n)))


def oracle(groups: list[set[int]], where: dict[int, int | None]) -> tuple[dict[int, set[int]], set[int], set[int]]:
    """The true wait-for graph (each rank that waits waits for every member of its call's group not in it), the
    ranks asleep that a rank waits for, and the ranks on a cycle of waits."""
    edges = {r: {q for q in groups[g] if q != r and where[q] != g} for r, g in where.items() if g is not None}
    sinks = {q for qs in edges.values() for q in qs if where[q] is None}

    def reaches_itself(r: int) -> bool:
        seen, todo = set(), list(edges[r])
        while todo:
            q = todo.pop()
            if q == r:
                return True
            if q not in seen and q in edges:
                seen.add(q)
                todo.extend(edges[q])
        return False

    return edges, sinks, {r for r in edges if reaches_itself(r)}


@settings(max_examples=500, deadline=None)
@given(across_groups(), st.data())
def test_across_process_groups_no_waiter_is_named_and_a_circular_wait_is_said_exactly_when_there_is_one(
        scenario, data):
    """The verdict against the oracle's wait-for graph: a rank named is never one that waits in a call (it is one
    in no call that a waiter waits for); when such a rank exists, it is named (never_entered); otherwise the waits
    close a cycle, and the finding is circular_wait, naming nobody, with exactly the ranks on cycles, each with the
    call it waits in and the ranks of the cycle it waits for there."""
    groups, past, where, order = scenario
    nodes = data.draw(st.lists(st.sampled_from(["a", "b"]), min_size=len(where), max_size=len(where)))
    records = []
    for r, g in where.items():
        seqs = [0] * len(groups)
        entries = []
        for i, pg in enumerate(past):
            seqs[pg] += 1
            if r in groups[pg]:
                entries.append(entry(seqs[pg], pg=pg, at=NOW - (1000 - i) * 10**9))
        if g is not None:
            entries.append(entry(seqs[g] + 1, pg=g, done=False, at=NOW - (10 + order[r]) * 10**9))
        records.append(record(r, entries, nodes[r]))
    verdict = analyse(records, NOW)
    edges, sinks, cycle = oracle(groups, where)
    named = {r for r, _ in verdict.culprits}
    assert not named & set(edges), (verdict.reason(), where, groups)
    assert named <= sinks, (verdict.reason(), where, groups)
    assert (verdict.finding is Finding.CIRCULAR_WAIT) == (bool(cycle) and not sinks), (verdict.reason(), where, groups)
    if sinks:
        assert verdict.finding is Finding.NEVER_ENTERED and named, (verdict.reason(), where, groups)
    else:
        assert not named and {r for w in verdict.cycle for r, _ in w.ranks} == cycle, (verdict.reason(), where)
        for w in verdict.cycle:
            for r, node in w.ranks:
                assert (w.call.group, node) == (str(where[r]), nodes[r])
                assert set(w.never) == edges[r] & cycle
            assert f"{w.call.op} #{w.call.seq} (process group {w.call.group})" in verdict.reason()
        assert verdict.reason().startswith("hang: a circular wait ")
        # the longest waiter dates the hang, be it on the cycle or waiting behind it
        assert verdict.waited_s == max(10 + order[r] for r, g in where.items() if g is not None)
    assert agrees(verdict.reason()) == verdict.reason()
    json.dumps(verdict.to_dict())


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=600) | st.builds(lambda a, b, c: C10D.format(me=a, mine=b, other=a + 1, theirs=c),
                                          st.integers(0, 10**6), st.text("0123456789, ", max_size=12),
                                          st.text("0123456789, ", max_size=12)))
def test_any_error_text_shortens_and_parses_without_raising(text):
    """A worker's error line, shortened to travel (bounded) and read back as c10d's claims: never raises, and each
    claim is one of the text's own fingerprints (any text may hold one: `OpType=A` is read as op `a`)."""
    words = mismatch_words(text)
    assert len(words) <= 300 or words.startswith("c10d: ")
    ops = {m[2].lower() for m in C10D_PRINT.findall(text[:4000])}
    for rank, call in claims_of(words).items():
        assert rank >= 0 and call.op in ops
    if text.startswith("RuntimeError: Detected mismatch"):  # c10d's own words (the second strategy)
        assert {call.op for call in claims_of(words).values()} == {"allgather"}


def test_a_fingerprint_in_any_text_is_read_with_its_own_op() -> None:
    """Hypothesis found it: a fingerprint with `OpType=A` in a line of no c10d error is read as op `a`, not dropped."""
    text = "Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=3, OpType=A, TensorShape=[,]"
    assert {r: (c.op, c.seq) for r, c in claims_of(mismatch_words(text)).items()} == {1: ("a", 3)}


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


# ---------------------------------------------------------------------------------------- the wire (etcd's copy)

NAMES = st.text(max_size=MAX_NAME)
CALLS = st.builds(Call, group=NAMES, seq=st.integers(0, 2**40), op=NAMES.filter(lambda s: ":" not in s),
                  sizes=st.lists(st.lists(st.integers(0, 2**20), max_size=4).map(tuple), max_size=4).map(tuple),
                  done=st.booleans(), created_ns=st.integers(0, 2**62))
RECORDS = st.builds(RankRecord, rank=st.integers(0, 2**20), node=NAMES, answer=st.sampled_from(Answer),
                    calls=st.lists(CALLS, max_size=WIRE_CALLS).map(tuple), detail=st.text(max_size=300))
WIRE_JUNK = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=6),
    max_leaves=40,
)


@settings(deadline=None)  # up to 5 x 64 calls through JSON: no deadline on a loaded machine
@given(st.lists(RECORDS, max_size=5))
def test_hang_records_round_trip_through_their_wire_form(records: list[RankRecord]) -> None:
    """What a node publishes of its ranks' records (to_wire, JSON through etcd) reads back the same (from_wire)."""
    assert from_wire(json.loads(json.dumps(to_wire(records)))) == records


@settings(deadline=None)
@given(WIRE_JUNK | st.lists(st.fixed_dictionaries({"rank": WIRE_JUNK, "node": WIRE_JUNK, "answer": WIRE_JUNK,
                                                      "calls": st.lists(st.lists(WIRE_JUNK, max_size=7))}), max_size=4))
def test_any_value_read_as_hang_records_gives_bounded_records_or_none(value: object) -> None:
    """Another node's answer is input: any JSON value gives records within the bounds (never raises)."""
    records = from_wire(value)
    assert len(records) <= WIRE_RANKS
    for r in records:
        assert isinstance(r.rank, int) and not isinstance(r.rank, bool) and len(r.node) <= MAX_NAME
        assert len(r.calls) <= WIRE_CALLS and len(r.detail) <= 300
        assert all(len(c.op) <= MAX_NAME and len(c.group) <= MAX_NAME for c in r.calls)


def test_wire_bounds_keep_the_last_calls_and_the_first_ranks() -> None:
    """A rank's last WIRE_CALLS calls are kept (the divergence is at the end), and a node's first WIRE_RANKS ranks."""
    calls = tuple(Call("0", i, "all_reduce", ((1,),), done=True, created_ns=i) for i in range(WIRE_CALLS + 5))
    records = [RankRecord(r, "n0", Answer.ANSWERED, calls, "x" * 400) for r in range(WIRE_RANKS + 2)]
    wire = to_wire(records)
    back = from_wire(wire)
    assert [r.rank for r in back] == list(range(WIRE_RANKS))
    assert [c.seq for c in back[0].calls] == list(range(5, WIRE_CALLS + 5))
    assert back[0].detail == "x" * 300
    # a longer answer than to_wire makes (another node's, or a stranger's) is bounded the same way when read
    wire[0]["calls"] = [[c.group, c.seq, c.op, [list(x) for x in c.sizes], c.done, c.created_ns] for c in calls]  # type: ignore[index]
    wire[0]["detail"] = "y" * 400  # type: ignore[index]
    longer = from_wire(wire + wire[:5])
    assert [c.seq for c in longer[0].calls] == list(range(5, WIRE_CALLS + 5)) and longer[0].detail == "y" * 300
    assert len(longer) == WIRE_RANKS


def test_every_verdict_line_says_rank_or_ranks_and_was_or_were_as_its_ranks_count():
    """The lines a few ranks make, each where its words once disagreed ("ranks 1-2 (node a) was in no collective",
    "ranks 2 could not be read", "(rank 1-2)", "1 other calls"); the checker itself catches each old slip."""
    away = Verdict(Finding.AWAY, ((1, "a"), (2, "a")), waiting=((0, "a"),), odd="all_reduce #3", missing=(3,))
    assert "ranks 1-2 (node a) were in no collective" in away.reason() and "(rank 3 not read)" in away.reason()
    alone = Verdict(Finding.AWAY, ((1, "a"),), waiting=((0, "a"),), odd="all_reduce #3", missing=(2, 3))
    assert "rank 1 (node a) was in no collective" in alone.reason() and "(ranks 2-3 not read)" in alone.reason()
    unread = Verdict(Finding.UNKNOWN, (), group="0", seq=4, op="all_reduce [[10]]", missing=(2,))
    assert "; rank 2 could not be read, so" in unread.reason()
    tie = analyse([died(0), record(1, gathered(10)), record(2, gathered(10)), record(3, gathered(20)),
                   record(4, gathered(20))], NOW)  # two against two, rank 0's words place it nowhere
    assert "all_gather [[10]] (ranks 1-2); all_gather [[20]] (ranks 3-4)" in tie.reason()
    call = Call(group="0", seq=2, op="all_reduce", sizes=((10,),), done=False, created_ns=NOW)
    cycle = tuple(Waited(call, ((r, "a"),), (r + 1,)) for r in range(MAX_CYCLE_CALLS + 1))
    long = Verdict(Finding.CIRCULAR_WAIT, (), cycle=cycle)
    assert "; 1 other call; which" in long.reason()
    for line in (away.reason(), alone.reason(), unread.reason(), tie.reason(), long.reason()):
        assert agrees(line) == line
    for slip in ("hang: ranks 1-2 (node a) was in no collective", "ranks 2 could not be read", "x (rank 1-2)",
                 "; 1 other calls", "hang: rank 1 (node a) were in no collective"):
        assert agrees(slip) != slip, slip
