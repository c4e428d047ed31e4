"""The shipped TorchFT example is quiet and honest: `runner examples/jobs/ft_train.yaml`, a real run of 2 replica groups
with the hosted lighthouse, prints a bounded number of lines, none of the third-party noise its scripts turn off
(docs/replica_groups.md, "What the examples do not print"), and every line a worker wrote reaches the console: the
agent filters nothing, the worker's log and the console hold the same record.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest
from conftest import EXAMPLES, RUNNER
from ft_records import records
from torchft_mark import needs_torchft

pytestmark = [pytest.mark.integration, needs_torchft]

STEPS = 60
# What torch and TorchFT printed on this console before (one case each, the examples' docstrings name the cause).
NOISE = (
    "Unable to reset NCCL flight recorder",  # TorchFT's Manager at every quorum (no NCCL here)
    "GET /checkpoint/",  # http.server's access line of TorchFT's checkpoint server
    "find_unused_parameters=True was specified",  # torch's C++ DDP reducer (TorchFT's DDP forces the flag)
    "The given buffer is not writable",  # torch's UserWarning on a recovering group's received state
)
WORKER_LINE = re.compile(r"^\[[^\]/]+/g(\d+):(\d+)\] (.*)$")


def test_the_shipped_spec_prints_a_few_dozen_lines_and_no_known_noise(tmp_path: Path) -> None:
    res = subprocess.run([*RUNNER, str(EXAMPLES / "ft_train.yaml")], cwd=tmp_path,
                         env=dict(os.environ, STEPS=str(STEPS)), capture_output=True, text=True, timeout=120,
                         check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    console = res.stdout + res.stderr
    lines = console.splitlines()
    # 2 x (start, step 1 or the first after a heal, a heal and the groups' change at the start, step 60, final),
    # about 25 agent events and the summary. Before --log-every and the filters: 2 lines per step, over 150 here.
    assert len(lines) <= 60, f"{len(lines)} lines:\n" + "\n".join(lines)
    for noise in NOISE:
        assert noise not in console, noise
    run_dir = next((tmp_path / "runner-logs" / "ft-train").iterdir())
    for group in (0, 1):
        rank_dir = run_dir / f"group_{group}" / "attempt_0" / "rank_0"
        log = rank_dir / "stdout.log"
        # The worker's log has what the console shows of it, line for line (the agent hides nothing) ...
        shown = [m.group(3) for m in map(WORKER_LINE.match, res.stdout.splitlines())
                 if m and int(m.group(1)) == group]
        assert shown == log.read_text().splitlines()
        # ... and the whole run: its start, a step line at least every 100 steps, the last step, the final checksum.
        assert len(records(log, "start")) == 1
        steps = [int(r["step"]) for r in records(log, "step")]
        assert steps and steps[-1] == STEPS and all(b - a <= 100 for a, b in pairwise(steps))
        assert records(log, "final")[0]["step"] == str(STEPS)
        stderr_log = (rank_dir / "stderr.log").read_text()
        for noise in NOISE:
            assert noise not in stderr_log, noise
    # runner still learnt every committed step (the heartbeat file, written after each one, whatever is printed).
    report = json.loads((run_dir / "report.json").read_text())
    assert [g["step"] for g in report["groups"]] == [STEPS, STEPS]
    finals = {records(run_dir / f"group_{g}" / "attempt_0" / "rank_0" / "stdout.log", "final")[0]["params_sha"]
              for g in (0, 1)}
    assert len(finals) == 1  # one model


@pytest.mark.parametrize("script", ["ft_train.py", "ft_local_sgd.py"])
def test_log_every_below_one_is_refused_with_its_name(script: str) -> None:
    res = subprocess.run([sys.executable, str(EXAMPLES / script), "--log-every", "0"], capture_output=True,
                         text=True, timeout=60, check=False, cwd=EXAMPLES)
    assert res.returncode == 2
    assert "--log-every" in res.stderr and "must be at least 1" in res.stderr, res.stderr
