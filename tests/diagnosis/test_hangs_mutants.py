"""runner/hangs.py: the cases mutation testing found untested (bench/mutation.sh, docs/testing.md "Mutation score").

Each test pins what a user reads or a caller relies on: a verdict's finding, culprits and waiting ranks, its one
line (the exact words where the words are the point), report.json's `hang` object, a dump or an error line read
back. A mutant that changed them passed every other unit test.
"""

from __future__ import annotations

import json

import pytest
from test_hangs import C10D, GLOO_SHORT, NOW, calls_up_to, died, entry, gathered, record

from runner.hangs import (
    MAX_WAITED_IN,
    Answer,
    Call,
    Culprit,
    Finding,
    RankRecord,
    Verdict,
    WaitGraph,
    analyse,
    call_of,
    claims_of,
    components,
    died_line,
    from_wire,
    merge_dumps,
    mismatch_words,
    numel,
    ranks_on_nodes,
    read_dump,
    smaller_than_sent,
    some_ranks,
    to_wire,
    waited_line,
)

S = 10**9  # one second, in nanoseconds
COMMON = calls_up_to(3, last_open=False)  # all_reduce #1-3 of group 0, done
IN_4 = [*COMMON, entry(4, done=False)]  # then waits in all_reduce #4


def waits(at_s: float, *, op: str = "gloo:all_reduce", sizes: object = ((10,),)) -> list[dict[str, object]]:
    """#1-3 done, then waiting in #4, entered `at_s` seconds before NOW."""
    return [*COMMON, entry(4, done=False, op=op, sizes=sizes, at=NOW - int(at_s * S))]


# -- the one line of each finding ---------------------------------------------------------------------------------


def test_a_stopped_or_silent_culprit_says_who_waited_how_long_where() -> None:
    """The line goes on with the waiters, the time they waited and the call (kills Verdict.reason's `waited`)."""
    waiting = record(0, waits(96))
    stopped = analyse([waiting, RankRecord(1, "b", Answer.STOPPED)], NOW)
    assert stopped.reason() == ("hang: rank 1 (node b) is stopped (SIGSTOP or SIGTSTP: process state T); rank 0 "
                                "waited 96.0 s in all_reduce #4 (process group 0)")
    silent = analyse([waiting, RankRecord(1, "b", Answer.SILENT)], NOW)
    assert silent.reason() == ("hang: rank 1 (node b) did not answer the flight-recorder query; rank 0 waited 96.0 s "
                               "in all_reduce #4 (process group 0)")


def test_a_stopped_rank_while_nobody_is_in_a_call_is_named_with_the_ranks_that_gave_up() -> None:
    """No rank read is in a call: the stopped rank is named alone on its line; the ranks that timed out wait."""
    verdict = analyse([record(0, COMMON), RankRecord(1, "b", Answer.STOPPED), RankRecord(2, "c", Answer.TIMED_OUT)],
                      NOW)
    assert verdict.finding is Finding.STOPPED and verdict.culprits == ((1, "b"),)
    assert verdict.waiting == ((2, "c"),)
    assert verdict.reason() == "hang: rank 1 (node b) is stopped (SIGSTOP or SIGTSTP: process state T)"


@pytest.mark.parametrize(("finding", "line"), [
    (Finding.STOPPED, "hang: rank 1 (node b) is stopped (SIGSTOP or SIGTSTP: process state T)"),
    (Finding.SILENT, "hang: rank 1 (node b) did not answer the flight-recorder query"),
])
def test_a_verdict_placed_at_no_call_says_no_call(finding: Finding, line: str) -> None:
    assert Verdict(finding, ((1, "b"),)).reason() == line


def test_never_entered_says_how_long_the_others_waited_in_it() -> None:
    verdict = analyse([record(0, waits(7.04)), record(1, waits(3)), record(2, COMMON, "b")], NOW)
    assert verdict.reason() == ("hang: rank 2 (node b) never entered all_reduce #4 (process group 0); ranks 0-1 "
                                "waited 7.0 s in it")


def test_a_call_entered_under_a_second_ago_is_dated_as_such() -> None:
    """A waiter that entered 0.25 s before the analysis waited 0.25 s (not rounded up to 1 s)."""
    verdict = analyse([record(0, waits(0.25)), record(1, COMMON)], NOW)
    assert verdict.waited_s == pytest.approx(0.25)
    assert verdict.reason().endswith("; rank 0 waited 0.2 s in it")


def test_a_call_with_no_creation_time_is_not_dated() -> None:
    """The dump says not when the call was entered: how long it was waited in is unknown, not NOW's age."""
    undated = [*COMMON, {k: v for k, v in entry(4, done=False).items() if k != "time_created_ns"}]
    verdict = analyse([record(0, undated), record(1, COMMON)], NOW)
    assert verdict.culprits == ((1, "a"),) and verdict.waited_s is None
    assert verdict.reason() == ("hang: rank 1 (node a) never entered all_reduce #4 (process group 0); rank 0 waited "
                                "in it")
    assert verdict.to_dict()["waited_s"] is None


def test_a_mismatch_in_the_records_is_a_hang_not_a_death() -> None:
    """No rank died: the line starts `hang: mismatched collective` and has no `died of it` tail."""
    verdict = analyse([record(0, waits(96, op="gloo:all_gather")), record(1, IN_4), record(2, IN_4, "b")], NOW)
    assert verdict.culprits == ((0, "a"),) and verdict.waiting == ((1, "a"), (2, "b"))
    assert verdict.reason() == ("hang: mismatched collective #4 (process group 0): rank 0 (node a) called all_gather "
                                "[[10]] while ranks 1 (node a), 2 (node b) called all_reduce [[10]]")


