"""The restart policy's reading of a round's charge, its crash-loop test, and a round's news copy on the wire: the
cases mutation testing found untested (bench/mutation.sh, docs/testing.md "Mutation score").

Each test names, in its docstring, the mutants it kills (runner/core/restart_policy.py, runner/core/table_machine.py,
runner/rendezvous/etcd/round.py).
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st
from test_core_mutants import ctx_with, failure
from test_machine import TRACEBACK, decide

from runner.core import restart_policy
from runner.core.context import Charge
from runner.core.machine import GroupState, Trigger, mermaid
from runner.core.restart_policy import as_counted, counted_as
from runner.diagnosis.failure import Failure
from runner.outcomes import FailureClass, FailureKind
from runner.rendezvous.base import RoundCharge
from runner.rendezvous.etcd import round as round_module
from runner.rendezvous.etcd.keys import dump, load
from runner.rendezvous.etcd.round import CLOSED_ZLIB, Roster, RoundResult, decode_closed, encode_closed

C = FailureClass
PEER = Failure(kind=FailureKind.PEER, reason="node b lost: reported FAILED", attempt=0)  # node_lost until charged
OWN = failure()  # this node's worker exited 1: exception


class Decided:
    """A rendezvous whose round another node charged first: every charge gets that node's verdict back."""

    def __init__(self, verdict: RoundCharge) -> None:
        self.verdict = verdict

    async def charge_restart(self, *_args: Any, **_kw: Any) -> RoundCharge:
        return self.verdict


def charged(current: Failure, charge: Charge | None, **kw: Any) -> Any:
    """A FAILED context whose restart charge (gather's) is `charge`."""
    ctx = ctx_with(current, **kw)
    ctx.run.charge = charge
    return ctx


def verdict(count: int | None, cls: FailureClass | None, *, paid: bool | None, by: str = "b") -> Charge:
    """The charge the round's first charger (`by`) made: the job's count, the class, whether max_restarts paid."""
    return Charge(RoundCharge(count, cls, paid, by))


# -- what a failure is counted as: counted_as ----------------------------------------------------------------------


@pytest.mark.parametrize(("current", "charge", "expected"), [
    (OWN, None, (C.EXCEPTION, True)),
    (PEER, None, (C.NODE_LOST, False)),
    (OWN, Charge(None, "etcd unreachable"), (C.EXCEPTION, True)),
    (PEER, verdict(1, C.EXCEPTION, paid=True), (C.EXCEPTION, True)),
    (OWN, verdict(1, C.NODE_LOST, paid=False), (C.NODE_LOST, False)),
    (OWN, verdict(None, None, paid=False), (None, False)),
    (PEER, verdict(1, C.EXCEPTION, paid=None), (C.EXCEPTION, True)),
    (OWN, verdict(1, C.NODE_LOST, paid=None), (C.NODE_LOST, False)),
    (OWN, verdict(1, None, paid=None), (C.EXCEPTION, True)),
], ids=["no-charge-own", "no-charge-peer", "budgets-unreachable", "peer-seen-as-its-exception",
        "own-exception-in-a-lost-nodes-round", "membership-claim", "older-runner-peer", "older-runner-class",
        "older-runner-says-nothing"])
def test_a_failure_counts_as_the_rounds_charge_says_else_as_the_spec_budgets_it(
        current: Failure, charge: Charge | None, expected: tuple[FailureClass | None, bool]) -> None:
    """Kills restart_policy counted_as__mutmut_1/2/4-14.

    The round's first charger decided for every node (its class, whether max_restarts paid). Without a charge, with
    the budgets unreachable, or with an older runner's charge that does not say whether it was paid, the spec's
    budget of the class decides: the verdict's class when it names one, else the failure's own.
    """
    assert counted_as(charged(current, charge), current) == expected


# -- a peer's failure in the class its round was charged as: as_counted -------------------------------------------


@pytest.mark.parametrize(("current", "charge"), [
    (OWN, None),
    (OWN, verdict(1, C.NODE_LOST, paid=False)),
    (PEER, None),
    (PEER, Charge(None, "etcd unreachable")),
    (PEER, verdict(1, C.NODE_LOST, paid=False)),
    (PEER, verdict(None, None, paid=False)),
], ids=["own-no-charge", "own-in-a-lost-nodes-round", "peer-no-charge", "peer-budgets-unreachable",
        "peer-charged-as-lost", "peer-in-a-membership-round"])
def test_a_failure_is_kept_as_seen_unless_a_peers_round_was_charged_as_another_class(
        current: Failure, charge: Charge | None) -> None:
    """Kills restart_policy as_counted__mutmut_5/8/9: this node's own failure is what it saw, whatever another node
    charged; a peer's stays node_lost when the round was charged so, not at all, or as a membership change."""
    assert as_counted(charged(current, charge)) is current


