"""Rendezvous scaling: runner's etcd protocol vs torch's DynamicRendezvousHandler (c10d / TCPStore).

N nodes in one process (runner: asyncio tasks, each with its own gRPC channel, against one real etcd, a fresh one per
size; torch: threads against one TCPStore). Time = from start (before connecting) until every node has its result
(runner: and its round monitor watching). Beside the time, what the runner side cost, read from the two processes
and from etcd's own metrics (/metrics):

- bench_cpu_s / etcd_cpu_s: CPU seconds of the benchmark process and of etcd over the same interval;
- watch_events: watch events etcd sent (etcd_debugging_mvcc_events_total) from the first connect to the last close,
  and events_per_node = watch_events / N (flat when the total grows linearly);
- rpcs_per_node: unary RPCs etcd answered per node until every node had its result (grpc_server_handled_total);
- watches_per_node: watchers created per node in the same interval (WatchCreateRequests received).

The cyclic garbage collector is off while the N nodes run (gc.freeze() then gc.disable(); --gc keeps it on): one
process holding N agents' objects makes every full collection scan all of them, a cost that N agents on N machines
never pay (each agent's heap is its own and small).

    python bench/rdzv_protocol.py [--sizes 8,16,...] [--repeat 3] [--torch-max 64] [--gc]
                                  [--csv bench/rdzv_protocol.csv] [--png docs/rdzv_scaling.png]
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import gc
import logging
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runner.config.spec import Entrypoint, JobSpec, Nodes, Rendezvous
from runner.rendezvous.etcd.backend import EtcdRendezvous
from runner.testing.etcd_server import EtcdServer, etcd_server, free_port

SIZES = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
FIELDS = ["nodes", "runner_etcd_s", "torch_c10d_s", "bench_cpu_s", "etcd_cpu_s", "watch_events", "events_per_node",
          "rpcs_per_node", "watches_per_node"]
METRIC = re.compile(r"^(\w+)(\{[^}]*\})? (\S+)$")


def etcd_metrics(etcd: EtcdServer) -> dict[str, float]:
    """The counters this benchmark reads from etcd's /metrics (summed over labels)."""
    with urllib.request.urlopen(f"http://{etcd.endpoint}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {"events": 0.0, "unary": 0.0, "watch_creates": 0.0}
    for line in text.splitlines():
        m = METRIC.match(line)
        if m is None:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name == "etcd_debugging_mvcc_events_total":
            out["events"] += value
        elif name == "grpc_server_handled_total" and 'grpc_type="unary"' in labels:
            out["unary"] += value
        elif name == "grpc_server_msg_received_total" and 'grpc_method="Watch"' in labels:
            out["watch_creates"] += value  # the client ends watches by cancelling the stream: every message creates
    return out


def cpu_seconds(pid: int) -> float:
    """utime + stime of process `pid` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class RunnerRun:
    """One runner round of N nodes: time to all results, CPU, and etcd's counts."""

    seconds: float
    bench_cpu: float
    etcd_cpu: float
    events: float
    unary: float
    watch_creates: float


async def runner_round(etcd: EtcdServer, n: int, job: str, *, keep_gc: bool = False) -> RunnerRun:
    """All n EtcdRendezvous nodes through one round, measured."""
    spec = JobSpec(name=job, entrypoint=Entrypoint(script="x.py"), nodes=Nodes(n, n),
                   rendezvous=Rendezvous(backend="etcd", endpoints=(etcd.endpoint,), join_timeout=120,
                                         lease_ttl=30, last_call=0.0))
    nodes = [EtcdRendezvous(spec, f"node{i:04d}", advertise_addr="127.0.0.1") for i in range(n)]
    queue: asyncio.Queue[object] = asyncio.Queue()
    assert etcd.proc is not None
    before = etcd_metrics(etcd)
    if not keep_gc:
        gc.collect()
        gc.freeze()
        gc.disable()
    try:
        cpu, etcd_cpu, start = time.process_time(), cpu_seconds(etcd.proc.pid), time.perf_counter()

        async def one(rdzv: EtcdRendezvous) -> None:
            await rdzv.open(queue)
            await rdzv.next_round(0)

        await asyncio.gather(*(one(r) for r in nodes))
        elapsed = time.perf_counter() - start
        cpu, etcd_cpu = time.process_time() - cpu, cpu_seconds(etcd.proc.pid) - etcd_cpu
        at_results = etcd_metrics(etcd)
        await asyncio.gather(*(r.close("succeeded") for r in nodes))
    finally:
        gc.enable()
        gc.unfreeze()
    after = etcd_metrics(etcd)
    return RunnerRun(elapsed, cpu, etcd_cpu, after["events"] - before["events"],
                     at_results["unary"] - before["unary"], at_results["watch_creates"] - before["watch_creates"])


def torch_round(n: int, job: str) -> float:
    """Seconds until all n torch DynamicRendezvousHandler nodes (threads) have a result."""
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        RendezvousTimeout,
    )

    port = free_port()
    server = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=120))
    errors: list[BaseException] = []

    def node() -> None:
        try:
            store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))
            backend = C10dRendezvousBackend(store, job)
            handler = DynamicRendezvousHandler.from_backend(
                job, store, backend, min_nodes=n, max_nodes=n,
                timeout=RendezvousTimeout(join=timedelta(seconds=120), last_call=timedelta(milliseconds=1)))
            handler.next_rendezvous()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=node, daemon=True) for _ in range(n)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    del server
    if errors:
        raise errors[0]
    return elapsed


