"""Recovery: a crash of one rank -> every rank of the next attempt past init_process_group.

bench/workers/recover_worker.py (torch): on attempt 0 the last rank crashes $BENCH_CRASH_AFTER s after
init_process_group (long enough for standbys to be warm again); attempt 1 must init and all_reduce.
  A: runner, pre-warmed standby workers (the default: restart.standby true, preload [torch])
  B: runner with restart.standby false (every worker a cold interpreter, as before standbys)
  C: torchrun --standalone --nproc-per-node N --max-restarts 1 bench/workers/recover_worker.py
Runs interleave A, B, C. recovery = max over ranks of attempt 1's time past init_process_group - the crash time
(same host clock). A run counts only if the launcher exits 0 and every rank of attempt 1 all_reduced; a run still going after 60 s is
killed with all its processes (a failure).

    python bench/recovery.py [--runs 5] [--nproc 2] [--backend gloo|nccl] [--crash-after 8] [--how raise|exit]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    RUNNER,
    TORCHRUN,
    Stat,
    bench_env,
    machine_line,
    measure,
    precompile,
    print_commands,
    ratios,
    table,
)

WORKER = "bench/workers/recover_worker.py"
SPEC = """# written by bench/recovery.py
version: 1
name: bench-recover
entrypoint:
  script: {worker}
cwd: {root}
nproc_per_node: {nproc}
restart:
  max_restarts: 1
  backoff: {{initial: 0s}}
  standby: {standby}
shutdown:
  grace_period: 5s
logs:
  dir: ${{BENCH_LOGS}}
"""


def commands(work: Path, nproc: int) -> dict[str, list[str]]:
    """The three launchers' commands (run from the repository root)."""
    root = Path(__file__).resolve().parent.parent
    cmds: dict[str, list[str]] = {}
    for name, standby in (("runner", "true"), ("runner-cold", "false")):
        spec = work / f"{name}.yaml"
        spec.write_text(SPEC.format(worker=root / WORKER, root=root, nproc=nproc, standby=standby))
        cmds[name] = [*RUNNER, str(spec)]
    cmds["torchrun"] = [*TORCHRUN, "--standalone", "--nproc-per-node", str(nproc), "--max-restarts", "1", WORKER]
    return cmds


def one_run(argv: list[str], work: Path, nproc: int, extra: dict[str, str]) -> float | str:
    """Seconds from the crash to the last rank of attempt 1 past init_process_group, or why the run failed."""
    env = bench_env(work, **extra)
    out = Path(env["BENCH_OUT"])
    m = measure(argv, env=env, timeout=60, log_path=work / "launcher.log")
    crash = out / "crash"
    past = [out / f"past-1-{r}" for r in range(nproc)]
    ok = [out / f"ok-1-{r}" for r in range(nproc)]
    if m.rc != 0 or not crash.exists() or not all(p.exists() for p in past + ok):
        return "timeout" if m.timed_out else f"exit code {m.rc}, attempt 1 done on {sum(p.exists() for p in ok)}"
    cuda = [out / f"cuda-1-{r}" for r in range(nproc)]
    if any(p.exists() and p.read_text() == "True" for p in cuda):
        return "CUDA was initialised before the worker's own code ran"
    return max(float(p.read_text()) for p in past) - float(crash.read_text())


def main() -> None:
    """Interleaved runs; a Markdown report on stdout, progress on stderr."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="runs of each launcher (after one warm-up each)")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--backend", default="gloo")
    p.add_argument("--crash-after", type=float, default=8.0)
    p.add_argument("--how", choices=("raise", "exit"), default="raise",
                   help="raise: an uncaught exception (the dying interpreter's teardown counts, as in real crashes); "
                        "exit: os._exit(1) (the launcher's recovery alone)")
    args = p.parse_args()
    precompile()
    extra = {"BENCH_BACKEND": args.backend, "BENCH_CRASH_AFTER": str(args.crash_after), "RUNNER_STANDBY": "1",
             "BENCH_CRASH_HOW": args.how}
    results: dict[str, list[float]] = {}
    failures: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        work = Path(tmp)
        cmds = commands(work, args.nproc)
        for name, argv in cmds.items():
            one_run(argv, work, args.nproc, extra)
            print(f"warm-up {name} done", file=sys.stderr)
        for i in range(args.runs):
            for name, argv in cmds.items():
                got = one_run(argv, work, args.nproc, extra)
                if isinstance(got, float):
                    results.setdefault(name, []).append(got)
                else:
                    failures.setdefault(name, []).append(got)
                print(f"run {i} {name}: {got if isinstance(got, str) else f'{got:.3f} s'}", file=sys.stderr)
        report(cmds, results, failures, args)


def report(cmds: dict[str, list[str]], results: dict[str, list[float]], failures: dict[str, list[str]],
           args: argparse.Namespace) -> None:
    """Markdown: seconds per launcher and the ratios to torchrun, taken run by run."""
    print(f"### Crash ({args.how}) -> every rank of the next attempt past init_process_group ({args.nproc} ranks, "
          f"{args.backend}; {machine_line()})\n")
    rows = []
    for name in cmds:
        xs = results.get(name, [])
        ok = f"{len(xs)}/{len(xs) + len(failures.get(name, []))}"
        rows.append([name, Stat.of(xs).fmt() if xs else "-", ok, "; ".join(sorted(set(failures.get(name, []))))])
    base = results.get("torchrun", [])
    for name in ("runner", "runner-cold"):
        xs = results.get(name, [])
        if xs and len(xs) == len(base):
            rows.append([f"**{name}/torchrun**", ratios(xs, base).fmt(digits=2), "", ""])
    print(table(["launcher", "crash -> all past init s", "succeeded", "failures"], rows))
    print("\nmedian (min-max) over the successful runs; ratios pair run i with run i.")
    print_commands(cmds)


if __name__ == "__main__":
    main()
