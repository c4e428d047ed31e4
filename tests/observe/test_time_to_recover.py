"""Time to recover: failure -> all workers running -> all workers ready, per restart (docs/time_to_recover.md).

Unit tests drive the recorder and the readiness watcher on an injected clock (no timing targets); the others run
real jobs: a worker crashes once, its replacement says it is ready by its heartbeat file, by torch's
FileTimerClient, or not at all, and the figures land in report.json, status.json, the summary and the metrics.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import statistics
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from ci_skips import need
from conftest import wait_for
from hypothesis import given
from hypothesis import strategies as st

from runner.observe.recovery import Recoveries
from runner.rendezvous.ports import free_port
from runner.report.page import render
from runner.report.story import read_story
from runner.watchdog.clock import AutojumpClock
from runner.watchdog.readiness import MAX_INTERVAL_S, Readiness

# A worker for the real runs. Attempt 0: rank CRASH_RANK exits 3 (the others wait for it to be replaced).
# Later attempts say they are ready as MODE says (heartbeat: touch $RUNNER_HEARTBEAT_FILE; timer: torch's
# FileTimerClient acquires and releases a scope; none: neither), write out/ready-<rank>, and wait for out/release.
WORKER = """
import json, os, sys, time
from pathlib import Path
mode, out = sys.argv[1], Path(sys.argv[2])
rank, attempt = os.environ["RANK"], int(os.environ["TORCHELASTIC_RESTART_COUNT"])
(out / f"rank{rank}.attempt{attempt}.json").write_text(json.dumps({"pid": os.getpid()}))
if attempt == 0 and rank == os.environ.get("CRASH_RANK", "0"):
    sys.exit(3)
if attempt > 0 and mode == "heartbeat":
    Path(os.environ["RUNNER_HEARTBEAT_FILE"]).touch()
if attempt > 0 and mode == "timer":
    from torch.distributed.elastic.timer.file_based_local_timer import FileTimerClient
    client = FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"], signal=0)
    client.acquire("first_step", time.time() + 60)
    client.release("first_step")
(out / f"ready-{rank}-{attempt}").touch()
while not (out / "release").exists():
    time.sleep(0.05)
