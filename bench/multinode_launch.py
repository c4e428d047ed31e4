"""Two-node launch: from starting both agents to every rank past init_process_group, with and without standbys.

2 agents on this machine (nodes: 2, nproc_per_node: 1, etcd backend on a real etcd on loopback) run
bench/workers/init_stamp.py (torch, gloo). The second agent starts --stagger s after the first (nodes of a real
job rarely start at the same instant). With standbys (restart.standby: true, the default) each agent starts its
standby in INIT, so importing torch overlaps connecting and waiting for the other node; without
(restart.standby: false) every worker imports torch after the rendezvous. torchrun (c10d, the store on the first
agent) runs the same worker side by side.

  A: runner job.yaml --node n0 ; runner job.yaml --node n1              (standby on)
  B: the same with restart.standby: false
  C: torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT ... (x2)

    python bench/multinode_launch.py [--runs 5] [--stagger 0]
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

from bench.common import (
    ROOT,
    RUNNER,
    Stat,
    launch_all,
    machine_line,
    precompile,
    ratios,
    reproduce_line,
    table,
    torchrun_nodes,
)
from runner.testing.etcd_server import EtcdServer, free_port

WORKER = ROOT / "bench" / "workers" / "init_stamp.py"
TIMEOUT_S = 120.0
KINDS = ("runner", "runner-cold", "torchrun")


def runner_spec(work: Path, endpoint: str, run: int, *, standby: bool) -> Path:
    """A 2-node x 1-worker job on the etcd at `endpoint`."""
    spec = work / "job.yaml"
    spec.write_text(textwrap.dedent(f"""\
        version: 1
        name: bench-launch-{run}-{"warm" if standby else "cold"}
        entrypoint: {{script: {WORKER}}}
        nodes: 2
        nproc_per_node: 1
        rendezvous: {{backend: etcd, endpoints: ["{endpoint}"], master_addr: 127.0.0.1}}
        restart: {{max_restarts: 0, standby: {str(standby).lower()}}}
        logs: {{dir: "{work / 'logs'}", tee: false}}
        """))
    return spec


def one_run(kind: str, run: int, etcd: EtcdServer, base: Path, stagger: float) -> float | None:
    """Seconds from the first agent's start to the last rank past init_process_group; None if the run failed."""
    work = base / f"{kind}-{run}"
    out = work / "out"
    out.mkdir(parents=True)
    env = {**os.environ, "BENCH_OUT": str(out), "OMP_NUM_THREADS": "1", "RUNNER_STANDBY": "1"}
    if kind.startswith("runner"):
        spec = runner_spec(work, etcd.endpoint, run, standby=kind == "runner")
        argvs = [[*RUNNER, str(spec), "--node", f"n{i}"] for i in range(2)]
    else:
        port = free_port()
        argvs = torchrun_nodes(2, port, f"bench-{run}", WORKER)
    t0, codes = launch_all(argvs, env, work, stagger=stagger, timeout=TIMEOUT_S)
    stamps = [float(p.read_text()) for p in out.glob("past-*")]
    ok = len(stamps) == 2 and codes == [0, 0]
    took = max(stamps) - t0 if ok else None
    print(f"{kind} run {run}: {'failed ' + str(codes) if took is None else f'{took:.2f} s'}", file=sys.stderr)
    return took


def main() -> None:
    """Interleaved runs; a Markdown section on stdout."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--stagger", type=float, default=0.0)
    args = p.parse_args()
    precompile()
    base = Path(tempfile.mkdtemp(prefix="bench-launch-"))
    etcd = EtcdServer(base / "etcd-data")
    results: dict[str, list[float | None]] = {k: [] for k in KINDS}
    try:
        etcd.start()
        for kind in KINDS:  # warm-up: page cache, etcd
            one_run(kind, -1, etcd, base, args.stagger)
        for run in range(args.runs):
            for kind in KINDS:
                results[kind].append(one_run(kind, run, etcd, base, args.stagger))
    finally:
        etcd.kill()
        with contextlib.suppress(OSError):
            shutil.rmtree(base)
    print(report(results, args))


def report(results: dict[str, list[float | None]], args: argparse.Namespace) -> str:
    """The Markdown section."""
    rows = []
    for kind, xs in results.items():
        good = [x for x in xs if x is not None]
        rows.append([kind, Stat.of(good).fmt(digits=2) if good else "failed", f"{len(good)}/{len(xs)}"])
    for kind in ("runner", "runner-cold"):
        pairs = [(a, b) for a, b in zip(results[kind], results["torchrun"], strict=True) if a and b]
        if pairs:
            ratio = ratios([a for a, _ in pairs], [b for _, b in pairs]).fmt(digits=2)
            rows.append([f"**{kind}/torchrun**", ratio, ""])
    pairs = [(a, b) for a, b in zip(results["runner"], results["runner-cold"], strict=True) if a and b]
    if pairs:
        rows.append(["**runner/runner-cold**", ratios([a for a, _ in pairs], [b for _, b in pairs]).fmt(digits=2), ""])
    return "\n".join([
        f"### Two-node launch -> every rank past init_process_group (stagger {args.stagger:g} s)",
        "",
        f"Machine: {machine_line()}",
        "",
        table(["launcher", "launch -> all past init, s", "ok runs"], rows),
        "",
        f"Reproduce: `{reproduce_line()}`",
    ])


if __name__ == "__main__":
    main()
