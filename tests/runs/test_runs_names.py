"""One run per name (runner/runs/resolve.py): `runner status NAME` and `runner report NAME` never answer with another
run of the same name started elsewhere on the machine.

Real runs of one job name from two project folders (two logs folders), with XDG_STATE_HOME in the test's tmp dir:
the live one is chosen, else the newest with the others named on stderr; two live runs are refused, naming their
run dirs; index entries whose run dir was moved or deleted are skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import RUNNER, runner_cli, wait_for

from runner.runs import index as runs_index

pytestmark = pytest.mark.integration

NAPPER = """\
import os, time
time.sleep(float(os.environ.get("NAP", "0")))
"""
SPEC = """\
version: 1
name: twin
entrypoint: {script: napper.py}
restart: {preload: []}
shutdown: {grace_period: 5s}
logs: {dir: logs}
"""


def env(tmp_path: Path, nap: float = 0) -> dict[str, str]:
    return dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"), PYTHONUNBUFFERED="1", NAP=str(nap))


def project(tmp_path: Path, name: str) -> Path:
    """A folder with the job `twin` (its logs folder inside it): the same name as in every other project here."""
    home = tmp_path / name
    home.mkdir()
    (home / "napper.py").write_text(NAPPER)
    (home / "job.yaml").write_text(SPEC)
    return home


def run_done(tmp_path: Path, home: Path, but: Path | None = None) -> Path:
    """Run the job to its end in `home`; its run dir (`but`: an earlier run dir there)."""
    res = subprocess.run([*RUNNER, "job.yaml"], cwd=home, env=env(tmp_path),
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    (run_dir,) = [d for d in (home / "logs" / "twin").iterdir() if not d.is_symlink() and d != but]
    return run_dir


def start_live(tmp_path: Path, home: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """Start the job in `home` with a worker that naps; return it once RUNNING, with its run dir."""
    before = set((home / "logs" / "twin").glob("*")) if (home / "logs" / "twin").exists() else set()
    proc = subprocess.Popen([*RUNNER, "job.yaml"], cwd=home, env=env(tmp_path, nap=120),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def running() -> bool:
        for d in set((home / "logs" / "twin").glob("*")) - before:
            try:
                if not d.is_symlink() and json.loads((d / "status.json").read_text())["state"] == "RUNNING":
                    return True
            except (OSError, ValueError, KeyError):
                continue
        return False

    wait_for(running, what="the live run RUNNING")
    (run_dir,) = [d for d in set((home / "logs" / "twin").glob("*")) - before if not d.is_symlink()]
    return proc, run_dir


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End a live run we started: SIGTERM to its agent (it stops its worker), then wait."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`runner ARGS` from a third folder (no logs of its own)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    return runner_cli(*args, cwd=elsewhere, env=env(tmp_path))


def status(tmp_path: Path, target: str = "twin") -> tuple[dict[str, object], str]:
    res = cli(tmp_path, "status", target, "--json")
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    return json.loads(res.stdout), res.stderr


def node_run_dir(data: dict[str, object]) -> str:
    (node,) = data["nodes"]  # type: ignore[misc]
    return str(node["run_dir"])


def test_the_live_run_else_the_newest_with_the_others_named(tmp_path: Path) -> None:
    a, b = project(tmp_path, "a"), project(tmp_path, "b")
    a_done = run_done(tmp_path, a)
    b_done = run_done(tmp_path, b)

    data, err = status(tmp_path)  # nothing live: the newest (b's), and a's run named on stderr
    assert node_run_dir(data) == str(b_done) and data["status"] == "succeeded"
    assert f"showing the newest run, {b_done}" in err and f"{a_done} (ended succeeded)" in err, err

    proc, a_live = start_live(tmp_path, a)  # a runs again, live; then b runs once more, a newer run that ends
    try:
        b_newer = run_done(tmp_path, b, but=b_done)
        data, err = status(tmp_path)  # the live run wins over the newest
        assert node_run_dir(data) == str(a_live) and data["status"] == "running", data
        assert f"showing the live run, {a_live}" in err and f"{b_newer} (ended succeeded)" in err, err
        assert str(a_done) not in err and str(b_done) not in err  # a folder's earlier runs: not other places
        report = cli(tmp_path, "report", "twin", "-o", str(tmp_path / "page.html"))
        assert report.returncode == 0, report.stderr
        assert str(a_live) in (tmp_path / "page.html").read_text() and str(b_newer) in report.stderr
    finally:
        stop(proc)


def test_two_live_runs_of_one_name_are_refused_naming_both(tmp_path: Path) -> None:
    a, b = project(tmp_path, "a"), project(tmp_path, "b")
    first, a_live = start_live(tmp_path, a)
    try:
        second, b_live = start_live(tmp_path, b)
        try:
            for command in ("status", "report"):
                res = cli(tmp_path, command, "twin")
                assert res.returncode == 2, res.stderr
                assert "Traceback" not in res.stderr
                assert "job name 'twin' is ambiguous: 2 runs of it are live" in res.stderr, res.stderr
                assert str(a_live) in res.stderr and str(b_live) in res.stderr
                assert "give the run dir of the one you mean" in res.stderr
            data, _ = status(tmp_path, str(b_live))  # what the refusal asks for: a run dir
            assert node_run_dir(data) == str(b_live) and data["status"] == "running"
        finally:
            stop(second)
    finally:
        stop(first)


def test_stale_entries_are_skipped(tmp_path: Path) -> None:
    """The index names runs whose run dirs were moved or deleted: skipped; when none is left, a refusal naming them."""
    a, b = project(tmp_path, "a"), project(tmp_path, "b")
    a_done = run_done(tmp_path, a)
    b_done = run_done(tmp_path, b)
    shutil.rmtree(b_done)  # the newest run's dir is gone
    data, err = status(tmp_path)
    assert node_run_dir(data) == str(a_done) and data["status"] == "succeeded"
    assert "no status for job" not in err and str(b_done) not in err
    shutil.move(a_done, tmp_path / "moved")
    res = cli(tmp_path, "status", "twin")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "no run of job 'twin' is left: the runs index names 2, whose run dir was moved or deleted" in res.stderr
    assert str(a_done) in res.stderr and str(b_done) in res.stderr
    index = runs_index.index_path({"XDG_STATE_HOME": str(tmp_path / "state")})
    assert len(runs_index.runs_of("twin", index)) == 2  # skipped, not forgotten: the index is the user's record
