"""A hang's culprit: how soon it is named, against torchrun; and what the flight recorder costs a healthy step.

Part 1, one run side by side: examples/jobs/hang_culprit.py, 2 ranks on gloo; at step 3 of attempt 0 rank 1 sleeps
instead of entering the all_reduce rank 0 waits in (it writes the time it starts to hang: the stamp).
  runner:   watchdog.heartbeat_timeout T, max_restarts 0. Times from the stamp: detection (the `heartbeat_silent`
            event) and the culprit named (`hang_culprit`, the line the console prints next), and which rank the
            root cause names.
  torchrun: the same script with init_process_group(timeout=T) (torchrun has no heartbeat: the collective timeout
            is its only detection), --max-restarts 0. Times from the stamp to torchrun's exit, and the rank its
            "Root Cause" names.
  runner, collective timeout: the same script with init_process_group(timeout=T) and no watchdog (runner's
            default): times to the culprit named, and the rank named. With --nproc 3 or more every waiter times
            out at about the same moment (issue 30: the waiters leaving were named `silent`).
Part 2, a healthy loop (bench/workers/fr_cost.py: 2 ranks, all_reduce of 10 floats, the smallest step, where a
per-collective cost shows most, and of 1 MiB) under runner's defaults with watchdog.flight_recorder 2000 (the
default: recorder and worker server on) and 0 (both off), alternately: median step time and rank 0's RSS.

    python bench/hang_culprit.py [--runs 5] [--timeout 3] [--nproc 2] [--part all|culprit|cost]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine_line, reproduce_line, table

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "jobs" / "hang_culprit.py"
COST = ROOT / "bench" / "workers" / "fr_cost.py"
RUNNER = [sys.executable, "-m", "runner"]
NUMELS = (10, 262144)  # the smallest step (a per-collective cost shows most) and 1 MiB of floats
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


NPROC = {"n": 2}  # --nproc: the ranks of part 1


def spec(script: Path, args: list[str], extra: str, nproc: int = 2) -> str:
    return (f"version: 1\nname: hb\nentrypoint:\n  script: {script}\n  args: {json.dumps(args)}\n"
            f"nproc_per_node: {nproc}\nrestart:\n  max_restarts: 0\nshutdown:\n  grace_period: 5s\n{extra}")


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def runner_hang(work: Path, timeout: float) -> dict[str, float | str]:
    stamp = work / "stamp"
    job = work / "job.yaml"
    job.write_text(spec(SCRIPT, ["sleep", "--stamp", str(stamp)], f"watchdog:\n  heartbeat_timeout: {timeout}s\n",
                        NPROC["n"]))
    subprocess.run([*RUNNER, str(job)], cwd=work, capture_output=True, text=True, timeout=300, check=False)
    began = float(stamp.read_text())
    (run_dir,) = [d for d in (work / "runner-logs" / "hb").iterdir() if not d.is_symlink()]
    events = [json.loads(line) for line in (run_dir / "agent.jsonl").read_text().splitlines()]
    detected = min(epoch(e["timestamp"]) for e in events if e.get("event") == "heartbeat_silent")
    named = next(e for e in events if e.get("event") == "hang_culprit")
    return {"detect_s": detected - began, "named_s": epoch(named["timestamp"]) - began,
            "after_detect_s": epoch(named["timestamp"]) - detected, "names": ",".join(map(str, named["culprits"]))}


def runner_timeout(work: Path, timeout: float) -> dict[str, float | str]:
    stamp = work / "stamp"
    job = work / "job.yaml"
    job.write_text(spec(SCRIPT, ["sleep", "--stamp", str(stamp), "--pg-timeout", str(timeout)], "", NPROC["n"]))
    subprocess.run([*RUNNER, str(job)], cwd=work, capture_output=True, text=True, timeout=300, check=False)
    began = float(stamp.read_text())
    (run_dir,) = [d for d in (work / "runner-logs" / "hb").iterdir() if not d.is_symlink()]
    events = [json.loads(line) for line in (run_dir / "agent.jsonl").read_text().splitlines()]
    detected = min(epoch(e["timestamp"]) for e in events if e.get("event") == "worker_exited")
    named = next((e for e in events if e.get("event") == "hang_culprit"), {"culprits": [], "timestamp": ""})
    at = epoch(str(named["timestamp"])) if named["timestamp"] else float("nan")
    return {"detect_s": detected - began, "named_s": at - began, "after_detect_s": at - detected,
            "names": ",".join(map(str, named["culprits"])) or "none"}


def torchrun_hang(work: Path, timeout: float) -> dict[str, float | str]:
    stamp = work / "stamp"
    done = subprocess.run([*TORCHRUN, "--standalone", "--nproc-per-node", str(NPROC["n"]), "--max-restarts", "0", str(SCRIPT),
                           "sleep", "--stamp", str(stamp), "--pg-timeout", str(timeout)],
                          cwd=work, capture_output=True, text=True, timeout=600, check=False)
    ended = time.time()
    began = float(stamp.read_text())
    ranks = re.findall(r"rank\s*:\s*(\d+)", done.stderr.split("Root Cause", 1)[-1])[:1]
    return {"detect_s": ended - began, "named_s": float("nan"), "after_detect_s": float("nan"),
            "names": ranks[0] if ranks else "none"}


def cost(work: Path, entries: int, numel: int, out: Path) -> None:
    job = work / f"cost{entries}.yaml"
    job.write_text(spec(COST, ["--out", str(out), "--numel", str(numel)], f"watchdog:\n  flight_recorder: {entries}\n"))
    subprocess.run([*RUNNER, str(job)], cwd=work, capture_output=True, text=True, timeout=300, check=True)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=3.0, help="heartbeat_timeout / the collective timeout, s")
    ap.add_argument("--nproc", type=int, default=2, help="part 1's ranks (the last one hangs)")
    ap.add_argument("--part", choices=["all", "culprit", "cost"], default="all")
    args = ap.parse_args()
    NPROC["n"] = args.nproc
    with tempfile.TemporaryDirectory(prefix="hang-bench-") as tmp:
        if args.part != "cost":
            culprit_part(tmp, args.runs, args.timeout, args.nproc)
        if args.part != "culprit":
            cost_part(tmp, args.runs)
    print(machine_line())
    print(reproduce_line())


def culprit_part(tmp: str, runs: int, timeout: float, nproc: int) -> None:
    arms: dict[str, list[dict[str, float | str]]] = {"runner": [], "runner, collective timeout": [], "torchrun": []}
    for i in range(runs):
        for name, fn in (("runner", runner_hang), ("runner, collective timeout", runner_timeout),
                         ("torchrun", torchrun_hang)):
            work = Path(tmp, f"{name.replace(', ', '-').replace(' ', '-')}{i}")
            work.mkdir()
            arms[name].append(fn(work, timeout))
    rows = []
    for name, arm in arms.items():
        named = [float(r["named_s"]) for r in arm if r["named_s"] == r["named_s"]]
        rows.append([name, spread([float(r["detect_s"]) for r in arm]),
                     spread(named) if named else "never",
                     spread([float(r["after_detect_s"]) for r in arm]) if named else "-",
                     " / ".join(f"{n} ({sum(str(r['names']) == n for r in arm)})"
                                for n in sorted({str(r["names"]) for r in arm}))])
    print(f"hang -> failure, {nproc} ranks, {runs} runs, T = {timeout:g} s (median (min-max), seconds from the hang)")
    print(table(["launcher", "hang -> detected", "hang -> culprit named", "detected -> named",
                 f"rank blamed (runs) (culprit: {nproc - 1})"], rows))


def cost_part(tmp: str, runs: int) -> None:
    out = Path(tmp, "cost.jsonl")
    for _ in range(runs):
        for numel in NUMELS:
            for entries in (2000, 0):
                cost(Path(tmp), entries, numel, out)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    rows = []
    for numel in NUMELS:
        medians = {}
        for on in (True, False):
            mine = [x for x in lines if bool(x["fr"]) == on and x["numel"] == numel]
            medians[on] = statistics.median(x["step_us"] for x in mine)
            rows.append([f"{numel} floats", "on (2000)" if on else "off (0)", spread([x["step_us"] for x in mine]),
                         f"{statistics.median(x['rss_kib'] for x in mine) / 1024:.1f}"])
        rows.append([f"{numel} floats", "on / off", f"{medians[True] / medians[False]:.3f}", ""])
    print(f"\nhealthy step: all_reduce on 2 ranks (gloo), {runs} runs of 3000 steps each, alternating")
    print(table(["tensor", "flight recorder", "step us, median (min-max)", "rank 0 RSS MiB"], rows))


if __name__ == "__main__":
    main()
