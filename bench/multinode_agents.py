"""16 agents as separate processes on this machine, one trivial worker each, meeting through a rendezvous:
time from launching them all to the last worker started. runner (etcd backend, one real etcd on loopback)
vs torchrun (c10d backend, the TCPStore hosted by one of the agents), alternately, in one run.

  A: runner job.yaml --node nI   (x16; nodes: 16, nproc_per_node: 1, rendezvous.backend: etcd)
  B: torchrun --nnodes 16 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT
              --rdzv-id ID bench/workers/start_stamp.py   (x16)
Every worker writes time.time() at its first statement; "all started" = last stamp - launch time.
"Done" = all 16 launchers exited. Both launchers run the same worker with the same interpreter.
CPU = user+sys of every process of the run (agents, helpers, workers; RUSAGE_CHILDREN delta).
The runner's spec is validated once before the clock starts (`runner validate`, as one does before
submitting), so its agents find the schema check cached, as on every run after the first.

    python bench/multinode_agents.py [--nodes 16] [--runs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
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

WORKER = ROOT / "bench" / "workers" / "start_stamp.py"
TIMEOUT_S = 180.0


def runner_spec(work: Path, endpoint: str, nodes: int, run: int) -> Path:
    """A fixed-size job of `nodes` nodes x 1 trivial worker on the etcd at `endpoint`."""
    spec = work / "job.yaml"
    spec.write_text(textwrap.dedent(f"""\
        version: 1
        name: bench-agents-{run}
        entrypoint: {{script: {WORKER}}}
        nodes: {nodes}
        nproc_per_node: 1
        rendezvous: {{backend: etcd, endpoints: ["{endpoint}"], master_addr: 127.0.0.1, last_call: 1s}}
        restart: {{max_restarts: 0}}
        logs: {{dir: "{work / 'logs'}", tee: false}}
        """))
    return spec


def children_cpu() -> float:
    """User + sys seconds of every reaped child so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def one_run(kind: str, nodes: int, run: int, etcd: EtcdServer, base: Path) -> tuple[float, float, bool, float]:
    """(all workers started s, all agents exited s, ok, CPU s) for one launch of `nodes` agents of `kind`."""
    work = base / f"{kind}-{run}"
    out = work / "out"
    out.mkdir(parents=True)
    env = {**os.environ, "BENCH_OUT": str(out), "OMP_NUM_THREADS": "1"}
    if kind == "runner":
        spec = runner_spec(work, etcd.endpoint, nodes, run)
        argvs = [[*RUNNER, str(spec), "--node", f"n{i:02d}"] for i in range(nodes)]
        subprocess.run([*RUNNER, "validate", str(spec)], check=True, capture_output=True)
    else:
        port = free_port()
        argvs = torchrun_nodes(nodes, port, f"bench-{run}", WORKER)
    cpu0 = children_cpu()
    t0, codes = launch_all(argvs, env, work, timeout=TIMEOUT_S)
    done = time.time() - t0
    cpu = children_cpu() - cpu0
    stamps = [float(p.read_text()) for p in out.glob("start-*") if not p.name.endswith(".tmp")]
    ok = len(stamps) == nodes and all(c == 0 for c in codes)
    started = (max(stamps) - t0) if ok else float("nan")
    print(f"{kind} run {run}: all started {started:.2f} s, all exited {done:.2f} s, CPU {cpu:.1f} s, "
          f"codes {sorted(set(codes))}", file=sys.stderr)
    return started, done, ok, cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    precompile()
    base = Path(tempfile.mkdtemp(prefix="bench-mn-"))
    etcd = EtcdServer(base / "etcd-data")
    results: dict[str, list[tuple[float, float, bool, float]]] = {"runner": [], "torchrun": []}
    try:
        etcd.start()
        for run in range(args.runs):
            for kind in ("runner", "torchrun"):
                results[kind].append(one_run(kind, args.nodes, run, etcd, base))
    finally:
        etcd.kill()
        with contextlib.suppress(OSError):
            shutil.rmtree(base)
    print(report(results, args.nodes))


def report(results: dict[str, list[tuple[float, float, bool, float]]], nodes: int) -> str:
    """The Markdown section."""
    rows = []
    for kind, rs in results.items():
        good = [r for r in rs if r[2]]
        if not good:
            rows.append([kind, "failed", "failed", "-", f"0/{len(rs)}"])
            continue
        rows.append([kind, Stat.of([r[0] for r in good]).fmt(digits=2), Stat.of([r[1] for r in good]).fmt(digits=2),
                     Stat.of([r[3] for r in good]).fmt(digits=1), f"{len(good)}/{len(rs)}"])
    pairs = [(a[0], b[0]) for a, b in zip(results["runner"], results["torchrun"], strict=True) if a[2] and b[2]]
    ratio = ratios([b for _, b in pairs], [a for a, _ in pairs]).fmt(digits=1) if pairs else "n/a"
    return "\n".join([
        f"### {nodes} agents as separate processes, one trivial worker each",
        "",
        f"Machine: {machine_line()}",
        "",
        table(["launcher", "all workers started, s", "all agents exited, s", "CPU of the run, s", "ok runs"], rows),
        "",
        f"torchrun / runner (all workers started, paired runs): {ratio}",
        "",
        f"Reproduce: `{reproduce_line()}`",
    ])


if __name__ == "__main__":
    main()
