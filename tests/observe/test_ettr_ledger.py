"""The ETTR ledger (docs/goodput.md): a run's wall time split into its launch, productive time and each failure's
phases, from the steps the workers report in their heartbeat file (runner/watchdog/steps.py).

Unit tests drive the ledger on made-up moments (no clock, no sleep) and read real files; the integration tests
run real jobs whose worker reports `{"step": N, "checkpoint": M}` every 0.1 s and, on attempt 0, crashes (exit 3)
or hangs (stops writing under `watchdog.heartbeat_timeout`) at step 17 with its checkpoint at step 10: the
phases add up to the wall time, ETTR is in (0, 1], and 6 steps were lost, as the heartbeat file said.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for
from hypothesis import given, settings
from hypothesis import strategies as st
from torchft_mark import needs_torchft

from runner.observe.ledger import PHASES, Ledger, StepReport, gauge_values, job_ledger
from runner.rendezvous.ports import free_port
from runner.report.page import render
from runner.report.story import read_story
from runner.runs.status import ettr, groups_table
from runner.watchdog.steps import MAX_REPORT_BYTES, parse, read

ROUNDING_S = 0.001  # every figure is rounded to the millisecond: the sum of n of them is within n ms

# ------------------------------------------------------------------------------------------ the file's format


@pytest.mark.parametrize(("raw", "expected"), [
    (b"", None),  # a touch: a heartbeat, no step
    (b'{"step": 7}', (7, None)),  # the format of examples/jobs/ft_train.py before checkpoints
    (b'{"step": 7, "loss": 2.3}', (7, None)),
    (b'{"step": 7, "checkpoint": 5}', (7, 5)),
    (b'{"step": 7, "checkpoint": -1}', (7, None)),  # a bad checkpoint drops only the checkpoint
    (b'{"step": -1}', None),
    (b'{"step": true}', None),
    (b'{"step": 1.5}', None),
    (b'{"step": "7"}', None),
    (b"step=7", None),
    (b"[7]", None),
    (b'{"step": 7', None),  # torn: a report missed, no error
    (b'{"step": 7, "pad": "' + b"x" * MAX_REPORT_BYTES + b'"}', None),
])
def test_heartbeat_content_is_a_step_report_or_just_a_heartbeat(raw: bytes, expected: object) -> None:
    """Only a JSON object with an int step >= 0 is a report; anything else (old content included) is a beat."""
    assert parse(raw) == expected


def test_read_takes_the_files_own_time(tmp_path: Path) -> None:
    """read() returns the step, the checkpoint and the file's modification time; no file is no report."""
    path = tmp_path / "heartbeat"
    assert read(path) is None
    path.write_text(json.dumps({"step": 3, "checkpoint": 2}))
    os.utime(path, (1_700_000_000.5, 1_700_000_000.5))
    assert read(path) == (3, 2, 1_700_000_000.5)


# ------------------------------------------------------------------------------------------------ the ledger


def crash_and_recover(*, checkpoint: int | None) -> Ledger:
    """Start 0; launch: round 1, spawn 2, ready 3, first step 3.5; step 16 at 9.5; crash learnt at 10.5;
    torn down 11, round 12, spawn 12.5, ready 13, first step (11) 14, caught up (step 16 again) 17."""
    led = Ledger(0.0)
    led.entered_running(1.0)
    led.spawned(2.0, 0, "job")
    led.ready(3.0)
    for k in range(1, 17):
        led.step(StepReport(k, checkpoint if checkpoint is not None and k >= checkpoint else None, 3.5 + (k - 1) * 0.4))
    led.failed(10.5, 0.0, "worker_failed", {"kind": "worker", "class": "exception", "reason": "rank 0 exited"})
    led.torn_down(11.0)
    led.entered_running(12.0)
    led.spawned(12.5, 1, "job")
    led.ready(13.0)
    led.step(StepReport(11, checkpoint, 14.0))
    led.step(StepReport(16, checkpoint, 17.0))
    led.step(StepReport(20, checkpoint, 19.0))
    return led