@pytest.mark.parametrize(("by", "evidence"), [
    ("b", "as node b charged this round"),
    ("", "as another node charged this round"),
], ids=["charger-known", "charger-unknown"])
def test_a_peers_failure_takes_the_class_the_round_was_charged_as_and_says_who_charged_it(
        by: str, evidence: str) -> None:
    """Kills restart_policy as_counted__mutmut_11-14/16-29: node b's exception, seen here as node b lost, is
    counted as b counted it, and the report says why the class is not the one this node saw."""
    counted = as_counted(charged(PEER, verdict(1, C.EXCEPTION, paid=True, by=by)))
    assert counted.failure_class is C.EXCEPTION
    assert counted.evidence == evidence
    assert (counted.kind, counted.reason, counted.attempt) == (PEER.kind, PEER.reason, PEER.attempt)


# -- the retry's words -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("current", "charge", "reason"), [
    (PEER, RoundCharge(2, None, charged=False, by="b"),
     "restart after a membership change, not charged to max_restarts (2 of 3 used)"),
    (OWN, RoundCharge(1, None, charged=None), "restart 1 of 3"),
    (OWN, RoundCharge(1, C.NODE_LOST, charged=None),
     "restart after node_lost, not charged to max_restarts (1 of 3 used)"),
], ids=["membership-change", "older-runner-says-nothing", "older-runner-names-the-class"])
def test_a_retry_says_what_the_round_was_charged_as(current: Failure, charge: RoundCharge, reason: str) -> None:
    """Kills restart_policy retried__mutmut_14/24/25: a peer's failure in a round another node claimed for a
    membership change restarts unpaid and says so; an older runner's charge is read through the spec's budgets."""
    ctx = ctx_with(current)
    ctx.rendezvous = Decided(charge)
    state, step = decide(ctx)
    assert (state, step.trigger) == (GroupState.RESTARTING, Trigger.retry)
    assert step.reason == reason


# -- a crash loop: the same exception on restart.crash_loop consecutive attempts --------------------------------


def raised(exception: str, attempt: int) -> Failure:
    """A worker's failure with a traceback that ends in `exception`, on attempt `attempt`."""
    return failure(attempt=attempt, traceback=TRACEBACK.replace("ValueError: bad 0x7f", exception))


SAME = "ValueError: bad 0x7f"


@pytest.mark.parametrize(("attempts", "crash_loop", "loops"), [
    ([(SAME, 0)], 1, True),
    ([("KeyError: 'lr'", 0), (SAME, 1)], 1, True),
    ([(SAME, 4), (SAME, 5), (SAME, 6)], 3, True),
    ([(SAME, 0), (SAME, 1), (SAME, 2), (SAME, 3)], 3, True),
    ([("KeyError: 'lr'", 0), ("RuntimeError: CUDA error", 1), (SAME, 2)], 3, False),
    ([(SAME, 0), ("KeyError: 'lr'", 1), (SAME, 2)], 3, False),
    ([(SAME, 0), (SAME, 2), (SAME, 3)], 3, False),
    ([(SAME, 3), (SAME, 4)], 3, False),
    ([(SAME, 0), (SAME, 1), (SAME, 2)], 0, False),
], ids=["one-is-a-loop-of-one", "only-the-last-counts-for-one", "from-a-later-attempt", "the-last-three-of-four",
        "three-different-exceptions", "one-different-in-between", "an-attempt-in-between", "too-few", "off"])
def test_a_crash_loop_is_the_same_exception_on_consecutive_attempts(
        attempts: list[tuple[str, int]], crash_loop: int, loops: bool) -> None:
    """Kills restart_policy looping__mutmut_11/12/16/17/23/29/30: restart.crash_loop=1 stops on the first
    exception; a loop need not start at attempt 0; different exceptions, or an attempt between them that recorded
    no failure (a membership change's restart), make no loop; restart.crash_loop=0 turns the test off."""
    *earlier, current = (raised(exc, attempt) for exc, attempt in attempts)
    ctx = ctx_with(current, tuple(earlier), crash_loop=crash_loop)
    loop = restart_policy.looping(ctx)
    assert restart_policy.crash_loop(ctx) is loops
    assert loop == (ctx.run.failures[-crash_loop:] if loops else [])
    _, step = decide(ctx)
    if loops:
        assert step.reason.startswith(f"crash loop: the same exception on {crash_loop} consecutive attempts: ")
    else:
        assert step.trigger is Trigger.retry


def test_a_signal_after_the_same_exception_is_no_crash_loop() -> None:
    """The last failure carries no exception (killed by a signal): nothing repeats, whatever came before."""
    earlier = (raised(SAME, 0), raised(SAME, 1))
    ctx = ctx_with(failure(attempt=2, signal="SIGKILL"), earlier)
    assert restart_policy.looping(ctx) == []


# -- the diagram -------------------------------------------------------------------------------------------------


def test_the_diagram_labels_an_unguarded_edge_with_its_trigger_alone() -> None:
    """Kills table_machine mermaid__mutmut_11 (`runner graph`: a guard in brackets only where there is one)."""
    lines = mermaid().splitlines()
    assert "    INIT --> RENDEZVOUS: initialized" in lines
    assert "    FAILED --> SHUTDOWN: give_up [stopping]" in lines
    assert "    FAILED --> SHUTDOWN: give_up" in lines  # the policy's last edge: the charge refused


