"""Crash after init: does a 2-rank gloo job recover when its last rank crashes right after init_process_group?

bench/workers/init_crash.py (torch, gloo, CPU): on attempt 0 the last rank raises right after
init_process_group while rank 0 is in an all_reduce; attempt 1 must all_reduce and write ok-1-<rank>.
  A: runner bench/jobs/init_crash.yaml                  (max_restarts 1, backoff initial 0s)
  B: torchrun --standalone --nproc-per-node 2 --max-restarts 1 bench/workers/init_crash.py
A and B alternate while both have runs left (B usually gets fewer runs: it can hang). A run succeeds when the
launcher exits 0 and both ranks of attempt 1 wrote their marker; a run still going after --timeout s is
killed (with all its processes) and counts as a failure.

    python bench/crash_after_init.py [--runner-runs 20] [--torchrun-runs 8] [--timeout 90] [--how raise] [--keep-failed DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    Stat,
    bench_env,
    launcher_commands,
    machine_line,
    measure,
    precompile,
    print_commands,
    table,
)

WORKER = "bench/workers/init_crash.py"


def commands() -> dict[str, list[str]]:
    """The two launchers' commands (run from the repository root)."""
    return launcher_commands("bench/jobs/init_crash.yaml", WORKER, max_restarts=1)


def one_run(
    argv: list[str], work: Path, timeout: float, how: str, keep: Path | None
) -> tuple[str, float]:
    """Run once; return (outcome, wall s): outcome 'ok', 'timeout', or 'rc=N, markers=K'."""
    env = bench_env(work, BENCH_CRASH_HOW=how)
    out = work / "out"
    log = work / "launcher.log"
    log.unlink(missing_ok=True)
    m = measure(argv, env=env, timeout=timeout, log_path=log)
    markers = len(list(out.glob("ok-1-*")))
    if m.timed_out:
        outcome = "timeout"
    elif m.rc == 0 and markers == 2:
        outcome = "ok"
    else:
        outcome = f"rc={m.rc}, markers={markers}"
    if outcome != "ok":
        lines = log.read_text(errors="replace").strip().splitlines()
        errors = [
            ln[:300]
            for ln in lines
            if "Error" in ln or "error" in ln or "imed out" in ln
        ]
        print(
            "  launcher output, last error lines:\n    "
            + "\n    ".join(errors[-4:] or lines[-3:]),
            file=sys.stderr,
        )
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(
                log,
                keep
                / f"{Path(argv[0]).name}-{outcome.split(',')[0].replace('=', '')}-{os.getpid()}-"
                f"{len(list(keep.iterdir()))}.log",
            )
    return outcome, m.wall_s


def main() -> None:
    """Alternate A/B runs; print a Markdown report."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runner-runs", type=int, default=20)
    p.add_argument("--torchrun-runs", type=int, default=8)
    p.add_argument(
        "--timeout",
        type=float,
        default=90.0,
        help="seconds per run before it counts as a hang",
    )
    p.add_argument(
        "--how",
        choices=("raise", "exit"),
        default="raise",
        help="how the last rank crashes",
    )
    p.add_argument(
        "--keep-failed",
        type=Path,
        help="copy each failed run's launcher output into this folder",
    )
    args = p.parse_args()
    precompile()
    cmds = commands()
    left = {"runner": args.runner_runs, "torchrun": args.torchrun_runs}
    res: dict[str, list[tuple[str, float]]] = {k: [] for k in cmds}
    with tempfile.TemporaryDirectory(prefix="bench-initcrash-") as tmp:
        while any(left.values()):
            for name, argv in cmds.items():
                if left[name]:
                    left[name] -= 1
                    res[name].append(
                        one_run(
                            argv, Path(tmp), args.timeout, args.how, args.keep_failed
                        )
                    )
                    outcome, wall = res[name][-1]
                    print(
                        f"{name} run {len(res[name])}: {outcome} in {wall:.1f} s",
                        file=sys.stderr,
                    )
    report(cmds, res, args.timeout)


def report(
    cmds: dict[str, list[str]], res: dict[str, list[tuple[str, float]]], timeout: float
) -> None:
    """Markdown table: successes and failure kinds per launcher."""
    rows = []
    for name in cmds:
        runs = res[name]
        if not runs:
            continue
        ok = [w for o, w in runs if o == "ok"]
        failures: dict[str, int] = {}
        for o, _ in runs:
            if o != "ok":
                failures[o] = failures.get(o, 0) + 1
        rows.append(
            [
                name,
                f"{len(ok)}/{len(runs)}",
                ", ".join(f"{k}: {v}" for k, v in failures.items()) or "-",
                Stat.of(ok).fmt(digits=1) if ok else "-",
            ]
        )
    print(f"### Crash after init ({machine_line()})\n")
    print(
        table(
            [
                "launcher",
                "succeeded",
                f"failures (timeout = still running after {timeout:g} s)",
                "wall s of successful runs",
            ],
            rows,
        )
    )
    print_commands(cmds)


if __name__ == "__main__":
    main()
