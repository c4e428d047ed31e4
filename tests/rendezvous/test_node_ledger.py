"""The node ledger (docs/hangs.md): a node's own failures across runs, shown by `runner status`, and used by
health.max_failures to keep out a node that fails again and again."""

from __future__ import annotations

import json
import subprocess

from conftest import RUNNER
from failing_jobs import failing_job, report
from hypothesis import given, settings
from hypothesis import strategies as st

from runner.rendezvous.node_ledger import MAX_MARKS, LocalLedger, Mark, NodeRecord, record_of, records_of

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=40,
)


def test_a_record_keeps_the_last_marks_and_counts_by_class_within_a_window():
    rec = NodeRecord("a")
    for i in range(MAX_MARKS + 5):
        rec = rec.noted(Mark(float(i), "hang" if i % 2 else "exception", f"r{i}", culprit=bool(i % 2)), float(i))
    assert len(rec.marks) == MAX_MARKS and rec.marks[0].reason == "r5" and rec.last_seen == MAX_MARKS + 4
    assert rec.counts() == {"hang": 25, "exception": 25}
    assert rec.counts(since=MAX_MARKS + 2) == {"exception": 2, "hang": 1}  # marks at 52, 53, 54
    assert record_of(json.loads(json.dumps(rec.to_json()))) == rec


@settings(max_examples=300, deadline=None)
@given(JSONISH)
def test_anything_read_back_is_a_record_or_nothing(value):
    rec = record_of(value)
    assert rec is None or (isinstance(rec.node, str) and len(rec.marks) <= MAX_MARKS)
    assert all(isinstance(r, NodeRecord) for r in records_of(value).values())


def test_the_local_ledger_survives_a_damaged_file(tmp_path):
    ledger = LocalLedger(tmp_path / "state" / "ledger" / "job.json")
    assert ledger.read() == {}
    ledger.note("n0", Mark(1.0, "exception", "boom"), now=5.0)
    ledger.note("n0", None, now=9.0)
    assert ledger.read()["n0"].last_seen == 9.0 and ledger.read()["n0"].counts() == {"exception": 1}
    assert oct(ledger.path.stat().st_mode & 0o777) == "0o600"
    ledger.path.write_text("{not json")
    assert ledger.read() == {}
    ledger.note("n0", Mark(2.0, "hang", "held up", culprit=True), now=10.0)
    assert ledger.read()["n0"].counts() == {"hang": 1}


def test_a_node_that_fails_again_and_again_is_kept_out_and_status_shows_why(job):
    """health.max_failures 2: the worker raises on every attempt; after its second failure the node leaves before
    the third round (exit 3), and `runner status` shows the ledger. A second run is kept out at once."""
    extra = "health: {max_failures: 2, failure_window: 1h}"
    j = failing_job(job, "raise", fails=10, max_restarts=5, extra=extra)
    res = j.run()
    assert res.returncode == 3, res.stderr[-2000:]
    rep = report(j)
    assert [f["kind"] for f in rep["failures"]] == ["worker", "worker", "health"]
    assert not list(j.run_dir().glob("attempt_2/rank_*"))  # the third round was never joined
    last = rep["failures"][-1]
    assert last["reason"].startswith("kept out by the node ledger: 2 failures of this node in the last 1h")
    assert "(exception 2), health.max_failures is 2" in last["reason"]
    status = j.cli("status")
    assert status.returncode == 0, status.stderr
    assert "node ledger (across runs):" in status.stdout and "exception 2" in status.stdout
    ledger = json.loads(j.cli("status", "--json").stdout)["ledger"]
    assert [r["counts"] for r in ledger] == [{"exception": 2}]
    again = j.run()
    assert again.returncode == 3
    newest = max(j.logs.glob("*/*/report.json"), key=lambda p: p.stat().st_mtime)
    second = json.loads(newest.read_text())
    assert second["failures"][0]["reason"].startswith("kept out by the node ledger: 2 failures")
    assert not list(newest.parent.glob("attempt_*/rank_*"))  # no worker started


def test_a_node_is_marked_only_for_failures_of_its_own_and_seen_on_every_run(job):
    """Without max_failures nothing is kept out; the ledger still records the node's own failures."""
    j = failing_job(job, "raise", fails=1, max_restarts=1)
    assert j.run().returncode == 0
    (rec,) = json.loads(j.cli("status", "--json").stdout)["ledger"]
    assert rec["counts"] == {"exception": 1} and rec["marks"][0]["culprit"] is False


def test_two_jobs_of_one_name_keep_their_own_ledgers(job, tmp_path):
    """Two specs named alike in two folders (every spec `runner convert` made was named `train`): each keeps its own
    ledger, keyed by the job's identity (name, folder, what runs), and `runner status` of one never shows the other's
    failures, through the spec or through the job's name in the runs index."""
    state = tmp_path / "shared-state"
    jobs = [failing_job(job, "raise", fails=fails, max_restarts=fails) for fails in (1, 2)]
    for j in jobs:
        j.env = lambda j=j: {**type(j).env(j), "XDG_STATE_HOME": str(state)}  # one user's state folder for both
        assert j.run().returncode == 0
    ledgers = sorted(p.name for p in (state / "runner" / "ledger").iterdir())
    assert len(ledgers) == 2 and all(name.startswith("fc-") for name in ledgers), ledgers
    for j, failures in zip(jobs, (1, 2), strict=True):
        (rec,) = json.loads(j.cli("status", "--json").stdout)["ledger"]
        assert rec["counts"] == {"exception": failures}
    by_name = subprocess.run([*RUNNER, "status", "--json", "fc"], cwd=tmp_path,
                             env=jobs[1].env(), capture_output=True, text=True, timeout=60, check=False)
    assert by_name.returncode == 0, by_name.stderr
    (rec,) = json.loads(by_name.stdout)["ledger"]
    assert rec["counts"] == {"exception": 2}  # the latest run of `fc`: the second job's, with its own ledger