"""

# ---------------------------------------------------------------------------------------------- the recorder


def test_launch_then_restart_running_before_ready_and_ready_waits_for_every_worker() -> None:
    """The launch counts from the agent's start and is not a recovery; a restart counts from the failure the
    agent saw; ready is set only once every worker of the attempt said so."""
    observed: list[tuple[str, float]] = []
    rec = Recoveries(launched_at=10.0, wall=lambda: 1000.0, observe=lambda p, s: observed.append((p, s)))
    launch = rec.running(10.5, 0, [0, 1])
    assert launch is rec.launch and launch is not None and launch.running_s == 0.5
    assert rec.ready(0, 11.0, "heartbeat") is None and rec.ready(1, 12.0, "timer") is launch
    assert launch.ready_s == 2.0 and launch.ready_by == {"heartbeat", "timer"}
    assert observed == []  # the launch is reported apart, never in the histogram
    rec.seen(20.0)  # RUNNING took the worker's exit off the queue
    rec.failed(20.25, "worker_failed", {"kind": "exit", "reason": "rank 1 exited with code 3", "rank": 1,
                                        "traceback": "long"})
    again = rec.running(21.0, 1, [0, 1])
    assert again is rec.last and again is not None
    assert again.running_s == 1.0  # from when the event was seen, not from the transition
    assert rec.ready(1, 21.5, "heartbeat") is None
    assert again.ready_s is None  # rank 0 has not said it is ready
    assert rec.ready(0, 22.0, "heartbeat") is again and again.ready_s == 2.0
    assert observed == [("running", 1.0), ("ready", 2.0)]
    d = again.to_dict()
    assert d["trigger"] == "worker_failed" and d["failure_kind"] == "exit" and d["reason"].startswith("rank 1")
    assert d["failure_at"] == 1000.0 - 0.25 and "traceback" not in json.dumps(d)
    assert rec.report()["time_to_recover"] == {"count": 1, "running": {"median_s": 1.0, "max_s": 1.0},
                                               "ready": {"median_s": 2.0, "max_s": 2.0}, "ready_unknown": 0}


def test_a_failure_not_restarted_is_no_recovery_and_a_replaced_worker_is_one() -> None:
    """A failure the policy gives up on leaves no record; scope worker waits only for the replaced rank."""
    rec = Recoveries(launched_at=0.0)
    rec.running(1.0, 0, [0, 1, 2])
    rec.failed(5.0, "worker_failed", {"kind": "exit", "rank": 2})
    rec.running(6.0, 1, [2], scope="worker")
    assert rec.ready(0, 6.5, "heartbeat") is None  # not a worker of this attempt
    done = rec.ready(2, 7.0, "heartbeat")
    assert done is not None and done.scope == "worker" and done.ready_s == 2.0
    rec.failed(9.0, "timer_expired", {"kind": "watchdog", "class": "hang"})
    assert len(rec.restarts) == 1  # given up: never running again
    assert rec.restarts[0].to_dict()["failure_class"] is None


def test_the_recovery_shows_the_failure_as_failed_classed_it() -> None:
    """FAILED may re-class the failure on evidence (an OOM kill) after the transition into it: the record keeps
    the final class, not the first guess."""
    rec = Recoveries(launched_at=0.0)
    rec.running(0.1, 0, [0])
    rec.failed(1.0, "worker_failed", {"kind": "worker", "class": "signal", "reason": "rank 0 killed by SIGKILL"})
    rec.classed({"kind": "worker", "class": "oom", "reason": "rank 0 killed by SIGKILL", "evidence": "cgroup"})
    again = rec.running(1.2, 1, [0])
    assert again is not None and again.to_dict()["failure_class"] == "oom"
    rec.classed({"kind": "worker", "class": "hang"})  # nothing pending: changes nothing recorded
    assert again.to_dict()["failure_class"] == "oom"


def test_ready_never_said_stays_unknown_and_the_summary_says_so() -> None:
    """An attempt whose workers never say they are ready, or that ends first, keeps ready_s None."""
    rec = Recoveries(launched_at=0.0)
    rec.running(0.1, 0, [0])
    rec.failed(1.0, "worker_failed", None)
    rec.running(1.5, 1, [0])
    rec.failed(3.0, "membership_changed", None)  # ends before rank 0 said it is ready
    assert rec.ready(0, 3.5, "heartbeat") is None
    rec.running(4.0, 2, [0])
    assert [r.ready_s for r in rec.restarts] == [None, None]
    assert rec.summary()["ready"] is None and rec.summary()["ready_unknown"] == 2
    assert "ready unknown for 2" in rec.line() and "to running median 0.750 s, max 1.000 s" in rec.line()
    assert rec.status()["recovery"]["trigger"] == "membership_changed"
    assert Recoveries(launched_at=0.0).line() == ""


@given(st.lists(st.tuples(st.floats(0, 1e4), st.floats(0, 1e4), st.lists(st.floats(0, 1e4), min_size=1,
                                                                           max_size=4)), max_size=20))
def test_every_recovery_is_running_then_ready_and_the_summary_bounds_them(
    restarts: list[tuple[float, float, list[float]]],
) -> None:
    """Whatever the times, running_s <= ready_s for every recovery, both >= 0, and median <= max."""
    rec = Recoveries(launched_at=0.0)
    now = 0.0
    for seen, spawn, ready in restarts:
        now += seen
        rec.failed(now, "worker_failed", {"kind": "exit"})
        now += spawn
        rec.running(now, len(rec.restarts) + 1, range(len(ready)))
        for rank, delay in enumerate(ready):
            rec.ready(rank, now + delay, "heartbeat")
    for r in rec.restarts:
        assert r.running_s is not None and r.ready_s is not None and 0 <= r.running_s <= r.ready_s
    summary = rec.summary()
    assert summary["count"] == len(restarts)
    if restarts:
        values = [r.ready_s for r in rec.restarts if r.ready_s is not None]
        assert summary["ready"]["median_s"] == round(statistics.median(values), 3)
    for phase in ("running", "ready"):
        if restarts:
            assert summary[phase]["median_s"] <= summary[phase]["max_s"]


# ------------------------------------------------------------------------------------- the readiness watcher


def test_readiness_from_the_heartbeat_file_and_from_a_timer_request(tmp_path: Path) -> None:
    """A heartbeat file that appears makes its rank ready (no earlier than it was watched); a timer request
    makes its rank ready at the request's time; each rank is reported once."""
    clock = AutojumpClock()
    seen: list[tuple[int, float, str]] = []

    async def scenario() -> None:
        ready = Readiness(lambda r, at, how: seen.append((r, at, how)), clock=clock)
        ready.watch({0: tmp_path / "hb0", 1: tmp_path / "hb1"})
        await asyncio.sleep(1.0)
        assert seen == [] and ready.waiting() == [0, 1]
        (tmp_path / "hb0").touch()
        await asyncio.sleep(1.0)
        ready.request(1, clock.monotonic())
        ready.request(1, clock.monotonic() + 5)  # a second request changes nothing
        (tmp_path / "hb1").touch()
        await asyncio.sleep(1.0)
        assert ready.waiting() == []

    clock.run(scenario())
    assert [(r, how) for r, _, how in seen] == [(0, "heartbeat"), (1, "timer")]
    assert 0.0 <= seen[0][1] <= 2.0 and seen[1][1] == 2.0


