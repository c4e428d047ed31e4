"""The per-user runs index and what reads it: `runner runs`, `runner status JOB` from any directory, --watch.

Real jobs run with XDG_STATE_HOME in the test's tmp dir, so the user's own index is never touched."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from conftest import RUNNER, runner_cli, wait_for
from hypothesis import given
from hypothesis import strategies as st

from runner.runs import index as runs_index

SLEEPER = """\
import os, sys, time
time.sleep(float(os.environ.get("NAP", "0")))
print(f"rank {os.environ['RANK']} done", flush=True)
"""
SPEC = """\
version: 1
name: {name}
entrypoint: {{script: sleeper.py}}
nproc_per_node: 2
shutdown: {{grace_period: 5s}}
logs: {{dir: logs}}
"""


def test_index_lives_in_xdg_state_home_else_under_home() -> None:
    assert runs_index.index_path({"XDG_STATE_HOME": "/x/state"}) == Path("/x/state/runner/runs.jsonl")
    home = Path.home() / ".local" / "state" / "runner" / "runs.jsonl"
    assert runs_index.index_path({}) == home
    assert runs_index.index_path({"XDG_STATE_HOME": "relative/dir"}) == home  # the XDG spec: relative is invalid


def test_start_and_end_lines_make_one_run(tmp_path: Path) -> None:
    path = tmp_path / "state" / "runner" / "runs.jsonl"
    runs_index.append(runs_index.start_line("j", "n0", tmp_path / "r1", "local", now=10.0), path)
    runs_index.append(runs_index.start_line("j", "n0", tmp_path / "r2", "etcd", now=20.0), path)
    runs_index.append(runs_index.end_line("n0", tmp_path / "r1", "failed", 1, 4, 3, now=15.0), path)
    first, second = runs_index.read(path)
    assert (first.run_dir, first.outcome, first.exit_code, first.attempts, first.restarts, first.ended) == (
        str(tmp_path / "r1"), "failed", 1, 4, 3, 15.0)
    assert (second.backend, second.ended, second.outcome) == ("etcd", None, None)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_index_stays_bounded_and_keeps_the_latest_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs_index, "MAX_BYTES", 8192)
    monkeypatch.setattr(runs_index, "KEEP_RUNS", 10)
    path = tmp_path / "runs.jsonl"
    for i in range(300):
        runs_index.append(runs_index.start_line("j", "n", tmp_path / f"run{i:03d}", "local", now=float(i)), path)
        runs_index.append(runs_index.end_line("n", tmp_path / f"run{i:03d}", "succeeded", 0, 1, 0, now=i + 0.5), path)
        assert path.stat().st_size <= 8192 + 1024
    runs = runs_index.read(path)
    assert runs[-1].run_dir.endswith("run299") and runs[-1].outcome == "succeeded"
    assert 10 <= len(runs) < 60
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_loose_index_file_is_made_private_again(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text("")
    path.chmod(0o644)
    runs_index.append(runs_index.start_line("j", "n", tmp_path, "local"), path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


LINE = st.one_of(
    st.text(max_size=200),
    st.builds(json.dumps, st.dictionaries(st.sampled_from(["v", "kind", "job", "node", "run_dir", "time", "pid",
                                                           "outcome", "exit_code"]),
                                          st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                                                    st.text(max_size=20), st.sampled_from(["start", "end", 1])))),
)


@given(st.lists(LINE, max_size=30))
def test_any_index_content_parses_to_runs_or_is_skipped(lines: list[str]) -> None:
    runs = runs_index.parse(lines)
    assert all(isinstance(r.job, str) and isinstance(r.started, float) for r in runs)
    assert [r.started for r in runs] == sorted(r.started for r in runs)


def make_job(tmp_path: Path, name: str = "idx") -> Path:
    home = tmp_path / "project"
    home.mkdir(parents=True, exist_ok=True)
    (home / "sleeper.py").write_text(SLEEPER)
    spec = home / "job.yaml"
    spec.write_text(SPEC.format(name=name))
    return spec


def env(tmp_path: Path, **more: str) -> dict[str, str]:
    return dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"), PYTHONUNBUFFERED="1", **more)


def cli(tmp_path: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return runner_cli(*args, cwd=cwd, env=env(tmp_path))


def test_runs_and_status_by_name_from_another_directory(tmp_path: Path) -> None:
    spec = make_job(tmp_path)
    done = subprocess.run([*RUNNER, str(spec)], cwd=spec.parent, env=env(tmp_path),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    runs = cli(tmp_path, "runs", cwd=elsewhere)
    assert runs.returncode == 0, runs.stderr
    header, row = runs.stdout.splitlines()
    assert header.split()[:5] == ["JOB", "NODE", "STARTED", "STATE", "OUTCOME"]
    assert row.startswith("idx ") and " ended " in row and " succeeded " in row and str(spec.parent / "logs") in row
    by_json = [json.loads(ln) for ln in cli(tmp_path, "runs", "--json", cwd=elsewhere).stdout.splitlines()]
    assert by_json[0]["attempts"] == 1 and by_json[0]["exit_code"] == 0
    for target in ("idx", str(spec)):  # a job name, or a spec whose logs.dir is relative to another directory
        status = cli(tmp_path, "status", target, "--json", cwd=elsewhere)
        assert status.returncode == 0, status.stderr
        data = json.loads(status.stdout)
        assert data["status"] == "succeeded" and data["nodes"][0]["state"] == "SHUTDOWN"
    unknown = cli(tmp_path, "status", "no-such-job", cwd=elsewhere)
    assert unknown.returncode == 2 and "no run of job 'no-such-job'" in unknown.stderr and "Traceback" not in unknown.stderr


def test_status_watch_follows_a_real_job_to_its_end(tmp_path: Path) -> None:
    """Off a terminal, --watch prints on a change only; the totals in status.json are refreshed while it runs."""
    spec = make_job(tmp_path, "watched")
    job = subprocess.Popen([*RUNNER, str(spec)], cwd=spec.parent, env=env(tmp_path, NAP="6"),
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    watch = None
    try:
        index = runs_index.index_path({"XDG_STATE_HOME": str(tmp_path / "state")})
        wait_for(lambda: any(r.job == "watched" for r in runs_index.read(index)), what="the run in the index")
        run_dir = Path(runs_index.read(index)[-1].run_dir)
        def running() -> bool:  # RUNNING with its workers started (first the fork server imports the preload)
            try:
                status = json.loads((run_dir / "status.json").read_text())
            except (OSError, ValueError):
                return False
            return status["state"] == "RUNNING" and len(status.get("workers", [])) == 2

        wait_for(running, what="RUNNING with both workers")

        def wall_s() -> float:
            try:
                return float(json.loads((run_dir / "status.json").read_text())["ledger"]["wall_s"])
            except (OSError, ValueError, KeyError, TypeError):
                return -1.0

        first = wall_s()
        # No state changes while the workers nap: only the refresh (every 2 s) moves the totals on.
        wait_for(lambda: wall_s() >= first + 1.5, timeout=10, what="status.json's wall time refreshed while RUNNING")
        watch = subprocess.Popen([*RUNNER, "status", "--watch", "watched", "--interval", "0.2"],
                                 cwd=tmp_path, env=env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        out, err = watch.communicate(timeout=120)
        assert watch.returncode == 0, err
        assert job.wait(timeout=60) == 0
    finally:
        for proc in (job, watch):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    tables = out.strip().split("job watched · ")[1:]
    assert len(tables) >= 2, out  # a live table, then the final one
    # A few seconds of napping workers (uptime, "Ns ago" and the ETTR ticking) print no table of their own.
    assert len(tables) <= 3, out
    assert tables[0].startswith("running") and "RUNNING" in tables[0] and "0 run · 1 run" in tables[0], out
    assert tables[-1].startswith("succeeded") and "SHUTDOWN" in tables[-1] and "0 ok · 1 ok" in tables[-1], out
    assert "NODE  STATE" in tables[0] and "LAST EVENT" in tables[0]