def test_a_mismatch_without_a_majority_says_each_side_with_its_ranks() -> None:
    verdict = analyse([record(0, IN_4), record(1, waits(96, op="gloo:all_gather"))], NOW)
    assert verdict.culprits == ((0, "a"), (1, "a")) and not verdict.waiting
    assert verdict.reason() == ("hang: mismatched collective #4 (process group 0): ranks 0-1 (node a) disagree: "
                                "all_reduce [[10]] (rank 0); all_gather [[10]] (rank 1)")
    assert verdict.to_dict()["collective"] == ""  # no side is the right one


def test_a_mismatch_with_several_odd_calls_says_each() -> None:
    odd = [record(3, waits(96, op="gloo:all_gather")), record(4, waits(96, op="gloo:broadcast"))]
    verdict = analyse([record(0, IN_4), record(1, IN_4), record(2, IN_4), *odd], NOW)
    assert verdict.culprits == ((3, "a"), (4, "a"))
    assert verdict.reason() == ("hang: mismatched collective #4 (process group 0): ranks 3-4 (node a) called "
                                "all_gather [[10]]; broadcast [[10]] while ranks 0-2 (node a) called all_reduce [[10]]")


def test_after_a_timeout_several_ranks_in_no_call_each_say_their_last_call() -> None:
    verdict = analyse([RankRecord(0, "a", Answer.TIMED_OUT), record(1, COMMON), record(2, COMMON)], NOW)
    assert verdict.finding is Finding.AWAY and verdict.culprits == ((1, "a"), (2, "a"))
    assert verdict.odd == "rank 1: all_reduce [[10]] #3; rank 2: all_reduce [[10]] #3"
    assert ("(last call: rank 1: all_reduce [[10]] #3; rank 2: all_reduce [[10]] #3) while rank 0 (node a) timed "
            "out waiting in one") in verdict.reason()


def test_after_a_timeout_a_rank_with_no_call_yet_says_so_and_one_rank_unread_is_said_singular() -> None:
    fresh = analyse([RankRecord(0, "a", Answer.TIMED_OUT), RankRecord(1, "b", Answer.ANSWERED)], NOW)
    assert fresh.finding is Finding.AWAY and fresh.culprits == ((1, "b"),)
    assert fresh.reason() == ("hang: rank 1 (node b) was in no collective (last call: none yet) while rank 0 (node a) "
                              "timed out waiting in one")
    unread = analyse([RankRecord(0, "a", Answer.TIMED_OUT), record(1, COMMON), RankRecord(2, "a", Answer.EXITED)], NOW)
    assert unread.reason() == ("hang: rank 1 (node a) was in no collective (last call: all_reduce [[10]] #3) while "
                               "rank 0 (node a) timed out waiting in one (rank 2 not read)")


def test_after_a_timeout_with_no_rank_read_nobody_is_named_and_the_line_says_why() -> None:
    verdict = analyse([RankRecord(0, "a", Answer.TIMED_OUT), RankRecord(1, "b", Answer.EXITED)], NOW)
    assert verdict.finding is Finding.UNKNOWN and not verdict.named
    assert verdict.reason() == ("hang: no culprit can be told (rank 0 (node a) timed out waiting in a collective, and "
                                "no other rank's records could be read)")


def test_every_rank_read_inside_one_call_with_a_rank_unread_says_that_rank() -> None:
    inside = [record(0, IN_4), record(1, IN_4), RankRecord(2, "a", Answer.EXITED)]
    verdict = analyse(inside, NOW)
    assert verdict.finding is Finding.UNKNOWN and verdict.missing == (2,)
    assert verdict.reason().startswith("hang: every rank read is inside all_reduce #4 (process group 0); ")
    assert verdict.reason().endswith("2 could not be read, so which rank holds it up cannot be told")


@pytest.mark.parametrize(("records", "off"), [
    ([RankRecord(0, "a", Answer.NO_RECORDER), RankRecord(1, "a", Answer.NO_RECORDER)], False),  # nothing read
    ([record(0, COMMON), RankRecord(1, "a", Answer.RECORDER_OFF)], False),  # one rank read: it has records
    ([RankRecord(0, "a", Answer.RECORDER_OFF), RankRecord(1, "a", Answer.NO_RECORDER)], True),
])
def test_the_recorder_is_said_off_only_when_no_rank_had_records_and_one_answered_without(
        records: list[RankRecord], off: bool) -> None:
    line = analyse(records, NOW).reason()
    said = ("hang: no records: the flight recorder is off in the workers (their dumps have no entries: "
            "TORCH_FR_BUFFER_SIZE or TORCH_NCCL_TRACE_BUFFER_SIZE is 0 in their environment)")
    assert (line == said) is off
    if not off:
        assert line == "hang: no rank was waiting in a collective: the hang is outside collectives (see the stacks)"


# -- report.json's `hang` ---------------------------------------------------------------------------------------


def test_the_hang_object_has_every_field_under_its_name() -> None:
    """report.json's `hang` of a never_entered verdict, field by field; waited_s rounded to the millisecond."""
    verdict = analyse([record(0, waits(1.2345678)), record(1, waits(1)), RankRecord(2, "b", Answer.EXITED),
                       record(3, COMMON, "b")], NOW)
    assert verdict.to_dict() == {
        "finding": "never_entered",
        "culprits": [{"rank": 3, "node": "b"}],
        "waiting": [{"rank": 0, "node": "a"}, {"rank": 1, "node": "a"}],
        "process_group": "0",
        "collective_seq": 4,
        "collective": "all_reduce [[10]]",
        "odd_call": "",
        "waited_s": 1.235,
        "ranks_read": 3,
        "ranks_unread": [2],
        "died": [],
        "cycle": [],
        "reason": "hang: rank 3 (node b) never entered all_reduce #4 (process group 0); ranks 0-1 waited 1.2 s in it",
    }


