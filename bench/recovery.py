"""Recovery: a crash of one rank -> every rank of the next attempt past init_process_group.

bench/workers/recover_worker.py (torch): on attempt 0 the last rank crashes $BENCH_CRASH_AFTER s after
init_process_group (0: at once, the next attempt's workers must be warm already); attempt 1 must init and all_reduce.
  A: runner, the product's defaults (restart.standby true, preload [torch]: workers forked from the fork server)
  B: runner with restart.standby false (every worker a cold interpreter)
  C: torchrun --standalone --nproc-per-node N --max-restarts <crash attempt + 1> bench/workers/recover_worker.py
Runs interleave A, B, C. recovery = max over ranks of attempt 1's time past init_process_group - the crash time
(same host clock), over the runs where every rank of attempt 1 got past init_process_group; a run succeeds when the
launcher exits 0 and every rank of attempt 1 all_reduced (torchrun's attempt 1 often gets past init and then fails:
docs/benchmarks.md). A run still going after 60 s is killed with all its processes.

    python bench/recovery.py [--runs 5] [--nproc 2] [--backend gloo|nccl] [--crash-after 8] [--how raise|exit]
                             [--crash-attempt 0|1] [--launchers runner,runner-cold,torchrun]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
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
  max_restarts: {restarts}
  backoff: {{initial: 0s}}
  standby: {standby}
shutdown:
  grace_period: 5s
logs:
  dir: ${{BENCH_LOGS}}
"""


def commands(work: Path, nproc: int, restarts: int) -> dict[str, list[str]]:
    """The three launchers' commands (run from the repository root)."""
    root = Path(__file__).resolve().parent.parent
    cmds: dict[str, list[str]] = {}
    for name, standby in (("runner", "true"), ("runner-cold", "false")):
        spec = work / f"{name}.yaml"
        spec.write_text(SPEC.format(worker=root / WORKER, root=root, nproc=nproc, standby=standby, restarts=restarts))
        cmds[name] = [*RUNNER, str(spec)]
    cmds["torchrun"] = [*TORCHRUN, "--standalone", "--nproc-per-node", str(nproc), "--max-restarts", str(restarts),
                        WORKER]
    return cmds


@dataclass
class Run:
    """One run: seconds from the crash to the last rank of attempt 1 past init_process_group (None: not all got
    there), and why the run did not succeed ('' when it did: exit 0, every rank of attempt 1 all_reduced)."""

    past_init: float | None
    failed: str


def one_run(argv: list[str], work: Path, nproc: int, extra: dict[str, str]) -> Run:
    """Run the launcher once."""
    env = bench_env(work, **extra)
    out = Path(env["BENCH_OUT"])
    m = measure(argv, env=env, timeout=60, log_path=work / "launcher.log")
    crash = out / "crash"
    nxt = int(extra["BENCH_CRASH_ATTEMPT"]) + 1
    past = [out / f"past-{nxt}-{r}" for r in range(nproc)]
    ok = [out / f"ok-{nxt}-{r}" for r in range(nproc)]
    took = None
    if crash.exists() and all(p.exists() for p in past):
        took = max(float(p.read_text()) for p in past) - float(crash.read_text())
    failed = ""
    if not crash.exists():
        failed = "the timed crash never came (an earlier attempt failed otherwise)"
    elif m.rc != 0 or not all(p.exists() for p in ok):
        failed = "timeout" if m.timed_out else f"exit code {m.rc}, next attempt all_reduced on {sum(p.exists() for p in ok)}"
    if any((out / f"cuda-{nxt}-{r}").exists() and (out / f"cuda-{nxt}-{r}").read_text() == "True"
           for r in range(nproc)):
        failed = "CUDA was initialised before the worker's own code ran"
    return Run(took, failed)


def main() -> None:
    """Interleaved runs; a Markdown report on stdout, progress on stderr."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="runs of each launcher (after one warm-up each)")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--backend", default="gloo")
    p.add_argument("--crash-after", type=float, default=8.0)
    p.add_argument("--crash-attempt", type=int, default=0,
                   help="the attempt whose crash is timed (1: the crashed worker runs in a standby with the local "
                        "rendezvous, whose first attempt starts cold); earlier attempts end in an untimed crash")
    p.add_argument("--how", choices=("raise", "exit"), default="raise",
                   help="raise: an uncaught exception (the dying interpreter's teardown counts, as in real crashes); "
                        "exit: os._exit(1) (the launcher's recovery alone)")
    p.add_argument("--launchers", default="runner,runner-cold,torchrun",
                   help="which launchers to run, comma-separated (ratios need torchrun)")
    args = p.parse_args()
    precompile()
    extra = {"BENCH_BACKEND": args.backend, "BENCH_CRASH_AFTER": str(args.crash_after),
             "BENCH_CRASH_HOW": args.how, "BENCH_CRASH_ATTEMPT": str(args.crash_attempt)}
    runs: dict[str, list[Run]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        work = Path(tmp)
        wanted = args.launchers.split(",")
        cmds = {k: v for k, v in commands(work, args.nproc, args.crash_attempt + 1).items() if k in wanted}
        for name, argv in cmds.items():
            one_run(argv, work, args.nproc, extra)
            print(f"warm-up {name} done", file=sys.stderr)
        for i in range(args.runs):
            for name, argv in cmds.items():
                r = one_run(argv, work, args.nproc, extra)
                runs.setdefault(name, []).append(r)
                took = "not all past init" if r.past_init is None else f"{r.past_init:.3f} s"
                print(f"run {i} {name}: {took}{'; ' + r.failed if r.failed else ''}", file=sys.stderr)
        report(cmds, runs, args)


def report(cmds: dict[str, list[str]], runs: dict[str, list[Run]], args: argparse.Namespace) -> None:
    """Markdown: seconds per launcher and the ratios to torchrun, taken run by run."""
    print(f"### Crash ({args.how}, attempt {args.crash_attempt}) -> every rank of the next attempt past "
          f"init_process_group ({args.nproc} ranks, "
          f"{args.backend}; {machine_line()})\n")
    rows = []
    for name in cmds:
        xs = [r.past_init for r in runs[name] if r.past_init is not None]
        failed = [r.failed for r in runs[name] if r.failed]
        rows.append([name, Stat.of(xs).fmt() if xs else "-", f"{len(xs)}/{len(runs[name])}",
                     f"{len(runs[name]) - len(failed)}/{len(runs[name])}", "; ".join(sorted(set(failed)))])
    for name in ("runner", "runner-cold"):
        if name not in runs or "torchrun" not in runs:
            continue
        pairs = [(a.past_init, b.past_init) for a, b in zip(runs[name], runs["torchrun"], strict=True)
                 if a.past_init is not None and b.past_init is not None]
        if pairs:
            rows.append([f"**{name}/torchrun**", ratios([a for a, _ in pairs], [b for _, b in pairs]).fmt(digits=2),
                         "", "", ""])
    print(table(["launcher", "crash -> all past init s", "all past init", "succeeded", "failures"], rows))
    print("\nmedian (min-max) over the runs whose every rank got past init_process_group; ratios pair run i with "
          "run i. Succeeded: exit 0 and attempt 1's all_reduce done on every rank.")
    print_commands(cmds)


if __name__ == "__main__":
    main()