def test_a_crash_costs_its_phases_and_they_add_up_to_the_wall_time() -> None:
    """Each phase is the span between two known moments; launch + productive + lost = wall, exactly."""
    report = crash_and_recover(checkpoint=10).report(20.0)
    assert report["basis"] == "steps"
    assert report["launch"] == {"rendezvous": 1.0, "spawn": 1.0, "init": 1.0, "first_step": 0.5}
    (f,) = report["failures"]
    assert f["phases"] == {"lost_work": 1.0, "detection": 0.0, "teardown": 0.5, "rendezvous": 1.0, "spawn": 0.5,
                           "init": 0.5, "first_step": 1.0, "recompute": 3.0}
    assert (f["last_step"], f["checkpoint"], f["resumed_from"], f["steps_lost"]) == (16, 10, 10, 6)
    assert f["recovered"] and f["attempt"] == 1 and f["failure_class"] == "exception"
    assert report["lost_s"] == f["lost_s"] == 7.5
    assert (report["wall_s"], report["launch_s"], report["productive_s"]) == (20.0, 3.5, 9.0)
    assert report["ettr"] == 0.45
    assert report["productive_spans"] == [[3.5, 9.5], [17.0, 20.0]]


def test_without_a_checkpoint_the_new_attempt_resumes_one_before_its_first_report() -> None:
    """No checkpoint reported: resumed_from is the first step the new attempt reports, less one."""
    (f,) = crash_and_recover(checkpoint=None).report(20.0)["failures"]
    assert (f["last_step"], f["checkpoint"], f["resumed_from"], f["steps_lost"]) == (16, None, 10, 6)


def test_while_the_steps_are_redone_the_time_so_far_is_recompute() -> None:
    """A live ledger (status.json) in the middle of a recovery: the time since the first step after is recompute."""
    led = Ledger(0.0)
    led.spawned(1.0, 0, "job")
    led.step(StepReport(16, 10, 9.0))
    led.failed(10.0, 0.0, "worker_failed", None)
    led.torn_down(11.0)
    led.entered_running(12.0)
    led.spawned(12.5, 1, "job")
    led.ready(13.0)
    led.step(StepReport(11, 10, 14.0))  # resumed at 10: step 16 not reached again by 15.0
    (f,) = led.report(15.0)["failures"]
    assert f["phases"]["recompute"] == 1.0 and f["phases"]["first_step"] == 1.0


def test_a_failure_given_up_costs_until_the_end_and_detection_may_be_unknown() -> None:
    """No attempt follows: the failure's teardown runs to the end; a peer's loss has no known detection."""
    led = Ledger(0.0)
    led.spawned(1.0, 0, "job")
    led.step(StepReport(1, None, 2.0))
    led.step(StepReport(5, None, 6.0))
    led.failed(7.0, None, "peer_lost", None)
    report = led.report(9.0)
    (f,) = report["failures"]
    assert not f["recovered"] and not f["detection_known"] and f["steps_lost"] is None
    assert f["phases"]["lost_work"] == 1.0 and f["phases"]["teardown"] == 2.0
    assert (report["launch_s"], report["productive_s"], report["lost_s"]) == (2.0, 4.0, 3.0)


def test_a_hang_is_detected_from_its_last_sign_of_life() -> None:
    """Detection 2.5 s before it was learnt: the cause is then, and no work since the last step is lost."""
    led = Ledger(0.0)
    led.spawned(0.5, 0, "job")
    led.step(StepReport(4, None, 3.0))
    led.failed(5.5, 2.5, "timer_expired", {"kind": "watchdog", "class": "hang", "reason": "silent"})
    (f,) = led.report(6.0)["failures"]
    assert f["phases"]["lost_work"] == 0.0 and f["phases"]["detection"] == 2.5 and f["detection_known"]


def test_without_steps_the_ledger_counts_on_readiness() -> None:
    """No step ever reported: basis "ready"; the recovery ends when the new workers are ready."""
    led = Ledger(0.0)
    led.spawned(1.0, 0, "job")
    led.ready(2.0)
    led.failed(5.0, 0.0, "worker_failed", None)
    led.torn_down(5.5)
    led.entered_running(6.0)
    led.spawned(6.5, 1, "job")
    led.ready(7.0)
    report = led.report(10.0)
    assert report["basis"] == "ready"
    assert (report["launch_s"], report["productive_s"], report["lost_s"]) == (2.0, 6.0, 2.0)
    assert report["failures"][0]["steps_lost"] is None