# -- a round's news copy on the wire -----------------------------------------------------------------------------


RESULT = RoundResult(("gpu-1", "gpu 2", "a/b%c"), "10.0.0.1", 29500, 8, 1700000000.5, 42)


def test_a_news_copy_is_the_record_without_its_nodes_then_the_node_list_compressed_fast() -> None:
    """Kills round encode_closed__mutmut_3/4/20/21: the head line is the record less its node list (N nodes decode
    it: the ids are only in the compressed lines), and the leader compresses them at zlib's fastest level (it does
    so inside the round's close, 16,384 ids at scale): the zlib header's FLEVEL bits say level 1."""
    head, _, body = encode_closed(RESULT).partition(b"\n")
    assert load(head) == {"master_addr": "10.0.0.1", "master_port": 29500, "nproc": 8, "closed_at": 1700000000.5,
                          "rev": 42, CLOSED_ZLIB: True}
    assert body[:2] == b"\x78\x01"  # deflate, 32 KiB window; FLEVEL 0: the fastest
    assert zlib.decompress(body) == b"gpu-1\ngpu%202\na%2Fb%25c"


HEAD = {"master_addr": "h", "master_port": 1, "nproc": 2, "closed_at": 3.0, "rev": 4}


@pytest.mark.parametrize("raw", [
    dump({**HEAD, CLOSED_ZLIB: True}),
    dump(HEAD),
    b"[1, 2]\n" + zlib.compress(b"a", 1),
    b"[1, 2]\na",
    b"not json\na",
    dump({**HEAD, CLOSED_ZLIB: True}) + b"\n" + zlib.compress(b"a\nb\nc" * 100, 1)[:-6],
    dump({**HEAD, CLOSED_ZLIB: True}) + b"\nnot zlib",
], ids=["head-alone-compressed", "head-alone-plain", "head-not-an-object", "head-not-an-object-plain",
        "head-not-json", "truncated", "not-zlib"])
def test_what_is_not_a_news_copy_reads_as_none(raw: bytes) -> None:
    """Kills round decode_closed__mutmut_7/21: no newline after the head, a head that is no JSON object, a node list
    cut short: not a copy runner wrote (the waiting node reads the result key instead), never an exception."""
    assert decode_closed(raw) is None


def test_an_older_runners_plain_copy_still_reads() -> None:
    """Kills round decode_closed__mutmut_12: a copy without CLOSED_ZLIB has its ids uncompressed (percent-encoded)."""
    raw = dump(HEAD) + b"\na\nb%2Fc\ngpu%202"
    assert decode_closed(raw) == RoundResult(("a", "b/c", "gpu 2"), "h", 1, 2, 3.0, 4)
    assert decode_closed(dump(HEAD) + b"\n") == RoundResult((), "h", 1, 2, 3.0, 4)


def test_a_node_list_that_inflates_past_the_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kills round decode_closed__mutmut_20: a compressed list that inflates past MAX_CLOSED_BYTES (a zlib bomb) is
    not inflated further; one that inflates to exactly the limit still reads."""
    monkeypatch.setattr(round_module, "MAX_CLOSED_BYTES", 64)
    at_limit = RoundResult(("n" * 31, "m" * 32), "h", 1, 2, 3.0, 4)  # 31 + newline + 32 bytes
    over = RoundResult(("n" * 32, "m" * 32), "h", 1, 2, 3.0, 4)
    assert decode_closed(encode_closed(at_limit)) == at_limit
    assert decode_closed(encode_closed(over)) is None


@given(st.lists(st.text(max_size=12), max_size=12).map(tuple))
@example(())
@example(("a", "", "b"))
def test_a_news_copy_keeps_every_node_in_place_as_the_result_key_does(nodes: tuple[str, ...]) -> None:
    """Kills round decode_closed__mutmut_26/27: a round of no node reads back with none, no empty id is dropped.

    The one list a copy cannot tell from no node at all is a lone empty id (both are an empty body); no node has
    that id (keys.check_node_id refuses it).
    """
    assume(nodes != ("",))
    result = RoundResult(nodes, "h", 1, 2, 3.0, 4)
    assert decode_closed(encode_closed(result)) == result == round_module.parse_result(
        json.loads(json.dumps(result.record())))


# -- the leader's roster -----------------------------------------------------------------------------------------


def test_a_round_with_a_newcomer_left_after_another_leaves_still_waits_for_last_call() -> None:
    """Kills round Roster.join__mutmut_14: every newcomer counts; with two joined and one gone, the round still has
    one, so it does not close as a mere re-forming of the previous round."""
    roster = Roster(["a", "b"])
    for node in ("a", "b", "c", "d"):
        roster.join(node, b"{}")
    assert roster.newcomers == 2
    roster.join("c", None)
    assert roster.newcomers == 1
    assert not roster.reforms_previous()
    roster.join("d", None)
    assert roster.reforms_previous()
