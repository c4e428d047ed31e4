"""Restart latency: runner vs torchrun, from a worker's crash to the start of its replacement.

Runs A (runner) and B (torchrun) alternately, N times each, in one process:
  A: runner bench/jobs/crash.yaml                       (max_restarts 1, backoff initial 0s, group restart)
  B: torchrun --standalone --nproc-per-node 2 --max-restarts 1 bench/workers/crash_worker.py
The worker (bench/workers/crash_worker.py, no torch) takes time.time() as its very first statement. On
attempt 0 the last rank sleeps 1 s, records time.time() and os._exit(1)s; rank 0 sleeps until stopped (its
default SIGTERM action ends it at once). Attempt 1 exits 0.
  latency = first statement of the first attempt-1 worker - the crash time (same host clock).
It includes the replacement's interpreter start-up (fork + exec + Python init to its first statement); that
start-up is calibrated in the same run (a bare Popen of the same script, once per round) and the table also
shows latency minus the median start-up.

    python bench/restart_latency.py [--runs 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    Stat,
    bench_env,
    interpreter_startup,
    launcher_commands,
    machine_line,
    measure,
    precompile,
    print_commands,
    ratios,
    table,
)

WORKER = "bench/workers/crash_worker.py"


def commands() -> dict[str, list[str]]:
    """The two launchers' commands (run from the repository root)."""
    return launcher_commands("bench/jobs/crash.yaml", WORKER, max_restarts=1)


def one_run(argv: list[str], work: Path) -> tuple[float, float]:
    """Run once; return (latency to the first replacement, latency to the crashed rank's replacement)."""
    env = bench_env(work, BENCH_CRASH_AFTER="1")
    out = Path(env["BENCH_OUT"])
    m = measure(argv, env=env, timeout=60, log_path=work / "launcher.log")
    crash = out / "crash"
    starts = {
        int(p.name.rsplit("-", 1)[1]): float(p.read_text())
        for p in out.glob("start-1-*")
    }
    if m.rc != 0 or not crash.exists() or len(starts) != 2:
        sys.exit(
            f"run failed: rc={m.rc}, crash recorded: {crash.exists()}, {len(starts)} replacement(s); "
            f"see {work / 'launcher.log'}"
        )
    t_crash = float(crash.read_text())
    return min(starts.values()) - t_crash, starts[max(starts)] - t_crash


def main() -> None:
    """Interleaved A/B runs plus a start-up calibration per round; print a Markdown report."""
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
    first: dict[str, list[float]] = {k: [] for k in cmds}
    same: dict[str, list[float]] = {k: [] for k in cmds}
    startup: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp:
        work = Path(tmp)
        for name, argv in cmds.items():
            one_run(argv, work)
            print(f"warm-up {name} done", file=sys.stderr)
        for i in range(args.runs):
            startup += interpreter_startup(Path(WORKER), bench_env(work, BENCH_CRASH_AFTER="1"), runs=1)
            for name, argv in cmds.items():
                a, b = one_run(argv, work)
                first[name].append(a)
                same[name].append(b)
                print(
                    f"run {i} {name}: first replacement after {a * 1000:.1f} ms, rank {b * 1000:.1f} ms",
                    file=sys.stderr,
                )
    report(cmds, first, same, startup)


def report(
    cmds: dict[str, list[str]],
    first: dict[str, list[float]],
    same: dict[str, list[float]],
    startup: list[float],
) -> None:
    """Markdown table in milliseconds."""
    s0 = statistics.median(startup)
    rows = [
        [
            name,
            Stat.of(first[name]).fmt(1000, 1),
            Stat.of([x - s0 for x in first[name]]).fmt(1000, 1),
            Stat.of(same[name]).fmt(1000, 1),
        ]
        for name in cmds
    ]
    rows.append(
        [
            "**runner/torchrun**",
            ratios(first["runner"], first["torchrun"]).fmt(digits=2),
            "",
            ratios(same["runner"], same["torchrun"]).fmt(digits=2),
        ]
    )
    print(
        f"### Restart latency: {len(startup)} interleaved runs each ({machine_line()})\n"
    )
    print(
        table(
            [
                "launcher",
                "crash -> first replacement ms",
                "minus interpreter start-up ms",
                "crash -> crashed rank's replacement ms",
            ],
            rows,
        )
    )
    print(
        f"\nmedian (min-max). Bare interpreter start-up (Popen -> first statement of the worker), "
        f"calibrated in the same run: {Stat.of(startup).fmt(1000, 1)} ms."
    )
    print_commands(cmds)


if __name__ == "__main__":
    main()