def measure(n: int, repeat: int, *, keep_gc: bool) -> dict[str, object]:
    """The median of `repeat` runner rounds of n nodes, each against a fresh etcd."""
    runs: list[RunnerRun] = []
    for i in range(repeat):
        with tempfile.TemporaryDirectory() as tmp, etcd_server(Path(tmp)) as etcd:
            runs.append(asyncio.run(runner_round(etcd, n, f"bench-{n}-{i}", keep_gc=keep_gc)))
    best = sorted(runs, key=lambda r: r.seconds)[len(runs) // 2]  # the median run's own counts
    events = statistics.median(r.events for r in runs)
    return {"nodes": n, "runner_etcd_s": round(best.seconds, 3), "bench_cpu_s": round(best.bench_cpu, 2),
            "etcd_cpu_s": round(best.etcd_cpu, 2), "watch_events": int(events),
            "events_per_node": round(events / n, 2), "rpcs_per_node": round(best.unary / n, 2),
            "watches_per_node": round(best.watch_creates / n, 2), "runs_s": [round(r.seconds, 3) for r in runs]}


def plot(rows: list[dict[str, object]], png: Path) -> None:
    """Time (both sides) and watch events (runner) vs nodes, log-log (skipped when matplotlib is missing)."""
    try:
        import matplotlib as mpl
        mpl.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for col, label in (("runner_etcd_s", "runner (etcd)"), ("torch_c10d_s", "torch DynamicRendezvousHandler (c10d)")):
        pts = [(r["nodes"], r[col]) for r in rows if r[col] != ""]
        left.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    left.set(xscale="log", yscale="log", xlabel="nodes (one process)", ylabel="seconds to all results",
             title="Rendezvous time vs nodes")
    left.legend()
    nodes = [r["nodes"] for r in rows]
    right.plot(nodes, [r["watch_events"] for r in rows], marker="o", label="watch events sent by etcd")
    right.plot(nodes, [r["rpcs_per_node"] * r["nodes"] for r in rows], marker="s",  # type: ignore[operator]
               label="unary RPCs (to all results)")
    right.set(xscale="log", yscale="log", xlabel="nodes (one process)", ylabel="count",
              title="runner: watch events (open to close) and RPCs grow linearly")
    right.legend()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110, bbox_inches="tight")
    print(f"plot: {png}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--repeat", type=int, default=3, help="runner rounds per size (the median is kept)")
    parser.add_argument("--torch-max", type=int, default=64, help="largest size run on the torch side")
    parser.add_argument("--gc", action="store_true", help="keep the cyclic garbage collector on")
    parser.add_argument("--csv", default="bench/rdzv_protocol.csv")
    parser.add_argument("--png", default="docs/rdzv_scaling.png")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    rows: list[dict[str, object]] = []
    for n in (int(s) for s in args.sizes.split(",")):
        row = measure(n, args.repeat, keep_gc=args.gc)
        theirs = torch_round(n, f"bench-{n}") if n <= args.torch_max else None
        row["torch_c10d_s"] = "" if theirs is None else round(theirs, 3)
        rows.append(row)
        print(f"{n:>5} nodes  runner/etcd {row['runner_etcd_s']:7.3f} s (runs {row.pop('runs_s')}, cpu bench "
              f"{row['bench_cpu_s']} s, etcd {row['etcd_cpu_s']} s; per node: {row['events_per_node']} watch events, "
              f"{row['rpcs_per_node']} RPCs, {row['watches_per_node']} watches)   torch/c10d "
              f"{'-' if theirs is None else f'{theirs:7.3f} s'}", flush=True)
    with open(args.csv, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"csv: {args.csv}")
    plot(rows, Path(args.png))


if __name__ == "__main__":
    main()
