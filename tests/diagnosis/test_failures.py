"""Root-cause extraction: signals and hints, torch's error file, stderr tails, the report text."""

from __future__ import annotations

import json
import random

from hypothesis import given
from hypothesis import strategies as st

from runner.config.spec import Backoff
from runner.diagnosis.evidence import read_error_file, signal_name, tail
from runner.diagnosis.failure import worker_failure
from runner.states.restarting import backoff_delay


def test_signal_name_and_oom_hint(tmp_path):
    """-9 is SIGKILL with an OOM-killer hint; a plain exit code has no signal."""
    f = worker_failure(0, 3, 1, -9, str(tmp_path))
    assert f.signal == "SIGKILL" and "OOM" in f.hint and f.reason == "rank 3 killed by SIGKILL"
    assert signal_name(1) is None and signal_name(-15) == "SIGTERM"


def test_torch_error_file_is_preferred_to_stderr(tmp_path):
    """When @record wrote the error file, the report shows its message and traceback, not the stderr tail."""
    (tmp_path / "stderr.log").write_text("noise\n")
    (tmp_path / "error.json").write_text(json.dumps({"message": {
        "message": "RuntimeError: boom", "extraInfo": {"py_callstack": "Traceback...\nRuntimeError: boom", "timestamp": "1"}}}))
    f = worker_failure(1, 0, 0, 1, str(tmp_path))
    assert f.error == "RuntimeError: boom" and "Traceback" in f.traceback and f.stderr_tail == ""
    assert "traceback:" in f.report() and "noise" not in f.report()


def test_stderr_tail_when_no_error_file(tmp_path):
    """Without an error file the last lines of stderr are the evidence."""
    (tmp_path / "stderr.log").write_text("".join(f"line {i}\n" for i in range(100)))
    f = worker_failure(0, 0, 0, 2, str(tmp_path))
    assert f.stderr_tail.splitlines()[-1] == "line 99" and len(f.stderr_tail.splitlines()) == 20
    assert "last lines of stderr" in f.report()


def test_unreadable_error_file_and_missing_logs(tmp_path):
    """Garbage in the error file or no log at all never raises."""
    (tmp_path / "error.json").write_text("{not json")
    assert read_error_file(tmp_path / "error.json") == ("", "")
    assert tail(tmp_path / "absent.log") == ""


def test_backoff_first_restart_is_immediate_then_grows_to_max():
    """Restart 1 waits 0; later ones grow by the multiplier from initial, capped at max, jitter within bounds."""
    b = Backoff(initial=1.0, max=5.0, multiplier=2.0, jitter=0.0)
    assert [backoff_delay(b, k) for k in (1, 2, 3, 4, 5)] == [0.0, 1.0, 2.0, 4.0, 5.0]
    jb = Backoff(initial=1.0, max=5.0, multiplier=2.0, jitter=0.5)
    rnd = random.Random(1)
    assert all(0.5 <= backoff_delay(jb, 2, rnd) <= 1.5 for _ in range(100))


@given(st.text(min_size=1, max_size=20).filter(lambda s: " lost: " not in s), st.text(max_size=200))
def test_a_peers_report_reads_the_same_with_or_without_its_cause(node: str, cause: str) -> None:
    """`node b lost: reported FAILED` and the same with `: <its root cause>`: one detected line, a peer report."""
    from runner.diagnosis.failure import Failure, peer_reported, reported_line
    from runner.events import PEER_REPORTED
    from runner.outcomes import FailureKind

    bare = f"node {node} lost: {PEER_REPORTED}"
    for reason in (bare, f"{bare}: {cause}"):
        assert reported_line(reason) == f"node {node} {PEER_REPORTED}"
        assert peer_reported(Failure(kind=FailureKind.PEER, reason=reason, attempt=0))
    assert not peer_reported(Failure(kind=FailureKind.PEER, reason=f"node {node} lost: lease expired", attempt=0))


@given(st.text(max_size=200), st.text(max_size=200))
def test_a_peers_report_is_read_from_the_loss_whatever_the_words_say_after_a_hangs_analysis(reason: str,
                                                                                           detected: str) -> None:
    """A hang's analysis rewrites a peer failure's reason and `detected` (a mismatch: "collective mismatch #4 ...",
    "node a reported FAILED"): the loss it carries still says the peer reported FAILED, so this node lets the peer
    charge the round first (before, the words decided: CI saw a node charge a peer's SIGABRT as node_lost)."""
    from runner.diagnosis.failure import Failure, peer_reported
    from runner.events import PEER_REPORTED, PeerLost
    from runner.outcomes import FailureKind

    def peer(why: str) -> Failure:
        return Failure(kind=FailureKind.PEER, reason=reason, attempt=0, detected=detected, peer=PeerLost("a", why))

    assert peer_reported(peer(PEER_REPORTED))
    assert not peer_reported(peer("lease expired"))


@given(st.text(max_size=400), st.text(max_size=400))
def test_a_failed_node_publishes_its_own_cause_or_the_peer_it_lost(why: str, cause: str) -> None:
    """FAILED publishes one bounded line: its own root cause (`cause`, with its `class`), or, a waiter, the peer it
    failed of (`lost`, which the peers name instead of it); nothing while not FAILED."""
    from runner.agent.services import CAUSE_CHARS, root_cause
    from runner.core.group_state import GroupState
    from runner.diagnosis.failure import Failure
    from runner.events import PeerLost
    from runner.outcomes import FailureKind

    own = Failure(kind=FailureKind.WORKER, reason=f"rank 1 exited with code 1: {cause}", attempt=0)
    published = root_cause(own, GroupState.FAILED)
    assert set(published) == {"cause", "class"} and isinstance(published["cause"], str)
    assert published["class"] == own.failure_class.value == "exception"
    assert len(published["cause"]) <= CAUSE_CHARS and "\n" not in published["cause"]
    waiter = Failure(kind=FailureKind.PEER, reason="node c lost", attempt=0, peer=PeerLost("c", why or "x", cause))
    assert waiter.to_dict()["peer"] == waiter.peer.to_dict()  # report.json: a JSON object, not the event's repr
    lost = root_cause(waiter, GroupState.FAILED)["lost"]
    assert isinstance(lost, dict) and lost["node"] == "c"
    assert all(isinstance(v, str) and len(v) <= CAUSE_CHARS and "\n" not in v for v in lost.values())
    assert root_cause(own, GroupState.RUNNING) == root_cause(None, GroupState.FAILED) == {}


def test_a_peers_published_class_is_the_class_of_the_failure_it_causes_here() -> None:
    """A peer that reported FAILED with its class (its worker killed by a signal): this node's failure is of that
    class, not node_lost, so that a charge made here first is made under it; without a class, node_lost as before."""
    import asyncio
    from types import SimpleNamespace

    from runner.events import PEER_REPORTED, PeerLost
    from runner.outcomes import FailureClass
    from runner.states.running import on_peer_lost

    for published, expected in ((FailureClass.SIGNAL, FailureClass.SIGNAL), (None, FailureClass.NODE_LOST)):
        ctx = SimpleNamespace(run=SimpleNamespace(attempt=0, failure=None, group=None), recorder=None)
        asyncio.run(on_peer_lost(ctx, PeerLost("a", PEER_REPORTED, "rank 0 killed by SIGABRT", published)))  # type: ignore[arg-type]
        assert ctx.run.failure.failure_class is expected, ctx.run.failure
        assert ctx.run.failure.to_dict()["peer"].get("class") == (published.value if published else None)