def test_the_hang_object_of_a_mismatch_that_killed_a_rank_names_the_dead_and_the_odd_call() -> None:
    verdict = analyse([record(0, gathered(10)), record(1, gathered(10), "b"), died(2, GLOO_SHORT)], NOW)
    hang = verdict.to_dict()
    assert hang["died"] == [{"rank": 2, "node": "a"}]
    assert hang["culprits"] == [{"rank": 2, "node": "a"}]
    assert hang["waiting"] == [{"rank": 0, "node": "a"}, {"rank": 1, "node": "b"}]
    assert hang["odd_call"] == "a smaller all_gather (it received 40 bytes where its own call expected 20)"
    assert hang["collective"] == "all_gather [[10]]" and hang["process_group"] == "0" and hang["collective_seq"] == 4


# -- circular waits: the line, and how long ---------------------------------------------------------------------


def ring(n: int, nodes: str = "", at: dict[int, float | None] | None = None) -> list[RankRecord]:
    """n ranks in a ring of process groups: group i+1 = ranks i and i+1 (mod n), each called once by both; rank i
    then waits in its group i+1's #2, which rank i+1 never entered (it waits in its own): a cycle through them all.
    Rank i entered its call `at[i]` seconds before NOW (default 10 + i; None: no creation time in its dump)."""
    out = []
    for i in range(n):
        mine, before = i + 1, (i - 1) % n + 1
        waiting = entry(2, pg=mine, op="gloo:broadcast", done=False)
        when = (at or {}).get(i, 10 + i)
        if when is None:
            del waiting["time_created_ns"]
        else:
            waiting["time_created_ns"] = NOW - int(when * S)
        out.append(record(i, [entry(1, pg=before, op="gloo:broadcast", at=NOW - 500 * S),
                              entry(1, pg=mine, op="gloo:broadcast", at=NOW - 400 * S), waiting],
                          nodes[i] if nodes else "a"))
    return out


def ring_part(i: int, n: int) -> str:
    return f"rank {i} waits in broadcast #2 (process group {i + 1}), which rank {(i + 1) % n} never entered"


@pytest.mark.parametrize(("n", "nodes", "between"), [
    (3, "abc", "between ranks 0 (node a), 1 (node b) and 2 (node c)"),
    (4, "abcd", "between ranks 0 (node a), 1 (node b), 2 (node c) and 3 (node d)"),
    (5, "aabbc", "among 5 ranks on 3 node(s)"),
])
def test_a_circular_wait_names_up_to_four_ranks_with_their_nodes_and_counts_more(n: int, nodes: str,
                                                                                  between: str) -> None:
    verdict = analyse(ring(n, nodes), NOW)
    assert verdict.finding is Finding.CIRCULAR_WAIT and not verdict.named
    assert verdict.reason() == (f"hang: a circular wait {between}: {'; '.join(ring_part(i, n) for i in range(n))}; "
                                "which of them skipped a call the records cannot tell")


def test_a_circular_wait_says_eight_calls_and_counts_the_others() -> None:
    eight, nine, ten = (analyse(ring(n), NOW).reason() for n in (8, 9, 10))
    said = "which of them skipped a call the records cannot tell"
    parts = {n: "; ".join(ring_part(i, n) for i in range(8)) for n in (8, 9, 10)}
    assert eight == f"hang: a circular wait among 8 ranks on 1 node(s): {parts[8]}; {said}"
    assert nine.startswith(f"hang: a circular wait among 9 ranks on 1 node(s): {parts[9]}; 1 other call; ")
    assert nine.endswith(f"; {said}")
    # more than one: "calls" (the mutation run of stop 47 found the plural untested)
    assert ten.startswith(f"hang: a circular wait among 10 ranks on 1 node(s): {parts[10]}; 2 other calls; ")


def test_a_circular_wait_is_dated_by_its_dated_calls() -> None:
    """Rank 0's dump has no creation time (it is the call a hang is placed at: undated counts as oldest); rank 1
    entered its call 0.5 s ago: the cycle has been waited in 0.5 s, not unknown, not a second."""
    verdict = analyse(ring(2, at={0: None, 1: 0.5}), NOW)
    assert verdict.finding is Finding.CIRCULAR_WAIT and verdict.seq == 2 and verdict.group == "1"
    assert verdict.waited_s == pytest.approx(0.5)


def test_a_circular_wait_with_no_dated_call_is_not_dated() -> None:
    verdict = analyse(ring(2, at={0: None, 1: None}), NOW)
    assert verdict.finding is Finding.CIRCULAR_WAIT and verdict.waited_s is None
    assert verdict.to_dict()["waited_s"] is None


# -- waits in other calls: what the note says -------------------------------------------------------------------


def alone_each(n: int) -> list[RankRecord]:
    """n ranks, each waiting in the first call of a process group of its own (rank i in group i+1; rank 0 first)."""
    return [record(i, [entry(1, pg=i + 1, done=False, at=NOW - (1000 - i) * S)]) for i in range(n)]


def others(n: int) -> str:
    return "; ".join(f"rank {i} in all_reduce #1 (process group {i + 1})" for i in range(1, n))


@pytest.mark.parametrize(("n", "said"), [
    (3, f"({others(3)})"),
    (9, f"({others(9)})"),  # 8 other calls: each said
    (10, f"({others(9)}, ...)"),  # 9: the first 8
])
def test_ranks_waiting_in_other_calls_are_said_up_to_eight_calls(n: int, said: str) -> None:
    verdict = analyse(alone_each(n), NOW)
    assert verdict.finding is Finding.UNKNOWN and verdict.apart and not verdict.named
    assert verdict.reason() == (f"hang: no culprit can be told (ranks read wait in other calls too {said}: no wait "
                                "among them ends at a rank read in no call or closes a cycle)")


