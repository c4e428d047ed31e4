"""Agent overhead: runner vs torchrun on a 2-worker job whose workers sleep 2 s.

Runs A (runner) and B (torchrun) alternately, N times each, in one process:
  A: runner bench/jobs/sleep.yaml (--workers sleep: no torch in the workers, preload [])
     or bench/jobs/sleep_torch.yaml (--workers torch: they import torch; the product's defaults, fork server on)
  B: torchrun --standalone --nproc-per-node 2 bench/workers/sleep_worker.py
Both run the same argv per worker: `<venv python> -u bench/workers/sleep_worker.py`.
Per run:
  overhead = wall time of the whole command - 2 s (the workers' sleep);
  agent CPU = wait4 rusage of the launcher (launcher + every descendant it reaped) - the CPU each worker reports
              for itself (RUSAGE_SELF at its end); for the runner this includes its shepherd helper process;
  agent peak RSS = VmHWM of the launcher's main process (sampled every 20 ms); runner's helpers listed apart;
  whole tree PSS = the peak, sampled every 100 ms, of the summed proportional set size of the launcher and every
              descendant (agent, guard, fork server, standbys, workers): copy-on-write and shared pages count once.
For the runner, where its overhead lies (from the run's own agent.jsonl, same wall clock as the launch):
  start = launch -> first `worker_started` event;  exit = last `worker_exited` event -> runner reaped.

    python bench/agent_overhead.py [--runs 10] [--workers sleep|torch]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    Measured,
    Stat,
    bench_env,
    launcher_commands,
    machine_line,
    measure,
    precompile,
    print_commands,
    ratios,
    table,
)

SLEEP_S = 2.0
WORKER = "bench/workers/sleep_worker.py"


SPECS = {"sleep": "bench/jobs/sleep.yaml", "torch": "bench/jobs/sleep_torch.yaml"}


def commands(workers: str = "sleep") -> dict[str, list[str]]:
    """The two launchers' commands (run from the repository root)."""
    return launcher_commands(SPECS[workers], WORKER)


@dataclass
class Run:
    """One launcher run: what it cost, the agent's own CPU, and (runner only) its start and exit phases."""

    m: Measured
    cpu_s: float
    start_s: float | None = None  # launch -> first worker started
    exit_s: float | None = None  # last worker exited -> launcher reaped


def phases(m: Measured, logs: Path) -> tuple[float | None, float | None]:
    """(start, exit) phases of the runner run that just ended, from its agent.jsonl (None where unreadable)."""
    found = sorted(logs.glob("*/latest/agent.jsonl"))
    if not found:
        return None, None
    stamps: dict[str, list[float]] = {"worker_started": [], "worker_exited": []}
    for line in found[0].read_text(encoding="utf-8").splitlines():
        event = json.loads(line)
        if event.get("event") in stamps:
            stamps[event["event"]].append(dt.datetime.fromisoformat(event["timestamp"]).timestamp())
    started, exited = stamps["worker_started"], stamps["worker_exited"]
    return (
        min(started) - m.started_at if started else None,
        m.started_at + m.wall_s - max(exited) if exited else None,
    )


def one_run(argv: list[str], work: Path, workers: str) -> Run:
    """Run once; return the measurement, the agent's own CPU seconds and (runner) its phases."""
    env = bench_env(work, BENCH_SLEEP=str(SLEEP_S), BENCH_TORCH="1" if workers == "torch" else "0")
    out = work / "out"
    m = measure(
        argv,
        env=env,
        is_worker=lambda c: WORKER in c,
        timeout=60,
        log_path=work / "launcher.log",
    )
    reports = list(out.glob("cpu-*"))
    if m.rc != 0 or len(reports) != 2:
        sys.exit(
            f"run failed: rc={m.rc}, {len(reports)} worker report(s); see {work / 'launcher.log'}"
        )
    workers_cpu = sum(float(p.read_text()) for p in reports)
    start, end = phases(m, work / "logs") if argv == commands(workers)["runner"] else (None, None)
    return Run(m, m.cpu_s - workers_cpu, start, end)


