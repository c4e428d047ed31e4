"""A hang found with no change to the script (watchdog.stall_timeout, docs/hangs.md), on real gloo workers.

tests/fixtures/workers/stall_worker.py is a plain torch script: no heartbeat, no timer, no watchdog section in the spec
beyond the bound (6 s here; 300 s by default). A rank that sleeps while the other waits in all_reduce is found
within the bound and named; a slow but healthy job (a checkpoint written while the other rank waits in a barrier,
a long first step, a data loader warming up) runs to its end.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

WORKER = Path(__file__).resolve().parents[1] / "fixtures" / "workers" / "stall_worker.py"
BOUND_S = 6.0
SLOW_S = 15.0  # the healthy cases' slow part: longer than twice the bound

SPEC = """\
version: 1
name: sj
entrypoint:
  script: {script}
  args: {args}
nproc_per_node: 2
logs:
  dir: ${{LOGS}}
{watchdog}restart:
  max_restarts: 0
shutdown:
  grace_period: 5s
"""


def spec(mode: str, stamp: Path, *, bound: str | None = f"{BOUND_S:g}s") -> str:
    """The job's spec: the stall bound only (None: the default, unwritten)."""
    args = [mode, "--seconds", str(SLOW_S), "--stamp", str(stamp)]
    watchdog = f"watchdog:\n  stall_timeout: {bound}\n" if bound is not None else ""
    return SPEC.format(script=WORKER, args=json.dumps(args), watchdog=watchdog)


def test_a_hang_in_an_unchanged_script_is_found_within_the_bound_and_its_culprit_named(job, tmp_path):
    """Rank 1 sleeps; rank 0 waits in all_reduce (gloo's own timeout: 30 min). Found by no progress, in bound."""
    stamp = tmp_path / "stamp"
    j = job(spec("hang", stamp))
    res = j.run(timeout=150)
    ended = time.time()
    assert res.returncode == 1, res.stderr[-3000:]
    began = float(stamp.read_text())
    # Never before the bound, counted from the last sample that saw a move: that sample may precede the stamp by
    # one interval (bound/4), as the rank's few ticks between it and the stamp are under the CPU threshold (CI ran
    # one at 5.8 s). At most the bound, one interval, the recorder's query (3 s) and a loaded machine's slack.
    assert BOUND_S - BOUND_S / 4 <= ended - began < BOUND_S + 25, (ended - began, res.stderr[-2000:])
    report = json.loads((j.run_dir() / "report.json").read_text())
    (failure,) = report["failures"]
    assert failure["kind"] == "watchdog" and failure["class"] == "hang", failure
    assert failure["hang"]["finding"] == "never_entered"
    assert [c["rank"] for c in failure["hang"]["culprits"]] == [1]
    assert failure["rank"] == 1
    assert "made progress for" in failure["detected"] and "stall_timeout 6 s" in failure["detected"]
    assert "no CPU time, I/O, heartbeat or collective" in failure["detected"]
    assert "rank 1 (node" in res.stderr and "never entered all_reduce" in res.stderr
    assert "made progress for" in res.stderr
    assert "rank 1 (culprit)" in failure["stacks"] and "stall_worker.py" in failure["stacks"]


@pytest.mark.parametrize("mode", ["checkpoint", "first_step", "loader"])
def test_a_slow_but_healthy_job_is_never_killed(job, tmp_path, mode):
    """Rank 0 writes a checkpoint, computes a long first step, or waits for its data loader's warm-up, for 15 s
    (2.5 bounds) while rank 1 waits in a collective: the job ends well."""
    stamp = tmp_path / "stamp"
    j = job(spec(mode, stamp))
    res = j.run(timeout=150)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "rank 0: done" in res.stdout and "rank 1: done" in res.stdout
    assert "made progress" not in res.stderr
    assert '"event": "stall"' not in (j.run_dir() / "agent.jsonl").read_text()
