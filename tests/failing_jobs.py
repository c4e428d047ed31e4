"""One-worker jobs of tests/fixtures/workers/failing_worker.py (it raises, exits or hangs on the attempts asked), their
report and their worker's pid: for the failure-class tests and the restart-budget tests alike.
"""

from __future__ import annotations

import json
from typing import Any

from conftest import ROOT, Job, wait_for

WORKER = ROOT / "tests" / "fixtures" / "workers" / "failing_worker.py"
JOB = """
name: fc
entrypoint:
  script: {worker}
  args: ["--dir", "${{OUT}}", "--mode", "{mode}", "--fail-attempts", "{fails}"]
nproc_per_node: 1
logs: {{dir: "${{LOGS}}"}}
restart:
  max_restarts: {max_restarts}
  backoff: {{initial: 0.1s, max: 0.2s}}
{extra}
shutdown: {{grace_period: 5s}}
"""


def failing_job(job: Any, mode: str, *, fails: int = 1, max_restarts: int = 0, extra: str = "") -> Job:
    """A one-worker job of failing_worker.py in `mode` (fails on attempts < `fails`)."""
    text = JOB.format(worker=WORKER, mode=mode, fails=fails, max_restarts=max_restarts, extra=extra)
    made: Job = job(text)
    return made


def report(j: Job) -> dict[str, Any]:
    """The run's report.json."""
    data: dict[str, Any] = json.loads((j.run_dir() / "report.json").read_text())
    return data


def worker_pid(j: Job, attempt: int = 0) -> int:
    """The pid the worker of rank 0 wrote on `attempt` (waits for it)."""
    path = j.out / f"rank0.attempt{attempt}.json"
    wait_for(path.exists, what=f"worker of attempt {attempt} started")
    pid: int = json.loads(path.read_text())["pid"]
    return pid
