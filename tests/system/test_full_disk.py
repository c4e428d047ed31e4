"""No write can take the agent down: a logs.dir that is full before the start, fills up during the run, runs out
of inodes or is read-only, on real tmpfs mounts (root), with real agents and workers.

The property: the exit code depends only on the workers' outcome (0 when they succeed, 1 when one fails), the agent
never ends in an internal error or a traceback, and report.json is where the summary says (the run dir, else
the fallback: <state dir>/reports/, then the temp dir).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ci_skips import need
from conftest import RUNNER, Job, kill_proven
from torchft_mark import needs_torchft

pytestmark = pytest.mark.integration

# Prints LINES lines of 100 bytes on stdout and stderr; writes that fail (its log file on the full disk, with
# logs.tee off) are ignored, so its outcome is its own: rank 1 exits with $EXIT, everybody else with 0.
WORKER = """
import os, sys
line = b"x" * 99 + b"\\n"
for i in range(int(os.environ["LINES"])):
    for fd in (1, 2):
        try:
            os.write(fd, line)
        except OSError:
            pass
sys.exit(int(os.environ["EXIT"]) if os.environ["RANK"] == "1" else 0)
"""

Mount = Callable[..., Path]


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Mount]:
    """Factory: tmpfs(name, size='64k', options='') mounts a tmpfs at tmp_path/name; all unmounted at the end."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        need("mounting a tmpfs needs root and mount(8)")
    mounted: list[Path] = []

    def mount(name: str, size: str = "64k", options: str = "") -> Path:
        where = tmp_path / name
        where.mkdir()
        opts = f"size={size}" + (f",{options}" if options else "")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True,
                              check=False)
        if done.returncode != 0:
            need(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(folder: Path) -> None:
    """Write a file in `folder` until the disk refuses (ENOSPC)."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError as e:
        assert e.errno == 28, e
    finally:
        os.close(fd)


def top_up(path: Path) -> None:
    """Append to `path` (on a full disk) until even its last page is full: the next write to it fails."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for _ in range(65536):
            os.write(fd, b"\n")
    except OSError as e:
        assert e.errno == 28, e
    else:
        raise AssertionError(f"{path}: 64 KiB more fit on a full disk")
    finally:
        os.close(fd)


def fill_inodes(folder: Path) -> None:
    """Create empty files in `folder` until no inode is left: no folder can be made there either."""
    for i in range(100000):
        try:
            os.close(os.open(folder / f"i{i}", os.O_WRONLY | os.O_CREAT, 0o600))
        except OSError as e:
            assert e.errno == 28, e
            return
    raise AssertionError("the tmpfs never ran out of inodes")


def run_job(job: Callable[[str], Job], logs: Path, *, tee: bool, lines: int, exit_code: int,
            tmpdir: Path, entry: str = "command") -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run a 2-rank job of WORKER with logs.dir `logs`; (its result, the state dir: the report's fallback).

    entry "command": `python -c WORKER` (never a standby); "script": WORKER as a script, the default path (forked
    from the fork server).
    """
    script = tmpdir / "worker.py"
    script.write_text(WORKER)
    how = (f'command: [{json.dumps(sys.executable)}, "-c", {json.dumps(WORKER)}]' if entry == "command"
           else f"script: {json.dumps(str(script))}")
    j = job(f"""
        version: 1
        name: disk
        entrypoint:
          {how}
        nproc_per_node: 2
        env: {{LINES: "{lines}", EXIT: "{exit_code}"}}
        restart: {{max_restarts: 0}}
        logs: {{dir: "{logs}", tee: {json.dumps(tee)}}}
    """)
    env = {**j.env(), "TMPDIR": str(tmpdir)}  # the fallback for logs: this test's own
    done = subprocess.run([*RUNNER, str(j.spec)], cwd=j.tmp, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    return done, j.tmp / "state"


def summary_paths(stderr: str) -> tuple[Path, Path]:
    """(the run dir, where report.json is) as the summary names them."""
    run_dir = report = None
    for line in stderr.splitlines():
        if line.startswith("runner: logs: "):
            run_dir = Path(line.removeprefix("runner: logs: "))
        elif line.startswith("runner: report: "):
            report = Path(line.removeprefix("runner: report: ").split(" (")[0])
    assert run_dir is not None, stderr[-3000:]
    return run_dir, report or run_dir / "report.json"


def assert_clean_end(done: subprocess.CompletedProcess[str], expected: int) -> dict[str, object]:
    """The exit code is the workers'; no internal error, no traceback of runner's own; report.json is where the
    summary says. (A failed worker's own traceback is its root cause: the summary quotes it, indented.)"""
    tail = done.stderr[-4000:]
    assert done.returncode == expected, tail
    own = "\n".join(line for line in done.stderr.splitlines()  # not the workers' echoed output nor its quotes
                     if not line.startswith(("runner:    ", "[")) and '"stderr_tail"' not in line)
    for bad in ("internal error", "Traceback", "Exception in callback", "Exception ignored"):
        assert bad not in own, tail
    _, report_path = summary_paths(done.stderr)
    assert report_path.is_file(), tail
    report = json.loads(report_path.read_text())
    assert report["exit_code"] == expected
    assert report["outcome"] == ("succeeded" if expected == 0 else "failed")
    return report


@pytest.mark.parametrize("exit_code", [0, 1], ids=["workers-succeed", "worker-fails"])
@pytest.mark.parametrize("tee", [True, False], ids=["tee", "no-tee"])
@pytest.mark.parametrize("size", ["64k", "1m"])
def test_a_logs_dir_filled_during_the_run(job, tmpfs, tmp_path, size, tee, exit_code):
    """The workers fill logs.dir with their own output: every later write of the agent and the tee fails."""
    logs = tmpfs("logs", size)
    lines = 8000 if size == "1m" else 400  # 2 ranks x 2 streams x 100 bytes: several times the disk
    done, state = run_job(job, logs, tee=tee, lines=lines, exit_code=exit_code, tmpdir=tmp_path)
    assert_clean_end(done, exit_code)
    run_dir, report = summary_paths(done.stderr)
    assert run_dir.is_relative_to(logs)  # the disk took the run dir at the start
    assert "No space left on device" in done.stderr  # said once per kind, as a warning
    if report.parent != run_dir:
        assert report.is_relative_to(state / "runner" / "reports")


@pytest.mark.parametrize("exit_code", [0, 1], ids=["workers-succeed", "worker-fails"])
@pytest.mark.parametrize("tee", [True, False], ids=["tee", "no-tee"])
@pytest.mark.parametrize("size", ["64k", "1m"])
def test_a_logs_dir_full_before_the_start(job, tmpfs, tmp_path, size, tee, exit_code):
    """logs.dir is full before the agent starts: the job runs all the same, its logs in the temp dir."""
    logs = tmpfs("logs", size)
    fill(logs)
    done, _ = run_job(job, logs, tee=tee, lines=50, exit_code=exit_code, tmpdir=tmp_path)
    assert_clean_end(done, exit_code)
    run_dir, report = summary_paths(done.stderr)
    assert run_dir.is_relative_to(tmp_path / "runner-logs"), done.stderr[-3000:]
    assert report == run_dir / "report.json"  # the temp dir took everything
    assert f"logs dir unwritable: {logs}: No space left on device" in done.stderr
    stdout_log = run_dir / "attempt_0" / "rank_1" / "stdout.log"  # rank 1 always ends on its own (rank 0 may be
    assert stdout_log.read_bytes().count(b"\n") == 50  # stopped early when rank 1 fails): its whole log is there


# A user's script as it is written: plain print() on both streams, no guard against a failing write; rank 1 raises
# when $EXIT is not 0. Each rank marks in $OUT (not on the logs disk) that it printed everything.
SCRIPT = """
import os, sys
rank = os.environ["RANK"]
for i in range(int(os.environ["LINES"])):
    print("o" * 99)
    print("e" * 99, file=sys.stderr)
open(os.path.join(os.environ["OUT"], "done-" + rank), "w").close()
if rank == "1" and os.environ["EXIT"] != "0":
    raise RuntimeError("rank 1 failed on purpose")
"""


@pytest.mark.parametrize("exit_code", [0, 1], ids=["workers-succeed", "worker-fails"])
@pytest.mark.parametrize("tee", [True, False], ids=["tee", "no-tee"])
def test_a_logs_dir_filling_under_the_default_spec_never_fails_a_workers_print(job, tmpfs, tmp_path, tee, exit_code):
    """The product's defaults (a script entrypoint, forked from the warm fork server, preload [torch]): workers
    that print() to a 1 MiB logs disk they fill finish their work; the job's result is theirs, and a failed rank's
    root cause (its traceback, kept in the agent's memory) is in report.json although the disk lost it."""
    logs = tmpfs("logs", "1m")
    (tmp_path / "w.py").write_text(SCRIPT)
    j = job(f"""
        version: 1
        name: diskdefault
        entrypoint: {{script: "{tmp_path / 'w.py'}"}}
        nproc_per_node: 2
        env: {{LINES: "8000", EXIT: "{exit_code}", OUT: "{tmp_path}"}}
        restart: {{max_restarts: 1, backoff: {{initial: 0s}}}}
        logs: {{dir: "{logs}", tee: {json.dumps(tee)}}}
    """)
    env = {**j.env(), "TMPDIR": str(tmp_path)}
    done = subprocess.run([*RUNNER, str(j.spec)], cwd=j.tmp, env=env, capture_output=True,
                          text=True, timeout=180, check=False)
    report = assert_clean_end(done, exit_code)
    assert report["standby"]["handed_off"] >= 2, report["standby"]  # the default path: workers forked warm
    assert (tmp_path / "done-1").exists()  # every print of rank 1 returned (rank 0 may be stopped when it fails)
    assert exit_code or (tmp_path / "done-0").exists()
    assert report["attempts"] == (2 if exit_code else 1)  # a failing rank 1 is its own failure, retried once
    lost = report["output_lost_bytes"]
    assert sum(lost.values()) > 0, lost  # 2 ranks x 1.6 MB onto 1 MiB: counted, by rank
    if exit_code:
        assert "RuntimeError: rank 1 failed on purpose" in json.dumps(report["failures"][0]), report["failures"][0]


def test_a_logs_dir_out_of_inodes_cannot_hold_a_run_dir_and_the_job_runs(job, tmpfs, tmp_path):
    """Not even a folder can be made in logs.dir (no inode left): the run dir goes to the temp dir."""
    logs = tmpfs("logs", "1m", "nr_inodes=64")
    fill_inodes(logs)
    done, _ = run_job(job, logs, tee=True, lines=10, exit_code=0, tmpdir=tmp_path)
    assert_clean_end(done, 0)
    run_dir, _ = summary_paths(done.stderr)
    assert run_dir.is_relative_to(tmp_path / "runner-logs")


@pytest.mark.parametrize("entry", ["command", "script"])
def test_a_read_only_logs_dir_is_refused_before_any_worker_starts(job, tmpfs, tmp_path, entry):
    """A logs.dir nobody may write is a mistake in the spec: exit 2 with the field named, nothing started (no fork
    server either: the default script entrypoint)."""
    logs = tmpfs("logs", "64k", "ro")
    done, state = run_job(job, logs, tee=True, lines=10, exit_code=0, tmpdir=tmp_path, entry=entry)
    assert done.returncode == 2, done.stderr
    assert "logs.dir" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "runner-logs").exists() and not (state / "runner" / "runs.jsonl").exists()


@needs_torchft
def test_a_full_logs_disk_does_not_kill_the_hosted_lighthouse(tmpfs, tmp_path: Path) -> None:
    """Replica groups with logs.dir on a tmpfs filled during the run, then the lighthouse SIGKILLed: its restart
    prints to a pipe the agent drains (fail soft), not to the full disk, so it starts and the job succeeds. Before,
    torchft_lighthouse exited 120 on its first failed write and the agent gave up on it."""

    from conftest import ROOT, wait_for

    worker = ROOT / "tests" / "fixtures" / "workers" / "group_worker.py"  # (tests/agent/test_replica_groups.py's worker)

    logs = tmpfs("logs", size="1m")
    j = Job(tmp_path / "job", f"""
        version: 1
        name: fulllight
        entrypoint: {{script: "{worker}", args: ["--out", "${{OUT}}", "--steps", "80", "--step-s", "0.1"]}}
        replica_groups: {{count: 2, nproc_per_node: 1}}
        restart: {{max_restarts: 2, backoff: {{initial: 0s}}}}
        shutdown: {{grace_period: 5s}}
        logs: {{dir: "{logs}"}}
        """)
    j.logs = logs  # where run_dir() looks
    j.start()

    def lighthouse() -> dict[str, int]:
        try:
            return dict(json.loads((j.run_dir() / "status.json").read_text()).get("lighthouse", {}))
        except (OSError, ValueError, AssertionError):
            return {}

    wait_for(lambda: lighthouse().get("pid"), what="the hosted lighthouse")
    first = lighthouse()["pid"]
    fill(logs)
    top_up(j.run_dir() / "lighthouse.log")  # its last page's slack too: any write of the lighthouse's now fails
    kill_proven(first, "torchft_lighthouse")
    _, err = j.proc.communicate(timeout=120)  # the status file cannot be rewritten: the agent's word is the summary
    assert j.proc.returncode == 0, err[-3000:]
    gone, restarting = "this node hosts is gone for good", "this node hosts exited"  # lighthouse_gone, _restarting
    assert gone not in err and restarting in err, err[-3000:]
    _, report = summary_paths(err)  # the replica job's summary names where report.json went (the disk is full)
    assert report.is_file(), err[-3000:]
    assert json.loads(report.read_text())["outcome"] == "succeeded"
