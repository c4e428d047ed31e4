"""How often does a worker that finished its work abort at exit? (issue: "terminate called without an active exception")

bench/workers/ddp_no_destroy.py (gloo DDP, no destroy_process_group, as pytorch/examples' scripts) is run N times
under each launcher, interleaved: (A) runner with its workers in pre-warmed standbys, (B) runner with cold workers
(RUNNER_STANDBY=0), (C) torchrun --standalone. A run counts as an abort when a worker died of SIGABRT or printed
"terminate called"; the launchers never restart (max restarts 0), so each run is one attempt.

    python bench/abort_at_exit.py [--runs 20] [--nproc 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "bench" / "workers" / "ddp_no_destroy.py"
PY = Path(sys.executable)
SPEC = """version: 1
name: abort-at-exit
entrypoint: {{script: "{worker}"}}
nproc_per_node: {nproc}
restart: {{max_restarts: 0}}
shutdown: {{grace_period: 5s}}
logs: {{dir: "{logs}"}}
"""
MARKERS = ("terminate called", "SIGABRT", "Signal 6", "exitcode: -6", "exit code -6", "signal 6")


def run(arm: str, work: Path, nproc: int, i: int) -> tuple[bool, int]:
    """(aborted, exit code) of one run of `arm`."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if arm == "torchrun":
        argv = [str(PY.parent / "torchrun"), "--standalone", f"--nproc-per-node={nproc}", "--max-restarts=0",
                str(WORKER)]
    else:
        spec = work / f"{arm}-{i}.yaml"
        spec.write_text(SPEC.format(worker=WORKER, nproc=nproc, logs=work / "logs"))
        env["RUNNER_STANDBY"] = "1" if arm == "runner-standby" else "0"
        argv = [str(PY), "-m", "runner", str(spec)]
    res = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=120, check=False)
    text = res.stdout + res.stderr
    aborted = any(m in text for m in MARKERS)
    if aborted:  # kept for a look: what the launcher said
        (work.parent / f"abort-{arm}-{i}.txt").write_text(text)
    return aborted, res.returncode


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--nproc", type=int, default=2)
    a = p.parse_args()
    arms = ("runner-standby", "runner-cold", "torchrun")
    counts = {arm: [0, 0] for arm in arms}  # aborted, failed (exit != 0)
    with tempfile.TemporaryDirectory(prefix="abort-") as tmp:
        work = Path(tmp)
        for i in range(a.runs):
            for arm in arms:
                aborted, code = run(arm, work, a.nproc, i)
                counts[arm][0] += aborted
                counts[arm][1] += code != 0
            print(json.dumps({"run": i + 1, **{k: v[0] for k, v in counts.items()}}), flush=True)
    print("\n| launcher | runs | aborted at exit | exit != 0 |\n|---|---|---|---|")
    for arm in arms:
        print(f"| {arm} | {a.runs} | {counts[arm][0]} | {counts[arm][1]} |")
    print(f"\ncommand: python bench/abort_at_exit.py --runs {a.runs} --nproc {a.nproc}")


if __name__ == "__main__":
    main()