def test_waits_in_more_than_the_bound_of_calls_are_not_followed() -> None:
    """MAX_WAITED_IN calls waited in are followed; one more, and the line says so (bounded work)."""
    assert WaitGraph.of(alone_each(MAX_WAITED_IN)) is not None
    assert analyse(alone_each(MAX_WAITED_IN), NOW).reason().startswith(
        "hang: no culprit can be told (ranks read wait in other calls too (rank 1 in all_reduce #1 (process group 2);")
    assert WaitGraph.of(alone_each(MAX_WAITED_IN + 1)) is None
    verdict = analyse(alone_each(MAX_WAITED_IN + 1), NOW)
    assert verdict.finding is Finding.UNKNOWN and verdict.apart
    assert verdict.reason() == "hang: no culprit can be told (ranks read wait in more than 256 different calls)"


# -- one rank alone elsewhere --------------------------------------------------------------------------------------


def test_a_rank_alone_elsewhere_is_named_whatever_the_groups_are_called() -> None:
    """The crowd waits in group 5's #4, rank 3 alone in group 1's first call (a group name that sorts first)."""
    crowd = [*(entry(i, pg=5, at=NOW - (100 - i) * S) for i in (1, 2, 3)), entry(4, pg=5, done=False, at=NOW - 50 * S)]
    lone = [*(entry(i, pg=5, at=NOW - (100 - i) * S) for i in (1, 2, 3)),
            entry(1, pg=1, op="gloo:broadcast", done=False, at=NOW - 20 * S)]
    verdict = analyse([record(0, crowd), record(1, crowd), record(2, crowd), record(3, lone)], NOW)
    assert verdict.finding is Finding.NEVER_ENTERED and verdict.culprits == ((3, "a"),)
    assert verdict.reason() == ("hang: rank 3 (node a) never entered all_reduce #4 (process group 5) (it is in "
                                "broadcast #1 (process group 1)); ranks 0-2 waited 50.0 s in it")


ELSEWHERE = [*COMMON, entry(1, pg=1, op="gloo:broadcast", done=False, at=NOW - 20 * S)]


def test_two_ranks_suffice_as_the_crowd_but_one_does_not() -> None:
    """Two ranks wait in #4 and one alone elsewhere: it is named. One in #4 and one elsewhere: which of the two
    skipped a call cannot be told."""
    crowd = waits(50)
    two = analyse([record(0, crowd), record(1, crowd), record(2, ELSEWHERE)], NOW)
    assert two.finding is Finding.NEVER_ENTERED and two.culprits == ((2, "a"),) and two.waiting == ((0, "a"), (1, "a"))
    one = analyse([record(0, crowd), record(1, ELSEWHERE)], NOW)
    assert one.finding is Finding.UNKNOWN and not one.named
    assert one.reason() == ("hang: no culprit can be told (ranks read wait in other calls too (rank 1 in broadcast #1 "
                            "(process group 1)): no wait among them ends at a rank read in no call or closes a cycle)")


def test_a_rank_elsewhere_that_is_in_the_crowds_call_too_is_not_named() -> None:
    """Rank 3 entered broadcast #1 first, then all_reduce #4 too (both open): it waits with the others."""
    both = [*COMMON, entry(1, pg=1, op="gloo:broadcast", done=False, at=NOW - 60 * S),
            entry(4, done=False, at=NOW - 10 * S)]
    crowd = waits(50)
    verdict = analyse([record(0, crowd), record(1, crowd), record(2, crowd), record(3, both)], NOW)
    assert verdict.finding is Finding.UNKNOWN and not verdict.named


# -- after a timeout, the ranks behind ------------------------------------------------------------------------------


def test_after_a_timeout_the_ranks_behind_are_sought_at_the_call_entered_last() -> None:
    """Rank 3 never entered all_reduce #2 (50 s ago), rank 2 never entered broadcast #2 of group 1 (10 s ago): the
    later call is the one the job hung in."""
    def calls(*extra: dict[str, object]) -> list[dict[str, object]]:
        return [entry(1, at=NOW - 100 * S), entry(1, pg=1, op="gloo:broadcast", at=NOW - 90 * S), *extra]

    world, sub = entry(2, at=NOW - 50 * S), entry(2, pg=1, op="gloo:broadcast", at=NOW - 10 * S)
    verdict = analyse([RankRecord(0, "a", Answer.TIMED_OUT), record(1, calls(world, sub)), record(2, calls(world)),
                       record(3, calls(sub))], NOW)
    assert verdict.finding is Finding.NEVER_ENTERED and verdict.culprits == ((2, "a"),)
    assert verdict.waiting == ((0, "a"), (1, "a"), (3, "a"))
    assert verdict.reason() == ("hang: rank 2 (node a) never entered broadcast #2 (process group 1); ranks 0-1, 3 "
                                "waited in it")


def test_after_a_timeout_the_call_behind_says_its_group_and_op() -> None:
    done = [entry(i) for i in range(1, 5)]
    verdict = analyse([RankRecord(0, "a", Answer.TIMED_OUT), record(1, done), record(2, done), record(3, COMMON)], NOW)
    assert (verdict.group, verdict.seq, verdict.op) == ("0", 4, "all_reduce [[10]]")
    assert verdict.reason() == ("hang: rank 3 (node a) never entered all_reduce #4 (process group 0); ranks 0-2 "
                                "waited in it")


