"""Real TorchFT LocalSGD under runner: examples/jobs/ft_local_sgd.py in 2 replica groups with the hosted lighthouse.

Group 1's worker is SIGKILLed once, after a few syncs. runner restarts group 1 alone (group 0 is never restarted);
the restarted group meets group 0 at its next sync and copies its weights (TorchFT's healing): its first committed
sync is past the one it died at, both groups end at the same sync with equal parameters, and the job succeeds.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import EXAMPLES, RUNNER, Job, alive, kill_proven, wait_for
from ft_records import committed, first_attempt_logs, records
from torchft_mark import needs_torchft

pytestmark = [
    pytest.mark.integration,
    needs_torchft,
]
# Syncs: long enough that a group whose worker starts late (a cold start under load) still finds the other training.
# With min_active 1 the first group commits alone meanwhile; with 12 syncs (3 s of pacing) it finished them all alone
# before the other's first under CI's load, and the test waited 90 s for a sync of both (CI, 2026-12-02). 40 give
# 10 s of pacing, as test_the_shipped_spec_trains_to_its_end is long for the same reason.
OUTER = 40
EVERY = 5  # inner steps per sync


def test_local_sgd_groups_survive_a_kill_and_end_with_the_same_weights(tmp_path):
    j = Job(tmp_path, f"""
        version: 1
        name: lsgd
        entrypoint:
          script: "{EXAMPLES / 'ft_local_sgd.py'}"
          args: ["--outer-steps", "{OUTER}", "--sync-every", "{EVERY}", "--step-sleep", "0.05"]
        replica_groups:
          count: 2
          nproc_per_node: 1
          min_active: 1
          lighthouse: {{heartbeat_timeout: 1s, join_timeout: 10s, quorum_tick: 10ms}}
        env: {{OMP_NUM_THREADS: "1"}}
        restart: {{max_restarts: 3, backoff: {{initial: 0s}}}}
        shutdown: {{grace_period: 5s}}
        logs: {{dir: "${{LOGS}}"}}
    """)
    j.start()
    try:
        run, log0, log1 = first_attempt_logs(j)
        wait_for(lambda: any(n == 2 and s >= 3 for s, _, n in committed(log1)), timeout=90,
                 what="both groups in a committed sync")
        start = records(log1, "start")[0]
        pid = int(start["pid"])
        kill_proven(pid, "ft_local_sgd.py")
        out, err = j.proc.communicate(timeout=150)
    finally:
        if j.proc.poll() is None:
            j.proc.kill()
            j.proc.communicate()
    assert j.proc.returncode == 0, err[-3000:]
    killed_at = max(s for s, _, _ in committed(log1))
    back_log = run / "group_1" / "attempt_1" / "rank_0" / "stdout.log"
    back = committed(back_log)
    assert back, back_log.read_text()[-3000:]
    assert back[0][0] > killed_at, (killed_at, back[:3])  # healed from group 0: rejoined at the live sync
    assert not (run / "group_0" / "attempt_1").exists()  # group 0 was never restarted
    steps0 = [s for s, _, _ in committed(log0)]
    assert steps0 == sorted(set(steps0)) and steps0[-1] == OUTER  # group 0 committed every sync once, in order
    final0, final1 = records(log0, "final"), records(back_log, "final")
    assert final0 and final1 and final0[0]["step"] == final1[0]["step"] == str(OUTER)
    assert final0[0]["params_sha"] == final1[0]["params_sha"]  # one model: the last sync averaged both groups
    report = json.loads((run / "report.json").read_text())
    by_group = {g["group"]: g for g in report["groups"]}
    assert (by_group[0]["attempts"], by_group[1]["attempts"]) == (1, 2)
    assert not alive(pid) and not alive(report["replica_groups"]["lighthouse"]["pid"])


def test_the_shipped_spec_trains_to_its_end(tmp_path):
    """examples/jobs/ft_local_sgd.yaml as shipped, shortened through its variables: both groups end at the same
    sync with the same weights. Long enough that a group whose worker starts a moment later still joins the other's
    quorum (with 3 outer steps, seen in the suite, one group finished all its syncs alone before the other's first:
    each then ended with weights of its own)."""
    res = subprocess.run([*RUNNER, str(EXAMPLES / "ft_local_sgd.yaml")], cwd=tmp_path,
                         env=dict(os.environ, OUTER_STEPS="30", SYNC_EVERY="3"), capture_output=True, text=True,
                         timeout=150, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    finals = [ln.split("ft_train final ", 1)[1] for ln in res.stdout.splitlines() if "ft_train final " in ln]
    assert len(finals) == 2 and len({f.split(" ", 1)[1] for f in finals}) == 1, finals  # same step, same sha
    assert all("step=30 " in f for f in finals), finals
