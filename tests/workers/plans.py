"""Launch plans for worker-group tests: one attempt of N local workers running a test script (no torch)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from runner.workers.launch_plan import LaunchPlan, WorkerPlan

HERE = Path(__file__).resolve().parent
ESCAPE = HERE / "escape_worker.py"


def plan(out: Path, args: list[str], n: int = 1, attempt: int = 0, script: Path = ESCAPE) -> LaunchPlan:
    """N workers of `script --dir out ARGS`, logs under out/logs."""
    workers = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n), PYTHONUNBUFFERED="1")
        workers.append(WorkerPlan(
            local_rank=r, rank=r, argv=(sys.executable, str(script), "--dir", str(out), *args),
            env=tuple(env.items()), contract=(), cwd=str(out), log_dir=str(out / "logs" / f"rank_{r}"),
        ))
    return LaunchPlan(attempt=attempt, run_id="t", node="n0", workers=tuple(workers))