def test_after_a_timeout_the_call_behind_is_said_as_the_lowest_rank_read_entered_it() -> None:
    """Ranks 1 and 2 entered #4 at the same instant with different sizes: the verdict says rank 1's, whichever
    order the records come in."""
    mine, theirs = [*COMMON, entry(4, at=NOW - 5 * S)], [*COMMON, entry(4, sizes=((20,),), at=NOW - 5 * S)]
    verdict = analyse([RankRecord(0, "a", Answer.TIMED_OUT), record(1, mine), record(2, theirs), record(3, COMMON)],
                      NOW)
    assert verdict.culprits == ((3, "a"),) and verdict.op == "all_reduce [[10]]"


# -- a rank that did not answer, and who takes part in a group -------------------------------------------------------


def test_a_silent_rank_is_not_named_while_a_rank_read_waits_in_another_groups_call() -> None:
    """Rank 1 waits in group 1's #4 (the same number as the others' #4 of group 0): not every rank read waits in
    the stuck call, so the rank that did not answer is not the only thing holding it up."""
    other = [*COMMON, entry(4, pg=1, op="gloo:broadcast", done=False, at=NOW - 10 * S)]
    verdict = analyse([record(0, waits(50)), record(1, other), RankRecord(2, "a", Answer.SILENT)], NOW)
    assert verdict.finding is Finding.UNKNOWN and not verdict.named


@pytest.mark.parametrize(("group", "third", "named"), [
    (0, RankRecord(2, "a", Answer.ANSWERED), True),  # no call yet: of the default group
    (1, RankRecord(2, "a", Answer.ANSWERED), False),  # no call yet: of no other group
    (0, record(2, [entry(1, pg=5)]), False),  # calls of group 5 only: not shown to be of group 0
    (5, record(2, [entry(1, pg=5)]), True),
])
def test_a_rank_in_no_call_is_named_only_if_its_records_show_it_in_the_group(group: int, third: RankRecord,
                                                                           named: bool) -> None:
    crowd = [entry(1, pg=group, at=NOW - 20 * S), entry(2, pg=group, done=False, at=NOW - 10 * S)]
    verdict = analyse([record(0, crowd), record(1, crowd), third], NOW)
    assert verdict.culprits == (((2, "a"),) if named else ())
    assert verdict.finding is (Finding.NEVER_ENTERED if named else Finding.UNKNOWN)


def test_a_call_recorded_twice_counts_as_open() -> None:
    """A dump that holds #4 twice (over, then open again): the rank waits in it."""
    twice = [*COMMON, entry(4, at=NOW - 60 * S), entry(4, done=False, at=NOW - 30 * S)]
    verdict = analyse([record(0, twice), record(1, COMMON)], NOW)
    assert verdict.culprits == ((1, "a"),) and verdict.waiting == ((0, "a"),) and verdict.waited_s == 30.0
    assert verdict.op == "all_reduce [[10]]"


# -- a mismatch that killed a rank (its records are gone) -----------------------------------------------------------


def gather(*sizes: tuple[int, ...]) -> list[dict[str, object]]:
    """All_reduces #1-3, then all_gather #4 of tensors `sizes`, ended (the peer that died closed the connections)."""
    return [*COMMON, entry(4, op="gloo:all_gather", sizes=sizes)]


UNTOLD = "collective mismatch: {dead} died of it; which rank's call differed cannot be told ({why})"


@pytest.mark.parametrize(("records", "dead", "why"), [
    ([died(0, GLOO_SHORT), RankRecord(1, "a", Answer.EXITED)], "rank 0 (node a)",
     "no other rank's records could be read"),
    ([died(0, GLOO_SHORT), RankRecord(1, "a", Answer.ANSWERED)], "rank 0 (node a)",
     "no other rank's records could be read"),
    # two died, the two read agree: either dead rank may have differed
    ([died(0), died(1), record(2, gathered(10)), record(3, gathered(10))], "ranks 0-1 (node a)",
     "the ranks read called all_gather [[10]]; 0 other rank(s) not read"),
    # no words place rank 0: it may have called [[20]], and then no side outnumbers the other
    ([died(0), record(1, gathered(10)), record(2, gathered(10)), record(3, gathered(20))], "rank 0 (node a)",
     "the ranks read called all_gather [[10]] (rank"),
    # gloo's words: rank 0's call was the smaller; both sides hold 20 elements, so neither is
    ([died(0, GLOO_SHORT), record(1, gather((20,))), record(2, gather((20,))), record(3, gather((2, 10)))],
     "rank 0 (node a)", "the ranks read called all_gather [[20]] (rank"),
])
def test_a_mismatch_that_killed_a_rank_names_nobody_when_the_sides_do_not_decide(
        records: list[RankRecord], dead: str, why: str) -> None:
    """The line says why (up to the sides' rank lists)."""
    verdict = analyse(records, NOW)
    assert verdict.finding is Finding.UNKNOWN and not verdict.named
    assert verdict.reason().startswith(UNTOLD.format(dead=dead, why=why).removesuffix(")"))


def test_two_dead_and_the_ranks_read_agreeing_keeps_their_call() -> None:
    verdict = analyse([died(0), died(1), record(2, gathered(10)), record(3, gathered(10))], NOW)
    assert verdict.to_dict()["collective"] == "all_gather [[10]]" and verdict.seq == 4


