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
from runner.observe.ledger import Ledger, StepReport, job_ledger
from runner.outcomes import FailureClass, FailureKind
from runner.rundir.records import (
    KNOWN_FAILURE,
    KNOWN_LEDGER,
    KNOWN_REPORT,
    KNOWN_STATUS,
    FailureRecord,
    LedgerFailure,
    LedgerRecord,
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
opt_finite = st.none() | finite
seconds = st.dictionaries(text, finite, max_size=3)
ledger_failures = st.builds(
    LedgerFailure, trigger=text, failure_class=st.none() | text, reason=text, recovered=st.booleans(),
    attempt=opt_int, detection_known=st.booleans(), last_step=opt_int, checkpoint=opt_int, resumed_from=opt_int,
    steps_lost=opt_int, phases=seconds, lost_s=finite)
ledgers = st.builds(
    LedgerRecord, basis=st.none() | text, wall_s=finite, productive_s=finite, launch_s=finite, lost_s=finite,
    ettr=opt_finite, launch=st.none() | seconds, failures=st.none() | st.lists(ledger_failures, max_size=2).map(tuple),
    failure_count=opt_int, productive_spans=st.none() | st.lists(st.tuples(finite, finite), max_size=2).map(tuple),
    groups=st.none() | st.lists(objects, max_size=2).map(tuple), unknown=extras(KNOWN_LEDGER))
reports = st.builds(
    Report, job=text, node=text, outcome=st.none() | text, exit_code=st.none() | st.integers(-300, 300),
    reason=st.none() | text, attempts=st.integers(0, 99), restarts=st.integers(0, 99), duration_s=finite,
    failures=st.lists(failures, max_size=2).map(tuple), groups=st.none() | st.tuples(objects), ledger=st.none() | ledgers,
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
    keys = set(json.loads(Report(ledger=LedgerRecord(), extra={"health": []}).to_json()))
    assert keys == {"job", "node", "outcome", "exit_code", "attempts", "restarts", "duration_s", "failures", "health",
                    "ledger", "warnings", "run_dir"}


@given(ledgers)
def test_a_ledger_reads_back_as_written(ledger: LedgerRecord) -> None:
    assert LedgerRecord.from_dict(json.loads(json.dumps(ledger.to_dict()))) == ledger


def test_the_ledgers_the_agent_writes_read_back_to_the_same_json() -> None:
    """A node's ledger with a failure (runner.observe.ledger.Ledger.report) and a job of replica groups' (job_ledger):
    read through LedgerRecord and written again, the same JSON, key for key and in order."""
    led = Ledger(0.0)
    led.spawned(0.5, 0, "job")
    led.entered_running(0.4)
    led.step(StepReport(1, None, 1.0))
    led.step(StepReport(5, 4, 3.0))
    led.failed(3.5, 0.2, "worker_failed", None)
    led.classed({"class": "exception", "reason": "rank 1 exited with code 1"})
    led.torn_down(4.0)
    led.entered_running(4.5)
    led.spawned(4.6, 1, "job")
    led.ready(5.0)
    led.step(StepReport(5, None, 6.0))
    node = json.loads(json.dumps(led.report(8.0)))
    assert node["failures"] and node["launch"]  # the case has what a node's ledger may have
    job = json.loads(json.dumps(job_ledger([node | {"group": 0}, node | {"group": 1}])))
    for written in (node, job):
        record = LedgerRecord.from_dict(written)
        assert json.dumps(record.to_dict()) == json.dumps(written)
    report = Report.from_json(Report(ledger=LedgerRecord.from_dict(node)).to_json())
    assert report.ledger is not None and report.ledger.failures is not None
    (failure,) = report.ledger.failures
    assert (failure.trigger, failure.failure_class, failure.recovered) == ("worker_failed", "exception", True)


def test_a_ledger_of_the_wrong_shapes_reads_as_what_it_can() -> None:
    junk = LedgerRecord.from_dict({"wall_s": "ten", "ettr": True, "launch": {"spawn": "x", "init": 0.5},
                                   "failures": [1, {"lost_s": 2.0}], "productive_spans": [[0, 1], [2], "x"],
                                   "future": 1})
    assert (junk.wall_s, junk.ettr, junk.launch, junk.productive_spans) == (0.0, None, {"init": 0.5}, ((0.0, 1.0),))
    assert junk.failures == (LedgerFailure(lost_s=2.0),) and junk.unknown == {"future": 1}
