"""The NCCL path on a GPU machine: `nproc_per_node: gpu`, an NCCL job under the runner, and a hang read through
NCCL's flight recorder (docs/hangs.md), which the CPU suite can only try with gloo.

Two real jobs of the runner on this machine's GPUs (one worker per GPU):
  1. ok:   `nproc_per_node: gpu`; each worker binds cuda:LOCAL_RANK, runs NCCL all_reduces and checks the sum;
  2. hang: the same, with `watchdog.heartbeat_timeout: 4s`; at step 3 the last rank stops beating and sleeps
     outside any collective (the others, if any, wait in the next all_reduce): the runner reads every rank's NCCL
     flight recorder (the worker's `fr_trace_json` handler) and names the culprit; no restart.
Prints one JSON line per check (what the console and report.json said) and exits 1 if a check failed. One GPU is
enough for both: a 1-rank world shows that the recorder's NCCL entries are read (the culprit analysis then has no
waiter to compare with, and says so); with 2 or more GPUs the culprit is named against the waiters.

    python bench/gpu_nccl_check.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKER = """\
import os, sys, time
import torch
import torch.distributed as dist

rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl")
world = dist.get_world_size()
beat = os.environ.get("RUNNER_HEARTBEAT_FILE")
for step in range(6):
    if beat:
        open(beat, "w").close()
    if os.environ["MODE"] == "hang" and step == 3 and rank == world - 1:
        time.sleep(120)  # silent, outside any collective: the culprit
    t = torch.ones(4, device="cuda") * (rank + 1)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    assert t[0].item() == world * (world + 1) / 2, t
    time.sleep(0.2)
print(f"rank {rank} of {world} on cuda:{local} ({torch.cuda.get_device_name(local)}): all_reduce ok", flush=True)
dist.destroy_process_group()
"""
SPEC = """\
version: 1
name: gpu-nccl-{mode}
entrypoint: {{script: worker.py}}
nproc_per_node: gpu
env: {{MODE: {mode}}}
{watchdog}
restart: {{max_restarts: 0}}
shutdown: {{grace_period: 5s}}
logs: {{dir: logs}}
"""


def run(work: Path, mode: str) -> dict[str, object]:
    folder = work / mode
    folder.mkdir()
    (folder / "worker.py").write_text(WORKER)
    watchdog = "watchdog: {heartbeat_timeout: 4s}" if mode == "hang" else ""
    (folder / "job.yaml").write_text(SPEC.format(mode=mode, watchdog=watchdog))
    env = {**os.environ, "NO_COLOR": "1"}
    plan = subprocess.run([sys.executable, "-m", "runner", "plan", "job.yaml"], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    done = subprocess.run([sys.executable, "-m", "runner", "job.yaml"], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=240, check=False)
    reports = list(folder.glob("logs/*/*/report.json"))
    report = json.loads(reports[0].read_text()) if reports else {}
    return {"mode": mode, "exit": done.returncode, "plan_nproc": [ln for ln in plan.stdout.splitlines()
                                                                   if "nproc" in ln][:2],
            "report_outcome": report.get("outcome"), "failures": report.get("failures", []),
            "console_tail": (done.stdout + done.stderr)[-2500:]}


def main() -> int:
    import torch  # the check itself runs only where torch sees a GPU

    gpus = torch.cuda.device_count()
    print(json.dumps({"torch": torch.__version__, "gpus": gpus, "nccl": list(torch.cuda.nccl.version())}))
    if gpus == 0:
        print(json.dumps({"skipped": "no GPU visible"}))
        return 0
    ok = True
    with tempfile.TemporaryDirectory(prefix="gpu-nccl-") as tmp:
        first = run(Path(tmp), "ok")
        first["pass"] = first["exit"] == 0 and first["report_outcome"] == "succeeded"
        print(json.dumps(first))
        hang = run(Path(tmp), "hang")
        failure = hang["failures"][0] if isinstance(hang["failures"], list) and hang["failures"] else {}
        hang["pass"] = (hang["exit"] != 0 and isinstance(failure, dict) and failure.get("class") == "hang"
                        and "recorder is off" not in json.dumps(failure))
        print(json.dumps(hang))
        ok = bool(first["pass"] and hang["pass"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
