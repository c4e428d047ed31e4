"""The watchdog inside a real run: torch's FileTimerClient in real workers, heartbeats, max_run_time."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import EXAMPLES, ROOT, RUNNER

pytestmark = pytest.mark.integration


def run(tmp_path: Path, spec: Path) -> subprocess.CompletedProcess[str]:
    """Run a spec through the CLI with logs in tmp_path."""
    return subprocess.run(
        [*RUNNER, str(spec)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env=dict(os.environ, ROOT=str(ROOT)),
    )


def transitions(tmp_path: Path, job: str) -> list[tuple[str, str, str]]:
    """(src, trigger, dst) of the job's only run."""
    (run_dir,) = [d for d in (tmp_path / "runner-logs" / job).iterdir() if not d.is_symlink()]
    lines = (run_dir / "transitions.jsonl").read_text().splitlines()
    return [(e["src"], e["trigger"], e["dst"]) for e in map(json.loads, lines)]


def test_expiry_fails_the_attempt_and_the_job_recovers(tmp_path):
    """A hung scope on rank 1: FAILED with the scope and rank named, stacks kept, then attempt 1 succeeds."""
    res = run(tmp_path, EXAMPLES / "watchdog.yaml")
    assert res.returncode == 0, res.stderr
    edges = transitions(tmp_path, "watchdog")
    assert ("RUNNING", "timer_expired", "FAILED") in edges
    assert edges[-1] == ("RUNNING", "workers_succeeded", "SHUTDOWN")
    assert "watchdog: scope 'train_step' on rank 1 expired after 2.0 s" in res.stderr
    failure = json.loads(next(tmp_path.glob("runner-logs/watchdog/*/attempt_0/failure.json")).read_text())
    assert failure["kind"] == "watchdog" and failure["rank"] == 1
    assert "train_step" in failure["stacks"]  # py-spy saw where it hung
    assert (
        "train_step (hang.py" in next(tmp_path.glob("runner-logs/watchdog/*/attempt_0/rank_1/stacks.txt")).read_text()
    )


def test_scopes_released_in_time_are_not_failures(tmp_path):
    """Every scope released before its deadline: one attempt, no failure."""
    spec = tmp_path / "job.yaml"
    spec.write_text(
        (EXAMPLES / "watchdog.yaml")
        .read_text()
        .replace('"--hang-attempts", "1"', '"--hang-attempts", "0"')
        .replace("script: hang.py", f"script: {EXAMPLES / 'hang.py'}")
    )
    res = run(tmp_path, spec)
    assert res.returncode == 0, res.stderr
    assert transitions(tmp_path, "watchdog")[-1] == ("RUNNING", "workers_succeeded", "SHUTDOWN")
    assert "after 1 attempt;" in res.stderr


@pytest.mark.parametrize("beats", [1, 5])
def test_silent_heartbeat_is_a_hang(tmp_path, beats):
    """A worker that stops touching RUNNER_HEARTBEAT_FILE (after one touch, or five) is killed and reported; the
    budget then gives up."""
    spec = tmp_path / "job.yaml"
    spec.write_text(f"""
name: hb
entrypoint: {{script: {ROOT / "tests/fixtures/workers/heartbeat_worker.py"}, args: ["{beats}"]}}
nproc_per_node: 1
watchdog: {{enabled: true, heartbeat_timeout: 1s}}
restart: {{max_restarts: 0}}
shutdown: {{grace_period: 2s}}
""")
    res = run(tmp_path, spec)
    assert res.returncode == 1
    assert ("RUNNING", "timer_expired", "FAILED") in transitions(tmp_path, "hb")
    assert "watchdog: rank 0 sent no heartbeat for" in res.stderr


