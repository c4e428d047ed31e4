"""A replica group's worker without torch: records itself, reports committed steps the way a TorchFT script does.

Writes OUT/g<group>.r<rank>.a<attempt>.pid at start; rank 0 writes {"step": N} to $RUNNER_HEARTBEAT_FILE after each
"step" (atomically); `--fail-group G --fail-attempts K` makes group G exit 1 at step --fail-at on attempts < K.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def report(step: int) -> None:
    path = os.environ["RUNNER_HEARTBEAT_FILE"]
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(json.dumps({"step": step}))
        os.replace(tmp, path)
    except OSError:
        pass  # as examples/jobs/ft_train.py: a full logs disk must not stop training


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--step-s", type=float, default=0.1)
    p.add_argument("--fail-group", type=int, default=-1)
    p.add_argument("--fail-attempts", type=int, default=0)
    p.add_argument("--fail-at", type=int, default=2)
    a = p.parse_args()
    group, rank = int(os.environ["REPLICA_GROUP_ID"]), int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    pid_file = Path(a.out, f"g{group}.r{rank}.a{attempt}.pid")
    pid_file.with_suffix(".tmp").write_text(json.dumps({  # then renamed: a test polling *.pid reads it whole
        "pid": os.getpid(), **{k: os.environ[k] for k in (
            "RANK", "WORLD_SIZE", "MASTER_PORT", "TORCHFT_LIGHTHOUSE", "NUM_REPLICA_GROUPS", "TORCHFT_MANAGER_PORT")},
    }))
    pid_file.with_suffix(".tmp").replace(pid_file)
    for step in range(1, a.steps + 1):
        time.sleep(a.step_s)
        if group == a.fail_group and attempt < a.fail_attempts and step == a.fail_at:
            print(f"group {group} fails at step {step}", flush=True)
            sys.exit(1)
        if rank == 0:
            report(step)
    print(f"group {group} rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