def test_readiness_never_said_costs_bounded_checks_and_clear_stops_them(tmp_path: Path) -> None:
    """Nobody touches the file: no report, and over 100 s the checks back off to one per MAX_INTERVAL_S."""
    clock = AutojumpClock()
    seen: list[int] = []

    async def scenario() -> None:
        ready = Readiness(lambda r, _at, _how: seen.append(r), clock=clock)
        ready.watch({0: tmp_path / "never"})
        await asyncio.sleep(100.0)
        ready.clear()
        jumps = clock.jumps
        await asyncio.sleep(100.0)
        assert clock.jumps - jumps <= 1  # nothing armed any more: one idle jump for our own sleep

    clock.run(scenario())
    assert seen == []
    assert clock.jumps <= 100 / MAX_INTERVAL_S + 10


# ------------------------------------------------------------------------------------------------ real runs


def spec(worker: Path, mode: str, *, extra: str = "", nproc: int = 1, crash_rank: int = 0) -> str:
    """A job running WORKER in `mode`, logs under ${LOGS}, rank `crash_rank` failing once."""
    return f"""
        name: ttr
        entrypoint: {{script: {worker}, args: ["{mode}", "${{OUT}}"]}}
        nproc_per_node: {nproc}
        env: {{CRASH_RANK: "{crash_rank}"}}
        restart: {{max_restarts: 2}}
        shutdown: {{grace_period: 5s}}
        logs: {{dir: "${{LOGS}}", tee: false}}
        {extra}
        """


def report_of(job: Any) -> dict[str, Any]:
    """The run's report.json."""
    data: dict[str, Any] = json.loads((job.run_dir() / "report.json").read_text())
    return data


def scrape(port: int) -> str:
    """GET /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text: str = resp.read().decode()
        return text


def sample(text: str, series: str) -> float | None:
    """One exact series' value."""
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else None


