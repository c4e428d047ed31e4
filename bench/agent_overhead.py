"""Agent overhead: runner vs torchrun on a 2-worker job whose workers sleep 2 s (no torch in the workers).

Runs A (runner) and B (torchrun) alternately, N times each, in one process:
  A: runner bench/jobs/sleep.yaml
  B: torchrun --standalone --nproc-per-node 2 bench/workers/sleep_worker.py
Both run the same argv per worker: `<venv python> -u bench/workers/sleep_worker.py`.
Per run:
  overhead = wall time of the whole command - 2 s (the workers' sleep);
  agent CPU = wait4 rusage of the launcher (launcher + every descendant it reaped) - the CPU each worker reports
              for itself (RUSAGE_SELF at its end); for the runner this includes its shepherd helper process;
  agent peak RSS = VmHWM of the launcher's main process (sampled every 20 ms); runner's helpers listed apart.

    python bench/agent_overhead.py [--runs 10]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
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


def commands() -> dict[str, list[str]]:
    """The two launchers' commands (run from the repository root)."""
    return launcher_commands("bench/jobs/sleep.yaml", WORKER)


def one_run(argv: list[str], work: Path) -> tuple[Measured, float]:
    """Run once; return the measurement and the agent's own CPU seconds."""
    env = bench_env(work, BENCH_SLEEP=str(SLEEP_S))
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
    return m, m.cpu_s - workers_cpu


def main() -> None:
    """Interleaved A/B runs; print a Markdown report."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--runs",
        type=int,
        default=10,
        help="runs of each launcher (after one warm-up each)",
    )
    args = p.parse_args()
    precompile()
    cmds = commands()
    res: dict[str, list[tuple[Measured, float]]] = {k: [] for k in cmds}
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        work = Path(tmp)
        for name, argv in cmds.items():  # warm-up: page cache, .pyc files
            one_run(argv, work)
            print(f"warm-up {name} done", file=sys.stderr)
        for i in range(args.runs):
            for name, argv in cmds.items():
                res[name].append(one_run(argv, work))
                m, cpu = res[name][-1]
                print(
                    f"run {i} {name}: wall {m.wall_s:.3f} s, agent cpu {cpu:.3f} s, "
                    f"rss {m.peak_rss_kib / 1024:.1f} MiB",
                    file=sys.stderr,
                )
    report(cmds, res)


def report(
    cmds: dict[str, list[str]], res: dict[str, list[tuple[Measured, float]]]
) -> None:
    """Markdown tables: per launcher, then runner/torchrun ratios (pair by pair)."""
    over = {k: [m.wall_s - SLEEP_S for m, _ in v] for k, v in res.items()}
    wall = {k: [m.wall_s for m, _ in v] for k, v in res.items()}
    cpu = {k: [c for _, c in v] for k, v in res.items()}
    rss = {k: [m.peak_rss_kib / 1024 for m, _ in v] for k, v in res.items()}
    helpers = [sum(m.helpers_rss_kib.values()) / 1024 for m, _ in res["runner"]]
    rows = [
        [
            name,
            Stat.of(wall[name]).fmt(),
            Stat.of(over[name]).fmt(),
            Stat.of(cpu[name]).fmt(),
            Stat.of(rss[name]).fmt(digits=1),
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
        ]
    )
    n = len(wall["runner"])
    print(f"### Agent overhead: {n} interleaved runs each ({machine_line()})\n")
    print(
        table(
            [
                "launcher",
                "wall s",
                "overhead s (wall - 2)",
                "agent CPU s",
                "agent peak RSS MiB",
            ],
            rows,
        )
    )
    print(
        "\nmedian (min-max); ratios are taken pair by pair (run i of runner / run i of torchrun)."
    )
    print(
        f"runner helper processes (shepherd), peak RSS: {Stat.of(helpers).fmt(digits=1)} MiB (not in the table)"
    )
    print_commands(cmds)


if __name__ == "__main__":
    main()