def test_a_script_that_never_heartbeats_is_not_hung_and_is_told_once(tmp_path):
    """heartbeat_timeout 1 s, two workers that never touch their heartbeat file and work for 4 s: not timed, the
    job succeeds; the run says once (one event in agent.jsonl, one console line) what to add to the script."""
    spec = tmp_path / "job.yaml"
    spec.write_text("""
name: nohb
entrypoint: {command: [sleep, "4"]}
nproc_per_node: 2
watchdog: {heartbeat_timeout: 1s}
restart: {max_restarts: 0}
logs: {format: console}
""")
    res = run(tmp_path, spec)
    assert res.returncode == 0, res.stderr
    assert transitions(tmp_path, "nohb")[-1] == ("RUNNING", "workers_succeeded", "SHUTDOWN")
    assert "heartbeat_silent" not in res.stderr and "sent no heartbeat for" not in res.stderr
    (run_dir,) = [d for d in (tmp_path / "runner-logs" / "nohb").iterdir() if not d.is_symlink()]
    events = [e for e in map(json.loads, (run_dir / "agent.jsonl").read_text().splitlines())
              if e.get("event") == "heartbeat_never_sent"]
    assert len(events) == 1, events
    assert events[0]["level"] == "warning" and events[0]["rank"] in (0, 1)
    said = [line for line in res.stderr.splitlines() if "sent no heartbeat in its first" in line]
    assert len(said) == 1, res.stderr
    assert "does not touch RUNNER_HEARTBEAT_FILE, so watchdog.heartbeat_timeout does not time its workers" in said[0]
    hints = [line for line in res.stderr.splitlines() if 'Path(os.environ["RUNNER_HEARTBEAT_FILE"]).touch()' in line]
    assert len(hints) == 1 and hints[0].split()[0] == "hint", res.stderr


def test_max_run_time_ends_the_job_with_its_own_reason(tmp_path):
    """A job past watchdog.max_run_time is stopped: trigger deadline_reached, exit 1, reason names the limit."""
    spec = tmp_path / "job.yaml"
    spec.write_text("""
name: slow
entrypoint: {command: [sleep, "60"]}
nproc_per_node: 2
watchdog: {max_run_time: 1s}
shutdown: {grace_period: 2s}
""")
    res = run(tmp_path, spec)
    assert res.returncode == 1
    assert transitions(tmp_path, "slow")[-1] == ("RUNNING", "deadline_reached", "SHUTDOWN")
    assert "max_run_time (1 s) reached" in res.stderr


def test_each_rank_has_its_own_channel_and_cannot_arm_another_ranks_timer(tmp_path):
    """Every rank's TORCHELASTIC_TIMER_FILE is its own FIFO; a request written on another rank's FIFO is
    refused (counted in a summary) instead of killing anyone."""
    spec = tmp_path / "job.yaml"
    spec.write_text(f"""
name: spoof
entrypoint: {{script: {ROOT / "tests/fixtures/workers/timer_worker.py"}, args: ["spoof", "1.5"]}}
nproc_per_node: 2
watchdog: {{enabled: true}}
restart: {{max_restarts: 0}}
""")
    res = run(tmp_path, spec)
    assert res.returncode == 0, res.stderr
    assert transitions(tmp_path, "spoof")[-1] == ("RUNNING", "workers_succeeded", "SHUTDOWN")
    files = {
        int(p.parent.name.removeprefix("rank_")): p.read_text().split("timer file ", 1)[1].split()[0]
        for p in tmp_path.glob("runner-logs/spoof/*/attempt_0/rank_*/stdout.log")
    }
    assert sorted(files) == [0, 1]
    assert files[0] != files[1]
    assert all(f.endswith(f"/timer/rank_{r}.fifo") for r, f in files.items())
    assert "unreadable watchdog timer request(s) of local rank" in res.stderr  # the timer_requests_rejected warning
    assert "other_rank" in res.stderr


def test_timer_requests_count_as_heartbeats(tmp_path):
    """A worker that touched its heartbeat file once (so it is timed) and then only keeps re-arming a timer scope is
    alive: no kill."""
    spec = tmp_path / "job.yaml"
    spec.write_text(f"""
name: tick
entrypoint: {{script: {ROOT / "tests/fixtures/workers/heartbeat_worker.py"}, args: ["tick", "4"]}}
nproc_per_node: 1
watchdog: {{enabled: true, heartbeat_timeout: 1s}}
restart: {{max_restarts: 0}}
""")
    res = run(tmp_path, spec)
    assert res.returncode == 0, res.stderr
    assert transitions(tmp_path, "tick")[-1] == ("RUNNING", "workers_succeeded", "SHUTDOWN")
    assert "sent no heartbeat for" not in res.stderr  # no heartbeat_silent warning, no failure
