"""The fork server on a GPU machine: safe to fork after `import torch`, CUDA usable in a forked worker, and a preload
that initialises CUDA refused (workers start cold, one warning, the job unaffected).

Three real jobs (runner, the product's defaults but for what each check needs), each a 1-rank job of
bench/workers/gpu_fork_worker.py:
  1. crash loop: attempt 0 crashes at once, attempt 1 does an NCCL all_reduce on cuda:0: both attempts forked warm;
  2. a preload that initialises CUDA (bench/workers/cuda_preload.py): the server refuses to fork, the job succeeds cold;
  3. what the server checks, seen from outside: threads and torch.cuda.is_initialized() after `import torch`.
Prints one JSON line per check and exits 1 if one failed.

    python bench/gpu_fork_server.py [--backend nccl|gloo]
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
WORKER = ROOT / "bench" / "workers" / "gpu_fork_worker.py"
SPEC = """
version: 1
name: gpu-fork-{name}
entrypoint: {{script: "{worker}"}}
nproc_per_node: 1
env: {{BENCH_BACKEND: "{backend}", BENCH_OUT: "{out}", PYTHONPATH: "{path}"}}
restart:
  max_restarts: 1
  backoff: {{initial: 0s}}
  preload: {preload}
logs: {{dir: "{logs}"}}
"""


def run_job(work: Path, name: str, backend: str, preload: str) -> dict[str, object]:
    """Run one job; its exit code, report.json's standby section and what the worker wrote."""
    d = work / name
    out = d / "out"
    out.mkdir(parents=True)
    spec = d / "job.yaml"
    spec.write_text(SPEC.format(name=name, worker=WORKER, backend=backend, out=out, logs=d / "logs",
                                preload=preload, path=ROOT / "bench" / "workers"))
    done = subprocess.run([sys.executable, "-m", "runner", str(spec)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)
    reports = sorted((d / "logs").glob("*/*/report.json"))
    report = json.loads(reports[0].read_text()) if reports else {}
    seen = {p.name: p.read_text() for p in sorted(out.iterdir())}
    return {"exit": done.returncode, "standby": report.get("standby"), "worker": seen,
            "stderr_tail": done.stderr[-1500:] if done.returncode else ""}


def main() -> None:
    """Run the checks; one JSON line each."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="nccl")
    args = p.parse_args()
    probe = ("import os, torch; print(len(os.listdir('/proc/self/task')), torch.cuda.is_initialized(), "
             "torch.__version__, torch.cuda.is_available())")
    seen = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout.split()
    checks = {"after import torch: threads, cuda initialised, torch, cuda available": seen}
    ok = len(seen) == 4 and seen[0] == "1" and seen[1] == "False"
    with tempfile.TemporaryDirectory(prefix="gpu-fork-") as tmp:
        work = Path(tmp)
        loop = run_job(work, "loop", args.backend, "[torch]")
        checks["crash loop, forked warm"] = loop
        standby = loop["standby"] if isinstance(loop["standby"], dict) else {}
        worker = loop["worker"] if isinstance(loop["worker"], dict) else {}
        ok = ok and loop["exit"] == 0 and standby.get("handed_off") == 2 and not standby.get("cold_starts") \
            and "ok-1" in worker
        refused = run_job(work, "cuda-preload", args.backend, "[torch, cuda_preload]")
        checks["a preload that initialises CUDA"] = refused
        standby = refused["standby"] if isinstance(refused["standby"], dict) else {}
        ok = ok and refused["exit"] == 0 and "CUDA" in str(standby.get("off", ""))
    for name, value in checks.items():
        print(json.dumps({"check": name, "result": value}))
    print(json.dumps({"all_ok": ok}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
