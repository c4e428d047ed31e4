"""Real TorchFT training under runner: examples/jobs/ft_train.py in 2 replica groups with the hosted lighthouse.

Group 1's worker is SIGKILLed mid-run. From the workers' own output: group 0 keeps committing steps alone while
group 1 is down (no worker of group 0 is restarted), runner restarts group 1 alone, and group 1 rejoins by copying
group 0's live weights: both end at the same step with equal parameters (sha256 over their bytes).
"""

from __future__ import annotations

import itertools
import json
import time

import pytest
from conftest import EXAMPLES, Job, alive, kill_proven, wait_for
from ft_records import committed, first_attempt_logs, records
from torchft_mark import needs_torchft

pytestmark = [
    pytest.mark.integration,
    needs_torchft,
]
STEPS = 400


def test_a_killed_group_restarts_alone_and_rejoins_with_the_survivors_weights(tmp_path):
    j = Job(tmp_path, f"""
        version: 1
        name: ft
        entrypoint:
          script: "{EXAMPLES / 'ft_train.py'}"
          args: ["--steps", "{STEPS}", "--sha-every", "50", "--step-sleep", "0.03"]
        replica_groups: {{count: 2, nproc_per_node: 1, min_active: 1, lighthouse: {{heartbeat_timeout: 1s}}}}
        env: {{OMP_NUM_THREADS: "1"}}
        # standby false: a warm restart is back within TorchFT's heartbeat (1 s), before group 0 could step alone;
        # a cold one (the new worker imports torch) keeps group 1 down long enough to watch group 0 step on alone.
        # The default (warm) path of the same failure: tests/agent/test_ft_example.py.
        restart: {{max_restarts: 3, backoff: {{initial: 0s}}, standby: false}}
        shutdown: {{grace_period: 5s}}
        logs: {{dir: "${{LOGS}}"}}
    """)
    j.start()
    try:
        run, log0, log1 = first_attempt_logs(j)
        wait_for(lambda: any(n == 2 and s >= 20 for s, _, n in committed(log1)), timeout=90,
                 what="both groups stepping in one quorum")
        status = json.loads((run / "group_1" / "status.json").read_text())
        [worker] = status["workers"]
        pid = worker["pid"]
        start = records(log1, "start")[0]
        assert int(start["pid"]) == pid
        kill_proven(pid, "ft_train.py")
        t_kill = time.time()
        out, err = j.proc.communicate(timeout=180)
    finally:
        if j.proc.poll() is None:
            j.proc.kill()
            j.proc.communicate()
    assert j.proc.returncode == 0, err[-3000:]
    back_log = run / "group_1" / "attempt_1" / "rank_0" / "stdout.log"
    back = committed(back_log)
    assert back, back_log.read_text()[-3000:]
    t_back = back[0][1]
    after_kill = [(s, n) for s, t, n in committed(log0) if t_kill < t < t_back]
    # a step whose quorum both groups had joined before the kill may still commit with 2 (group 1's gradients were in)
    in_flight = list(itertools.takewhile(lambda sn: sn[1] == 2, after_kill))
    alone = after_kill[len(in_flight):]
    assert len(in_flight) <= 1 and len(alone) >= 5 and {n for _, n in alone} == {1}, after_kill  # group 0 went on
    assert not (run / "group_0" / "attempt_1").exists()  # and was never restarted
    killed_at = max(s for s, _, _ in committed(log1))
    assert back[0][0] > killed_at, (killed_at, back[:3])  # rejoined at the live step, not from scratch
    final0, final1 = records(log0, "final"), records(back_log, "final")
    assert final0 and final1 and final0[0]["step"] == final1[0]["step"] == str(STEPS)
    assert final0[0]["params_sha"] == final1[0]["params_sha"]
    report = json.loads((run / "report.json").read_text())
    by_group = {g["group"]: g for g in report["groups"]}
    assert (by_group[0]["attempts"], by_group[1]["attempts"]) == (1, 2)
    assert by_group[0]["step"] == by_group[1]["step"] == STEPS  # what the workers reported, read by runner
    lighthouse = report["replica_groups"]["lighthouse"]["pid"]
    assert not alive(lighthouse) and not alive(pid)