def main() -> None:
    """Interleaved A/B runs; print a Markdown report."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--runs",
        type=int,
        default=10,
        help="runs of each launcher (after one warm-up each)",
    )
    p.add_argument("--workers", choices=sorted(SPECS), default="sleep",
                   help="sleep: workers without torch; torch: workers that import torch, the runner's defaults")
    args = p.parse_args()
    precompile()
    cmds = commands(args.workers)
    res: dict[str, list[Run]] = {k: [] for k in cmds}
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        work = Path(tmp)
        for name, argv in cmds.items():  # warm-up: page cache, .pyc files
            one_run(argv, work, args.workers)
            print(f"warm-up {name} done", file=sys.stderr)
        for i in range(args.runs):
            for name, argv in cmds.items():
                run = one_run(argv, work, args.workers)
                res[name].append(run)
                print(
                    f"run {i} {name}: wall {run.m.wall_s:.3f} s, agent cpu {run.cpu_s:.3f} s, "
                    f"rss {run.m.peak_rss_kib / 1024:.1f} MiB, tree pss {run.m.peak_tree_pss_kib / 1024:.1f} MiB",
                    file=sys.stderr,
                )
    report(cmds, res, args.workers)


def report(cmds: dict[str, list[str]], res: dict[str, list[Run]], workers: str) -> None:
    """Markdown tables: per launcher, then runner/torchrun ratios (pair by pair); the runner's phases."""
    over = {k: [r.m.wall_s - SLEEP_S for r in v] for k, v in res.items()}
    wall = {k: [r.m.wall_s for r in v] for k, v in res.items()}
    cpu = {k: [r.cpu_s for r in v] for k, v in res.items()}
    rss = {k: [r.m.peak_rss_kib / 1024 for r in v] for k, v in res.items()}
    pss = {k: [r.m.peak_tree_pss_kib / 1024 for r in v] for k, v in res.items()}
    helpers = [sum(r.m.helpers_rss_kib.values()) / 1024 for r in res["runner"]]
    starts = [r.start_s for r in res["runner"] if r.start_s is not None]
    exits = [r.exit_s for r in res["runner"] if r.exit_s is not None]
    rows = [
        [
            name,
            Stat.of(wall[name]).fmt(),
            Stat.of(over[name]).fmt(),
            Stat.of(cpu[name]).fmt(),
            Stat.of(rss[name]).fmt(digits=1),
            Stat.of(pss[name]).fmt(digits=1),
        ]
        for name in cmds
    ]
    rows.append(
        [
            "**runner/torchrun**",
            ratios(wall["runner"], wall["torchrun"]).fmt(digits=2),
            ratios(over["runner"], over["torchrun"]).fmt(digits=2),
            ratios(cpu["runner"], cpu["torchrun"]).fmt(digits=2),
            ratios(rss["runner"], rss["torchrun"]).fmt(digits=2),
            ratios(pss["runner"], pss["torchrun"]).fmt(digits=2),
        ]
    )
    n = len(wall["runner"])
    what = "workers import torch, runner's defaults" if workers == "torch" else "workers without torch"
    print(f"### Agent overhead ({what}): {n} interleaved runs each ({machine_line()})\n")
    print(
        table(
            [
                "launcher",
                "wall s",
                "overhead s (wall - 2)",
                "agent CPU s",
                "agent peak RSS MiB",
                "whole tree peak PSS MiB",
            ],
            rows,
        )
    )
    print(
        "\nmedian (min-max); ratios are taken pair by pair (run i of runner / run i of torchrun)."
    )
    print(
        f"runner helper processes (guard; fork server and spare standbys when on), summed peak RSS: "
        f"{Stat.of(helpers).fmt(digits=1)} MiB (not in the table: RSS counts the pages a forked standby shares "
        "with its server once per process; the whole tree's PSS above counts them once)"
    )
    if starts and exits:
        print(
            f"runner phases (agent.jsonl): launch -> first worker started {Stat.of(starts).fmt()} s; "
            f"last worker exited -> runner reaped {Stat.of(exits).fmt()} s"
        )
    print_commands(cmds)


if __name__ == "__main__":
    main()