def test_the_rank_that_died_receiving_too_much_joins_the_side_with_fewer_elements() -> None:
    """[[10]] holds 10 elements, [[2, 10]] 20 (though (2, 10) sorts before (10,)): rank 0 called [[10]], with
    rank 1, and rank 2 is the odd one out."""
    verdict = analyse([died(0, GLOO_SHORT), record(1, gather((10,))), record(2, gather((2, 10)))], NOW)
    assert verdict.finding is Finding.MISMATCH and verdict.culprits == ((2, "a"),)
    assert verdict.waiting == ((0, "a"), (1, "a"))
    assert verdict.reason() == ("collective mismatch #4 (process group 0): rank 2 (node a) called all_gather "
                                "[[2, 10]] while ranks 0-1 (node a) called all_gather [[10]]; rank 0 (node a) died "
                                "of it")


def test_a_mismatch_that_killed_a_rank_names_the_minority_whatever_its_sizes_sort_as() -> None:
    """No words place the dead rank; ranks 1-3 agree on [[10]] and outnumber rank 4's [[5]] even with it."""
    verdict = analyse([died(0), record(1, gathered(10)), record(2, gathered(10)), record(3, gathered(10)),
                       record(4, gathered(5))], NOW)
    assert verdict.finding is Finding.MISMATCH and verdict.culprits == ((4, "a"),)
    assert verdict.waiting == ((1, "a"), (2, "a"), (3, "a"))


def test_a_mismatch_that_killed_a_rank_says_each_odd_call() -> None:
    verdict = analyse([died(0), *(record(r, gathered(10)) for r in (1, 2, 3)), record(4, gathered(20)),
                       record(5, gathered(30))], NOW)
    assert verdict.culprits == ((4, "a"), (5, "a"))
    assert verdict.reason() == ("collective mismatch #4 (process group 0): ranks 4-5 (node a) called all_gather "
                                "[[20]]; all_gather [[30]] while ranks 1-3 (node a) called all_gather [[10]]; rank 0 "
                                "(node a) died of it")


@pytest.mark.parametrize(("words", "called"), [
    ("", "another call"),
    ("what():  Connection reset by peer", "another call (its error: Connection reset by peer)"),
    ("[enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 20 vs 20. Is there a mismatch?",
     "another call (its error: op.preamble.length <= op.nbytes. 20 vs 20. Is there a mismatch?)"),  # not more
    (GLOO_SHORT, "a smaller all_gather (it received 40 bytes where its own call expected 20)"),
])
def test_the_rank_that_died_while_the_others_agree_is_named_with_what_its_error_tells(words: str,
                                                                                     called: str) -> None:
    verdict = analyse([record(0, gathered(10)), record(1, gathered(10)), died(2, words)], NOW)
    assert verdict.finding is Finding.MISMATCH and verdict.culprits == ((2, "a"),)
    assert verdict.reason() == (f"collective mismatch #4 (process group 0): rank 2 (node a) called {called} while "
                                "ranks 0-1 (node a) called all_gather [[10]]; rank 2 (node a) died of it")


def test_a_rank_with_no_record_has_no_error_to_tell() -> None:
    records = [died(2, GLOO_SHORT)]
    assert died_line(records, 5, "all_gather") == "another call"
    assert not smaller_than_sent(records, 5)
    assert smaller_than_sent(records, 2)


@pytest.mark.parametrize(("received", "expected", "smaller"), [(40, 20, True), (20, 20, False), (10, 20, False)])
def test_only_receiving_more_than_expected_makes_a_call_the_smaller(received: int, expected: int,
                                                                   smaller: bool) -> None:
    records = [died(0, GLOO_SHORT.replace("40 vs 20", f"{received} vs {expected}"))]
    assert smaller_than_sent(records, 0) is smaller
    assert died_line(records, 0, "all_gather").startswith("a smaller all_gather") is smaller


@pytest.mark.parametrize(("shape", "elements"), [((), 1), ((10,), 10), ((2, 10), 20), ((3, 0, 5), 0)])
def test_a_tensors_elements_are_the_product_of_its_sizes(shape: tuple[int, ...], elements: int) -> None:
    assert numel(shape) == elements


# -- c10d's words (TORCH_DISTRIBUTED_DEBUG=DETAIL) --------------------------------------------------------------------


def c10d(me: int, mine: int, other: int, theirs: int) -> RankRecord:
    """The rank that died of c10d's error naming its call ([mine]) and another rank's ([theirs])."""
    return died(me, mismatch_words(C10D.format(me=me, mine=mine, other=other, theirs=theirs)))


def test_c10d_words_name_the_minority_whatever_its_rank() -> None:
    verdict = analyse([c10d(0, 20, 1, 10), *(c10d(r, 10, 0, 20) for r in (1, 2, 3))], NOW)
    assert verdict.finding is Finding.MISMATCH and verdict.culprits == ((0, "a"),)
    assert verdict.waiting == ((1, "a"), (2, "a"), (3, "a"))
    assert verdict.to_dict()["process_group"] == "" and verdict.to_dict()["collective"] == "allgather [[10]]"


def test_c10d_words_of_two_ranks_that_disagree_name_nobody() -> None:
    verdict = analyse([c10d(0, 10, 1, 20), c10d(1, 20, 0, 10)], NOW)
    assert verdict.finding is Finding.UNKNOWN and not verdict.named
    assert verdict.reason() == UNTOLD.format(
        dead="ranks 0-1 (node a)", why="c10d's words name allgather [[10]] (rank 0); allgather [[20]] (rank 1)")


def test_c10d_words_say_each_odd_call() -> None:
    verdict = analyse([c10d(0, 10, 3, 20), c10d(1, 10, 4, 30), c10d(2, 10, 3, 20), c10d(3, 20, 0, 10),
                       c10d(4, 30, 1, 10)], NOW)
    assert verdict.culprits == ((3, "a"), (4, "a"))
    assert verdict.odd == "allgather [[20]]; allgather [[30]]"


