"""report.json, status.json and failure.json through their one codec each (runner/rundir/records.py): round trip,
any text, and a real `Failure` written as the agent writes it reads back with every field it had."""

from __future__ import annotations

import json
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.diagnosis.failure import Failure
from runner.events import PeerLost
from runner.outcomes import FailureClass, FailureKind
from runner.rundir.records import (
    KNOWN_FAILURE,
    KNOWN_REPORT,
    KNOWN_STATUS,
    FailureRecord,
    NotJSON,
    RecordError,
    Report,
    Status,
)

text = st.text(string.printable, max_size=12)
leaf = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False) | text
json_value = st.recursive(leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
                          max_leaves=8)
objects = st.dictionaries(text, json_value, max_size=3)
finite = st.floats(allow_nan=False, allow_infinity=False)


def extras(known: frozenset[str]) -> st.SearchStrategy[dict[str, object]]:
    return st.dictionaries(text.filter(lambda k: k not in known), json_value, max_size=4)


opt_int = st.none() | st.integers(-300, 300)
failures = st.builds(
    FailureRecord, kind=text, reason=text, attempt=st.integers(0, 99), failure_class=text, rank=opt_int,
    local_rank=opt_int, exit_code=opt_int, signal=text, hint=text, error=text, traceback=text, stderr_tail=text,
    stacks=text, log_dir=text, evidence=text, detected=text, culprit_note=text, fingerprint=text, group=opt_int,
    hang=st.none() | objects.filter(bool), peer=st.none() | objects.filter(bool), extra=objects,
    unknown=extras(KNOWN_FAILURE))
reports = st.builds(
    Report, job=text, node=text, outcome=st.none() | text, exit_code=st.none() | st.integers(-300, 300),
    reason=st.none() | text, attempts=st.integers(0, 99), restarts=st.integers(0, 99), duration_s=finite,
    failures=st.lists(failures, max_size=2).map(tuple), groups=st.none() | st.tuples(objects), ledger=st.none() | objects,
    warnings=st.lists(text, max_size=3).map(tuple), run_dir=text, extra=extras(KNOWN_REPORT))
statuses = st.builds(
    Status, node=text, state=text, attempt=st.integers(0, 99), restarts=st.integers(0, 99), run_id=text,
    run_dir=text, heartbeat=finite, workers=st.lists(objects, max_size=2).map(tuple), outcome=st.none() | text,
    extra=extras(KNOWN_STATUS))


@given(failures)
def test_a_failure_record_reads_back_as_written(record: FailureRecord) -> None:
    assert FailureRecord.from_dict(json.loads(record.to_json())) == record


def test_a_real_failure_written_as_the_agent_writes_it_reads_back_whole() -> None:
    """Every field of a `Failure` the report shows (a worker's signal, its OOM evidence, the lost peer) comes back."""
    peer = PeerLost("b", "lease expired", cause="host b lost")
    failure = Failure(FailureKind.WORKER, "rank 1 killed by SIGKILL", 2, rank=1, local_rank=0, exit_code=-9,
                      signal="SIGKILL", stderr_tail="Killed", log_dir="/runs/x/attempt_2/rank_1",
                      extra={"note": 1}).with_oom_evidence("kernel log: Out of memory: Killed process 42")
    record = FailureRecord.from_dict(json.loads(failure.record().to_json()))
    assert (record.kind, record.reason, record.attempt, record.rank, record.local_rank, record.exit_code) == (
        "worker", "rank 1 killed by SIGKILL", 2, 1, 0, -9)
    assert record.failure_class == FailureClass.OOM.value and record.evidence.startswith("kernel log")
    assert record.hint and record.stderr_tail == "Killed" and record.extra == {"note": 1}
    assert record.to_dict() == json.loads(json.dumps(failure.to_dict(), default=str))  # the file the agent wrote
    lost = Failure(FailureKind.PEER, "node b lost: lease expired", 0, peer=peer).record()
    assert lost.peer == json.loads(json.dumps(peer.to_dict())) and lost.failure_class == FailureClass.NODE_LOST.value


@given(reports)
def test_a_report_reads_back_as_written(report: Report) -> None:
    assert Report.from_json(report.to_json()) == report


@given(statuses)
def test_a_status_reads_back_as_written(status: Status) -> None:
    assert Status.from_json(status.to_json()) == status


@pytest.mark.parametrize("record", [Report, Status])
@given(raw=st.binary(max_size=64) | st.text(max_size=64).map(str.encode) | json_value.map(json.dumps).map(str.encode))
def test_any_text_is_read_or_refused_clearly(record: type[Report | Status], raw: bytes) -> None:
    try:
        got = record.from_json(raw, "the file")
    except RecordError as e:
        assert str(e).startswith("the file: not ")
    else:
        assert isinstance(got, record)


def test_an_older_file_reads_with_defaults_and_keeps_what_it_does_not_know() -> None:
    old = Report.from_json('{"job": "train", "outcome": "failed", "attempts": "three", "future_key": [1]}')
    assert (old.job, old.outcome, old.attempts, old.ledger, old.failures) == ("train", "failed", 0, None, ())
    assert old.extra == {"future_key": [1]}
    assert json.loads(old.to_json())["future_key"] == [1]


def test_a_cut_file_and_a_list_are_refused_by_name() -> None:
    with pytest.raises(NotJSON, match=r"status\.json: not JSON"):
        Status.from_json('{"node": "a", "sta')
    with pytest.raises(RecordError, match=r"report\.json: not a JSON object"):
        Report.from_json("[]")


def test_the_report_keeps_its_keys() -> None:
    """The keys a job of one group's report always had (docs/usage.md), none added: optional ones only when set."""
    keys = set(json.loads(Report(ledger={}, extra={"health": []}).to_json()))
    assert keys == {"job", "node", "outcome", "exit_code", "attempts", "restarts", "duration_s", "failures", "health",
                    "ledger", "warnings", "run_dir"}
