"""The shipped examples run for real (torch workers, gloo on the CPU) through the CLI."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import EXAMPLES, RUNNER

pytestmark = pytest.mark.integration


def run_example(name: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m runner examples/jobs/<name>` with logs under tmp_path (logs.dir is relative to the cwd)."""
    return subprocess.run(
        [*RUNNER, str(EXAMPLES / name)],
        cwd=tmp_path, env=dict(os.environ, **env), capture_output=True, text=True, timeout=300, check=False,
    )


def test_hello_all_reduce_and_torchelastic_launched(tmp_path):
    """hello.yaml: both ranks all_reduce to 3 and torch sees itself launched by torchelastic."""
    res = run_example("hello.yaml", tmp_path)
    assert res.returncode == 0, res.stderr
    for rank in (0, 1):
        assert f"rank {rank}/2: all_reduce=3 ok, torchelastic_launched=True" in res.stdout
    assert list(tmp_path.glob("runner-logs/hello/*/attempt_0/rank_1/stdout.log"))


def test_restart_example_recovers_on_attempt_1(tmp_path):
    """restart.yaml: rank 1 raises on attempt 0 (error file written by @record); attempt 1 succeeds."""
    res = run_example("restart.yaml", tmp_path)
    assert res.returncode == 0, res.stderr
    assert "rank 1: attempt 1 ok" in res.stdout and "rank 0: attempt 1 ok" in res.stdout
    assert "attempt 0: rank 1 exited with code 1" in res.stderr
    assert list(tmp_path.glob("runner-logs/restart/*/attempt_0/rank_1/error.json"))


def test_ddp_cpu_trains(tmp_path):
    """ddp_cpu.yaml: a real DDP loop converges toward w=3, b=1."""
    res = run_example("ddp_cpu.yaml", tmp_path, STEPS="40")
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if "done: 40 steps on 2 ranks" in ln)
    w = float(line.split("w=")[1].split()[0])
    assert 2.0 < w < 4.0, line