def test_c10d_words_are_read_as_calls_over_in_no_group() -> None:
    assert claims_of("c10d: rank 0 ALLGATHER [10, 2] #3; rank 2 ALLGATHER [] #3") == {
        0: Call(group="", seq=3, op="allgather", sizes=((10, 2),), done=True, created_ns=0),
        2: Call(group="", seq=3, op="allgather", sizes=((),), done=True, created_ns=0),
    }


FINGERPRINT = ("Rank {r} is running collective: CollectiveFingerPrint(SequenceNumber=3, OpType=ALLGATHER, "
               "TensorShape=[{r}]")


def test_an_error_line_is_read_in_its_first_4000_characters_and_its_first_four_fingerprints() -> None:
    five = " but ".join(FINGERPRINT.format(r=r) for r in range(5))
    assert mismatch_words(five) == "c10d: " + "; ".join(f"rank {r} ALLGATHER [{r}] #3" for r in range(4))
    late = FINGERPRINT.format(r=7)
    assert mismatch_words("x" * (4000 - len(late)) + late).startswith("c10d: rank 7")
    assert mismatch_words("x" * (4001 - len(late)) + late) == "x" * 300  # its last character is the 4001st


# -- small words and helpers -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("ranks", "said"), [
    ([1], "rank 1"),
    ([0, 2], "ranks 0, 2"),
    ([0, 1, 2, 5], "ranks 0-2, 5"),
    (list(range(0, 16, 2)), "ranks 0, 2, 4, 6, 8, 10, 12, 14"),  # eight runs: each said
    (list(range(0, 18, 2)), "ranks 0, 2, 4, 6, 8, 10, 12, 14, ... (9 ranks)"),
])
def test_some_ranks_says_up_to_eight_runs(ranks: list[int], said: str) -> None:
    assert some_ranks(ranks) == said


@pytest.mark.parametrize(("ranks", "said"), [
    ((), "no rank"),
    (((1, "b"),), "rank 1 (node b)"),
    (((0, "b"), (1, "a"), (2, "b")), "ranks 0, 2 (node b), 1 (node a)"),  # nodes by their lowest rank, not by name
])
def test_ranks_on_nodes_groups_by_node_lowest_rank_first(ranks: tuple[tuple[int, str], ...], said: str) -> None:
    assert ranks_on_nodes(ranks) == said


@pytest.mark.parametrize(("waiting", "waited_s", "where", "said"), [
    ((), None, "", ""),
    ((), 3.0, "all_reduce #4 (process group 0)", "no rank read was inside all_reduce #4 (process group 0)"),
    (((0, "a"),), 5.04, "it", "rank 0 waited 5.0 s in it"),
    (((0, "a"), (2, "b")), None, "it", "ranks 0, 2 waited in it"),
])
def test_waited_line_says_who_waited_how_long_where(waiting: tuple[tuple[int, str], ...], waited_s: float | None,
                                                    where: str, said: str) -> None:
    assert waited_line(waiting, waited_s, where) == said


def test_a_culprits_stack_keeps_its_indentation_and_loses_its_trailing_blank_lines() -> None:
    culprit = Culprit(Verdict(Finding.STOPPED, ((1, "a"),)), {1: "  Thread 7 (idle)\n    sleep (x.py:3)\n\n"}, 0.1)
    assert culprit.stacks_text() == ["rank 1 (culprit):\n  Thread 7 (idle)\n    sleep (x.py:3)"]


# -- reading dumps --------------------------------------------------------------------------------------------------


DUMP = json.dumps({"version": "2.10", "entries": [entry(1)], "pg_config": {"0": {"name": "0"}}}).encode()
NCCL = json.dumps({"version": "2.10", "entries": [entry(2, op="nccl:all_reduce", pg=1)],
                   "pg_config": {"1": {"name": "1"}}}).encode()


@pytest.mark.parametrize("second", [
    b'{"version": "2.10", "entries": "x"}',  # entries that are not a list
    b'{"version": "2.10"}',  # no entries
    b'{"version": "2.10", "entries": []}',  # none yet
    b"not json",
    None,
])
def test_a_second_dump_with_no_entries_leaves_the_first_byte_for_byte(second: bytes | None) -> None:
    assert merge_dumps(DUMP, second) == DUMP


@pytest.mark.parametrize("first", [b"not json", b"[]"])
def test_a_first_dump_that_is_not_one_gives_the_second(first: bytes) -> None:
    assert merge_dumps(first, NCCL) == NCCL


def test_two_dumps_merge_their_entries_and_process_groups() -> None:
    merged = json.loads(merge_dumps(DUMP, NCCL))
    assert merged["pg_config"] == {"0": {"name": "0"}, "1": {"name": "1"}}
    assert [(c.group, c.seq, c.op) for c in read_dump(json.dumps(merged)) or ()] == [("0", 1, "all_reduce"),
                                                                                     ("1", 2, "all_reduce")]


def entry_with(**fields: object) -> dict[str, object]:
    """One entry of a dump, `fields` replaced (None: removed)."""
    out = {**entry(4, done=False, at=NOW), **fields}
    return {k: v for k, v in out.items() if v is not None}


@pytest.mark.parametrize(("fields", "read"), [
    ({"profiling_name": None}, None),  # no op: left out
    ({"collective_seq_id": "4"}, None),  # a number as text: left out
    ({"collective_seq_id": True}, None),
    ({"retired": False, "state": "completed"}, (4, "all_reduce", True, NOW)),  # over, as NCCL's recorder says it
    ({"retired": False, "state": "scheduled"}, (4, "all_reduce", False, NOW)),
    ({"profiling_name": "all_reduce"}, (4, "all_reduce", False, NOW)),  # no backend prefix
    ({"profiling_name": "nccl:coalesced:all_reduce"}, (4, "all_reduce", False, NOW)),  # the part after the last `:`
    ({"time_created_ns": None}, (4, "all_reduce", False, 0)),  # undated
    ({"time_created_ns": "soon"}, (4, "all_reduce", False, 0)),
    ({"time_created_ns": True}, (4, "all_reduce", False, 0)),
])
def test_an_entry_is_read_or_left_out(fields: dict[str, object], read: tuple[int, str, bool, int] | None) -> None:
    call = call_of(entry_with(**fields))
    assert (None if call is None else (call.seq, call.op, call.done, call.created_ns)) == read