def test_scope_worker_has_no_round_and_its_teardown_runs_to_the_spawn() -> None:
    """A replaced worker: no RENDEZVOUS; the time until the spawn is the teardown (stop one, backoff)."""
    led = Ledger(0.0)
    led.spawned(1.0, 0, "job")
    led.step(StepReport(3, None, 2.0))
    led.failed(3.0, 0.0, "worker_failed", None)
    led.spawned(4.0, 1, "worker")
    led.step(StepReport(3, None, 5.0))
    (f,) = led.report(6.0)["failures"]
    assert f["phases"]["teardown"] == 1.0 and f["phases"]["rendezvous"] == 0.0 and f["lost_s"] == 3.0


moments = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)
events = st.lists(st.one_of(
    st.tuples(st.just("step"), moments, st.integers(0, 50), st.one_of(st.none(), st.integers(0, 50))),
    st.tuples(st.just("failed"), moments, st.one_of(st.none(), moments)),
    st.tuples(st.just("spawned"), moments, st.sampled_from(["job", "worker"])),
    st.tuples(st.just("ready"), moments), st.tuples(st.just("torn_down"), moments),
    st.tuples(st.just("entered"), moments)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(events, moments)
def test_any_order_of_events_adds_up_to_the_wall_time(seq: list[tuple[Any, ...]], end: float) -> None:
    """Whatever arrives, in whatever order: spans never go back, the parts add up, ETTR is in [0, 1]."""
    led = Ledger(0.0)
    for attempt, (kind, at, *rest) in enumerate(seq):
        if kind == "step":
            led.step(StepReport(rest[0], rest[1], at))
        elif kind == "failed":
            led.failed(at, rest[0], "worker_failed", None)
        elif kind == "spawned":
            led.spawned(at, attempt, rest[0])
        elif kind == "ready":
            led.ready(at)
        elif kind == "torn_down":
            led.torn_down(at)
        else:
            led.entered_running(at)
    spans = led.spans(end)
    assert all(a.until <= b.until for a, b in itertools.pairwise(spans))
    r = led.report(end)
    parts = 2 + len(r["failures"])
    assert math.isclose(r["launch_s"] + r["productive_s"] + r["lost_s"], r["wall_s"], abs_tol=parts * ROUNDING_S)
    assert r["ettr"] is None or 0.0 <= r["ettr"] <= 1.0
    assert all(v >= 0 for f in r["failures"] for v in f["phases"].values())


def test_the_job_progresses_while_any_group_steps() -> None:
    """Replica groups: the job's productive time is the union of the groups' spans, within the longest wall."""
    groups = [{"group": 0, "wall_s": 10.0, "productive_spans": [[1.0, 4.0], [6.0, 10.0]], "ettr": 0.7},
              {"group": 1, "wall_s": 9.5, "productive_spans": [[2.0, 7.0]], "ettr": 0.5}]
    job = job_ledger(groups)
    assert (job["wall_s"], job["productive_s"], job["launch_s"], job["lost_s"]) == (10.0, 9.0, 1.0, 0.0)
    assert job["ettr"] == 0.9 and [g["group"] for g in job["groups"]] == [0, 1]
    assert job_ledger([])["ettr"] is None


def test_gauges_and_status_show_the_figures_or_say_unknown() -> None:
    """The gauges read NaN where there is nothing to read; `runner status` shows '-' / '?' for junk."""
    assert gauge_values(lambda: {"ettr": 0.5, "lost_s": 2.0}) == (0.5, 2.0)
    assert all(math.isnan(v) for v in gauge_values(None))
    assert all(math.isnan(v) for v in gauge_values(lambda: {"ettr": "junk"}))
    assert ettr({"ettr": 0.931, "lost_s": 3.14}) == "0.93 (lost 3.1s)"
    assert ettr({"ettr": 1.0, "lost_s": 0.0}) == "1.00"
    assert (ettr(None), ettr({"ettr": 7}), ettr({"ettr": True})) == ("-", "?", "?")
    rows = groups_table([{"group": 0, "state": "RUNNING", "ledger": {"ettr": 0.8, "lost_s": 1.0}}])
    assert rows[1].split()[-2:] == ["ETTR", "PIDS"] and rows[2].endswith("0.80 (lost 1.0s)  -")


# ---------------------------------------------------------------------------------------------- real jobs

# Steps every 0.1 s to step 30, the checkpoint every 10 steps (out/checkpoint), reported as
# {"step": N, "checkpoint": M} in $RUNNER_HEARTBEAT_FILE (atomically). Attempt 0 fails at step 17 as MODE says:
# crash (exit 3) or hang (sleeps without writing). The last attempt waits for out/release before ending.
WORKER = """
import json, os, sys, time
from pathlib import Path
mode, out = sys.argv[1], Path(sys.argv[2])
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
beat = Path(os.environ["RUNNER_HEARTBEAT_FILE"])
(out / f"rank{rank}.attempt{attempt}.json").write_text(json.dumps({"pid": os.getpid()}))
saved = out / "checkpoint"
start = int(saved.read_text()) if saved.exists() else 0
checkpoint = start
for step in range(start + 1, 31):
    time.sleep(0.1)
    if attempt == 0 and step == 17:
        if mode == "crash":
            sys.exit(3)
        time.sleep(3600)
    if step % 10 == 0:
        saved.write_text(str(step))
        checkpoint = step
    tmp = beat.with_name("heartbeat.tmp")
    tmp.write_text(json.dumps({"step": step, "checkpoint": checkpoint}))
    os.replace(tmp, beat)
(out / f"done-{attempt}").touch()
while not (out / "release").exists():
    time.sleep(0.05)
"""


def run_failing_job(job: Any, tmp_path: Path, mode: str, watchdog: str) -> tuple[dict[str, Any], float, str]:
    """Run WORKER in `mode` to success; check the live figures on the way. (report.json, seconds it ran, status)."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    port = free_port("127.0.0.1")
    j = job(f"""
        name: ledger
        entrypoint: {{script: {worker}, args: ["{mode}", "${{OUT}}"]}}
        nproc_per_node: 1
        restart: {{max_restarts: 2}}
        shutdown: {{grace_period: 5s}}
        logs: {{dir: "${{LOGS}}", tee: false}}
        metrics: {{enabled: true, host: 127.0.0.1, port: {port}}}
        {watchdog}
        """)
    began = time.monotonic()
    j.start()
    try:
        wait_for(lambda: (j.out / "done-1").exists(), 180, "attempt 1 at its last step")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                  if line.startswith(("runner_ettr ", "runner_lost_seconds "))}
        assert 0 < values["runner_ettr"] <= 1 and values["runner_lost_seconds"] > 0, values
        shown = j.cli("status")
        assert shown.returncode == 0, shown.stderr
        (j.out / "release").touch()
        _, err = j.proc.communicate(timeout=120)
    finally:
        j.stop()
    ran = time.monotonic() - began
    assert j.proc.returncode == 0, err
    report: dict[str, Any] = json.loads((j.run_dir() / "report.json").read_text())
    assert "Time ledger" in render(read_story([j.run_dir()]))  # the `runner report` page
    return report, ran, shown.stdout


def check_ledger(report: dict[str, Any], ran: float) -> dict[str, Any]:
    """The invariants every run's ledger keeps; its one failure's record."""
    led = report["ledger"]
    (f,) = led["failures"]
    assert led["basis"] == "steps" and led["failure_count"] == 1
    assert math.isclose(sum(f["phases"].values()), f["lost_s"], abs_tol=len(PHASES) * ROUNDING_S)
    assert math.isclose(led["launch_s"] + led["productive_s"] + led["lost_s"], led["wall_s"], abs_tol=3 * ROUNDING_S)
    assert abs(led["wall_s"] - report["duration_s"]) < 0.1  # the agent's own duration, read apart
    assert led["wall_s"] <= ran  # within what the test itself timed around the process
    assert 0 < led["ettr"] <= 1
    assert f["recovered"] and f["attempt"] == 1
    assert (f["last_step"], f["checkpoint"], f["resumed_from"], f["steps_lost"]) == (16, 10, 10, 6)
    assert f["phases"]["recompute"] >= 5 * 0.1  # steps 11..16 again, 0.1 s each at least
    return dict(f)


@pytest.mark.integration
def test_a_real_crash_is_in_the_ledger_report_status_and_metrics(job: Any, tmp_path: Path) -> None:
    """Exit 3 at step 17: detection 0 (the exit is the cause), some work since step 16 lost, 6 steps redone."""
    report, ran, status = run_failing_job(job, tmp_path, "crash", "")
    f = check_ledger(report, ran)
    assert f["trigger"] == "worker_failed" and f["detection_known"] and f["phases"]["detection"] == 0.0
    assert f["phases"]["lost_work"] > 0  # step 17 was under way
    assert re.search(r"node \S+: RUNNING attempt 1 .* ETTR 0\.\d\d \(lost \d+\.\d+s\)", status), status  # runner status


@pytest.mark.integration
def test_a_real_hang_is_detected_after_the_heartbeat_timeout(job: Any, tmp_path: Path) -> None:
    """The worker stops writing at step 16 and sleeps: detection >= heartbeat_timeout, from its last report."""
    report, ran, _ = run_failing_job(job, tmp_path, "hang", "watchdog: {heartbeat_timeout: 2s}")
    f = check_ledger(report, ran)
    assert f["trigger"] == "timer_expired" and f["failure_class"] == "hang" and f["detection_known"]
    assert f["phases"]["detection"] >= 2.0 - 0.01  # the file's time is the kernel's (coarse by a few ms)
    assert f["phases"]["lost_work"] < 0.05  # the last sign of life was the last step's report


GROUP_WORKER = Path(__file__).parents[1] / "fixtures" / "workers" / "group_worker.py"  # rank 0 writes {"step": N} after each step


@pytest.mark.integration
@needs_torchft
def test_replica_groups_each_have_a_ledger_and_the_job_goes_on_while_one_group_steps(job: Any) -> None:
    """Group 1 fails at step 10 and recovers while group 0 steps on: the job lost nothing the groups' union did
    not cover, each group's ledger ends with the group (group 0 ends first), and every part adds up."""
    j = job(f"""
        version: 1
        name: groups
        entrypoint: {{script: "{GROUP_WORKER}", args: ["--out", "${{OUT}}", "--steps", "30", "--fail-group", "1",
                                                     "--fail-attempts", "1", "--fail-at", "10"]}}
        replica_groups: {{count: 2, nproc_per_node: 1, min_active: 1}}
        restart: {{max_restarts: 2, backoff: {{initial: 0s}}}}
        shutdown: {{grace_period: 5s}}
        logs: {{dir: "${{LOGS}}", tee: false}}
        """)
    done = j.run(timeout=240)
    assert done.returncode == 0, done.stderr
    report = json.loads((j.run_dir() / "report.json").read_text())
    groups = {g["group"]: g["ledger"] for g in report["groups"]}
    for led in groups.values():
        assert math.isclose(led["launch_s"] + led["productive_s"] + led["lost_s"], led["wall_s"],
                            abs_tol=3 * ROUNDING_S)
    (f,) = groups[1]["failures"]
    assert f["recovered"] and f["last_step"] == 9 and f["steps_lost"] == 9  # no checkpoint: it starts at step 1
    assert groups[0]["failure_count"] == 0 and groups[0]["wall_s"] < groups[1]["wall_s"]
    job_led = report["ledger"]
    assert job_led["wall_s"] == max(led["wall_s"] for led in groups.values()) <= report["duration_s"]
    assert math.isclose(job_led["launch_s"] + job_led["productive_s"] + job_led["lost_s"], job_led["wall_s"],
                        abs_tol=3 * ROUNDING_S)
    assert job_led["productive_s"] >= max(led["productive_s"] for led in groups.values())
    assert 0 < job_led["ettr"] <= 1 and job_led["lost_s"] < f["lost_s"]
