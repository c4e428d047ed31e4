"""Two-node launch on a hosted rendezvous, with and without the job's secret (TLS + auth, docs/security.md).

2 agents on this machine (`--node n0`, `--node n1`; nodes: 2, nproc_per_node: 1), the rendezvous hosted by the
first to bind 127.0.0.1:PORT, run bench/workers/init_stamp.py (torch, gloo). Measured: from starting both agents to
every rank past init_process_group. "secret": RUNNER_SECRET_FILE names a secret (the hosting agent bootstraps TLS
and auth on a loopback port first, every client verifies and authenticates); "plain": none (a loopback job needs
none). The two alternate, run after run.

    python bench/hosted_secret_launch.py [--runs 5]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, RUNNER, Stat, launch_all, machine_line, precompile, ratios, reproduce_line, table
from runner.contract import SECRET_ENV
from runner.rendezvous.etcd.job_secret import new_secret_file
from runner.testing.etcd_server import free_port

WORKER = ROOT / "bench" / "workers" / "init_stamp.py"
TIMEOUT_S = 120.0
KINDS = ("plain", "secret")


def one_run(kind: str, run: int, base: Path) -> float | None:
    """Seconds from the first agent's start to the last rank past init_process_group; None if the run failed."""
    work = base / f"{kind}-{run}"
    out = work / "out"
    out.mkdir(parents=True)
    spec = work / "job.yaml"
    spec.write_text(textwrap.dedent(f"""\
        version: 1
        name: bench-hosted-{kind}-{run}
        entrypoint: {{script: {WORKER}}}
        nodes: 2
        nproc_per_node: 1
        rendezvous: {{backend: etcd, hosted: true, endpoints: ["127.0.0.1:{free_port()}"], master_addr: 127.0.0.1}}
        restart: {{max_restarts: 0}}
        logs: {{dir: "{work / 'logs'}", tee: false}}
        """))
    env = {**os.environ, "BENCH_OUT": str(out), "OMP_NUM_THREADS": "1"}
    env.pop(SECRET_ENV, None)
    if kind == "secret":
        new_secret_file(work / "job.secret")
        env[SECRET_ENV] = str(work / "job.secret")
    argvs = [[*RUNNER, str(spec), "--node", f"n{i}"] for i in range(2)]
    t0, codes = launch_all(argvs, env, work, timeout=TIMEOUT_S)
    stamps = [float(p.read_text()) for p in out.glob("past-*")]
    took = max(stamps) - t0 if len(stamps) == 2 and codes == [0, 0] else None
    print(f"{kind} run {run}: {'failed ' + str(codes) if took is None else f'{took:.2f} s'}", file=sys.stderr)
    return took


def main() -> None:
    """Interleaved runs; a Markdown section on stdout."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    precompile()
    base = Path(tempfile.mkdtemp(prefix="bench-hosted-secret-"))
    results: dict[str, list[float | None]] = {k: [] for k in KINDS}
    try:
        for kind in KINDS:  # warm-up: page cache
            one_run(kind, -1, base)
        for run in range(args.runs):
            for kind in KINDS:
                results[kind].append(one_run(kind, run, base))
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(base)
    rows = []
    for kind, xs in results.items():
        good = [x for x in xs if x is not None]
        rows.append([kind, Stat.of(good).fmt(digits=2) if good else "failed", f"{len(good)}/{len(xs)}"])
    pairs = [(a, b) for a, b in zip(results["secret"], results["plain"], strict=True) if a and b]
    if pairs:
        rows.append(["**secret/plain**", ratios([a for a, _ in pairs], [b for _, b in pairs]).fmt(digits=2), ""])
    print("\n".join([
        "### Hosted rendezvous with and without the secret: two-node launch -> every rank past init_process_group",
        "", f"Machine: {machine_line()}", "",
        table(["rendezvous", "launch -> all past init, s", "ok runs"], rows), "",
        f"Reproduce: `{reproduce_line()}`",
    ]))


if __name__ == "__main__":
    main()