@pytest.mark.integration
def test_crash_then_heartbeat_one_recovery_in_report_status_summary_and_metrics(job: Any, tmp_path: Path) -> None:
    """Rank 0 exits 3, its next attempt touches its heartbeat file: one recovery, running_s <= ready_s, both
    known; status.json has it while the job runs; the histogram counts one of each phase; the summary says it."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    port = free_port("127.0.0.1")
    j = job(spec(worker, "heartbeat", extra=f"""watchdog: {{enabled: true, heartbeat_timeout: 1h}}
        metrics: {{enabled: true, host: 127.0.0.1, port: {port}}}"""))
    j.start()
    try:
        wait_for(lambda: (j.out / "ready-0-1").exists(), 120, "attempt 1 ready")
        ready = 'runner_time_to_recover_seconds_count{phase="ready"}'
        wait_for(lambda: sample(scrape(port), ready) == 1.0, 60, "the ready observation")
        text = scrape(port)
        assert sample(text, 'runner_time_to_recover_seconds_count{phase="running"}') == 1.0
        assert sample(text, 'runner_time_to_recover_seconds_bucket{le="+Inf",phase="ready"}') == 1.0
        status_file = j.run_dir() / "status.json"
        wait_for(lambda: (json.loads(status_file.read_text()).get("recovery") or {}).get("ready_s") is not None,
                 60, "status.json's ready_s")
        status = json.loads(status_file.read_text())
        assert status["recovery"]["attempt"] == 1 and status["recovery"]["ready_by"] == ["heartbeat"]
        shown = j.cli("status", "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["nodes"][0]["recovery"]["ready_s"] == status["recovery"]["ready_s"]
        (j.out / "release").touch()
        _, err = j.proc.communicate(timeout=120)
    finally:
        j.stop()
    assert j.proc.returncode == 0, err
    report = report_of(j)
    (rec,) = report["recoveries"]
    assert rec["attempt"] == 1 and rec["trigger"] == "worker_failed" and rec["failure_kind"] == "worker"
    assert rec["running_s"] is not None and rec["ready_s"] is not None
    assert 0 <= rec["running_s"] <= rec["ready_s"]
    assert rec["ready_by"] == ["heartbeat"]
    assert report["launch"]["running_s"] is not None and report["launch"]["ready_s"] is None  # attempt 0: silent
    assert report["time_to_recover"]["count"] == 1
    assert report["time_to_recover"]["ready"]["max_s"] == rec["ready_s"]
    assert "runner: time to recover: 1 recovery; to running median" in err
    restarts = render(read_story([j.run_dir()])).split('id="restarts"')[1].split("</table>")[0]
    assert f"<td>{rec['running_s']:.2f} s</td><td>{rec['ready_s']:.2f} s</td>" in restarts  # `runner report`


def released_once(j: Any, mark: str, timeout: float, what: str) -> str:
    """Start the job, wait for the worker's `mark` file, release the workers; the job must then exit 0 (its stderr)."""
    j.start()
    try:
        wait_for(lambda: (j.out / mark).exists(), timeout, what)
        (j.out / "release").touch()
        _, err = j.proc.communicate(timeout=120)
    finally:
        j.stop()
    assert j.proc.returncode == 0, err
    return str(err)


@pytest.mark.integration
def test_ready_from_the_first_file_timer_request(job: Any, tmp_path: Path) -> None:
    """The replacement's first FileTimerClient.acquire (torch's client, real FIFO) makes it ready."""
    need(None if importlib.util.find_spec("torch") else "torch is not installed (the `test` extra installs it)")
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    j = job(spec(worker, "timer", extra="watchdog: {enabled: true}"))
    released_once(j, "ready-0-1", 180, "attempt 1 ready")
    (rec,) = report_of(j)["recoveries"]
    assert rec["ready_by"] == ["timer"]
    assert rec["ready_s"] is not None and 0 <= rec["running_s"] <= rec["ready_s"]


@pytest.mark.integration
def test_without_heartbeat_or_timer_ready_is_unknown_scope_worker(job: Any, tmp_path: Path) -> None:
    """No watchdog, a worker that never says it is ready: ready_s stays null (never invented); with scope worker
    the one replaced rank is the recovery."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    j = job(spec(worker, "none", nproc=2, crash_rank=1).replace("max_restarts: 2", "max_restarts: 2, scope: worker"))
    err = released_once(j, "ready-1-1", 120, "the replaced rank 1")
    report = report_of(j)
    (rec,) = report["recoveries"]
    assert rec["scope"] == "worker" and rec["trigger"] == "worker_failed"
    assert rec["running_s"] is not None and rec["ready_s"] is None and rec["ready_by"] == []
    assert report["time_to_recover"]["ready_unknown"] == 1
    assert "ready unknown for 1" in err


# ------------------------------------------------------------------------------------------ `runner status`

JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                       lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                                   max_size=4), max_leaves=20)


def test_status_table_shows_the_last_recovery() -> None:
    """The RECOVERY column: both phases, '?' for a ready never said, '-' before any restart."""
    from runner.runs.status import recovery

    assert recovery({"running_s": 0.009, "ready_s": 1.3}) == "0.01s running → 1.30s ready"
    assert recovery({"running_s": 0.03, "ready_s": None}) == "0.03s running → ? ready"
    assert recovery(None) == "-"


@given(st.dictionaries(st.sampled_from(["running_s", "ready_s", "attempt"]), JSONISH | st.floats(1e300)) | JSONISH)
def test_status_table_takes_any_published_recovery(value: object) -> None:
    """Whatever a status file or etcd holds under `recovery`, the cell is one short line, never an error."""
    from runner.runs.status import recovery

    cell = recovery(value)
    assert "\n" not in cell and len(cell) < 40