def test_an_entrys_sizes_are_bounded_to_64_tensors_of_16_dimensions() -> None:
    assert call_of(entry_with(input_sizes=[[1]] * 70)).sizes == ((1,),) * 64  # type: ignore[union-attr]
    assert call_of(entry_with(input_sizes=[list(range(20))])).sizes == (tuple(range(16)),)  # type: ignore[union-attr]
    assert call_of(entry_with(input_sizes=[[*range(16), "x"]])).sizes == (tuple(range(16)),)  # type: ignore[union-attr]


# -- the wait-for graph -------------------------------------------------------------------------------------------


def test_a_rank_waits_for_the_ranks_of_its_calls_group_that_never_entered_it() -> None:
    """Rank 0 waits in group 0's first call; rank 1 has no call yet (of the default group): rank 0 waits for it."""
    graph = WaitGraph.of([record(0, [entry(1, done=False)]), RankRecord(1, "a", Answer.ANSWERED)])
    assert graph is not None
    assert graph.missing == {("0", 1): (1,)}
    assert graph.waits_for(0) == (1,) and graph.waits_for(1) == ()


def test_the_calls_waited_in_are_ordered_by_when_they_were_first_entered() -> None:
    """Group 1's #9 was entered 50 s ago by rank 0 (10 s ago by rank 1), group 0's #7 30 s ago: #9 first."""
    read = [record(0, [entry(9, pg=1, done=False, at=NOW - 50 * S)]), record(1, [entry(9, pg=1, done=False,
                                                                                     at=NOW - 10 * S)]),
            record(2, [entry(7, done=False, at=NOW - 30 * S)])]
    graph = WaitGraph.of(read)
    assert graph is not None and graph.waited_in == (("1", 9), ("0", 7))


def test_the_calls_waited_in_are_ordered_whatever_order_the_ranks_are_read_in() -> None:
    """Two calls entered at the same instant: the same order either way (every node names the same culprit)."""
    read = [record(0, [entry(2, pg=1, done=False, at=NOW)]), record(1, [entry(2, pg=0, done=False, at=NOW)])]
    graphs = [WaitGraph.of(read), WaitGraph.of(read[::-1])]
    assert graphs[0] is not None and graphs[1] is not None
    assert graphs[0].waited_in == graphs[1].waited_in == (("0", 2), ("1", 2))


def test_a_vertex_with_no_edges_of_its_own_is_a_component_of_its_own() -> None:
    rank, call = ("rank", "", 0), ("call", "0", 1)
    assert sorted(components({rank: [call]})) == [[call], [rank]]


def test_an_undated_call_counts_as_entered_before_any_dated_one() -> None:
    """Ranks 0-1 wait in group 1's #9, undated; ranks 2-3 in group 0's #2, dated at the epoch's first nanosecond:
    the verdict is placed at the undated call (entered first, as far as the records tell)."""
    undated = entry_with(collective_seq_id=9, pg_id=1, time_created_ns=None)
    dated = entry_with(collective_seq_id=2, time_created_ns=1)
    verdict = analyse([record(0, [undated]), record(1, [undated]), record(2, [dated]), record(3, [dated])], NOW)
    assert (verdict.group, verdict.seq) == ("1", 9) and not verdict.named


# -- the wire form (etcd's copy of another node's records) ----------------------------------------------------------


WIRED = {"rank": 3, "node": "b", "answer": "answered", "detail": "d",
         "calls": [["0", 4, "all_reduce", [[10]], False, 7]]}
READ = RankRecord(3, "b", Answer.ANSWERED, (Call("0", 4, "all_reduce", ((10,),), done=False, created_ns=7),), "d")


@pytest.mark.parametrize("junk", [
    5,  # not an object
    {**WIRED, "answer": "bogus"},
    {**WIRED, "rank": True},
    {**WIRED, "rank": "0"},
    {**WIRED, "node": 5},
    {**WIRED, "calls": "x"},
])
def test_a_malformed_rank_on_the_wire_is_left_out_and_the_ranks_after_it_read(junk: object) -> None:
    assert from_wire([junk, WIRED]) == [READ]


@pytest.mark.parametrize(("fields", "read"), [
    ({"detail": 5}, RankRecord(3, "b", Answer.ANSWERED, READ.calls, "")),
    ({"detail": None}, RankRecord(3, "b", Answer.ANSWERED, READ.calls, "")),
    ({"calls": [["0", 3, "all_reduce", [[10]], True], *WIRED["calls"]]}, READ),  # a call of five fields
    ({"calls": ["abcdef", *WIRED["calls"]]}, READ),  # six characters are not six fields
])
def test_a_malformed_field_on_the_wire_is_read_as_nothing(fields: dict[str, object], read: RankRecord) -> None:
    item = {k: v for k, v in {**WIRED, **fields}.items() if v is not None}
    assert from_wire([item]) == [read]


def test_a_ranks_error_travels_bounded_to_300_characters() -> None:
    wire = to_wire([RankRecord(0, "a", Answer.MISMATCHED, detail="x" * 400)])
    assert wire[0]["detail"] == "x" * 300  # type: ignore[index]
