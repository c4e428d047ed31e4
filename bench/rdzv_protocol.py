"""Rendezvous scaling: runner's etcd protocol vs torch's DynamicRendezvousHandler (c10d / TCPStore).

N nodes in one process (runner: asyncio tasks against one real etcd; torch: threads against one
TCPStore). Time = from start (before connecting) until every node has its result.

    python bench/rdzv_protocol.py [--sizes 8,16,...] [--torch-max 64] [--csv out.csv] [--png docs/rdzv_scaling.png]
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import logging
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runner.config.spec import Entrypoint, JobSpec, Nodes, Rendezvous
from runner.rendezvous.etcd.backend import EtcdRendezvous
from tests.etcd_server import etcd_server, free_port

SIZES = (8, 16, 32, 64, 128, 256, 512)


async def runner_round(endpoint: str, n: int, job: str) -> float:
    """Seconds until all n EtcdRendezvous nodes have a result."""
    spec = JobSpec(name=job, entrypoint=Entrypoint(script="x.py"), nodes=Nodes(n, n),
                   rendezvous=Rendezvous(backend="etcd", endpoints=(endpoint,), join_timeout=120,
                                         lease_ttl=30, last_call=0.0))
    nodes = [EtcdRendezvous(spec, f"node{i:04d}", advertise_addr="127.0.0.1") for i in range(n)]
    queue: asyncio.Queue[object] = asyncio.Queue()
    start = time.perf_counter()

    async def one(rdzv: EtcdRendezvous) -> None:
        await rdzv.open(queue)
        await rdzv.next_round(0)

    await asyncio.gather(*(one(r) for r in nodes))
    elapsed = time.perf_counter() - start
    await asyncio.gather(*(r.close("succeeded") for r in nodes))
    return elapsed


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


def plot(rows: list[dict[str, object]], png: Path) -> None:
    """Log-log plot of both curves (skipped when matplotlib is missing)."""
    try:
        import matplotlib as mpl
        mpl.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for col, label in (("runner_etcd_s", "runner (etcd, per-node keys + watches)"),
                       ("torch_c10d_s", "torch DynamicRendezvousHandler (c10d)")):
        pts = [(r["nodes"], r[col]) for r in rows if r[col] != ""]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    ax.set(xscale="log", yscale="log", xlabel="nodes (one process)", ylabel="seconds to all results",
           title="Rendezvous time vs nodes")
    ax.legend()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120, bbox_inches="tight")
    print(f"plot: {png}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--torch-max", type=int, default=64)
    parser.add_argument("--csv", default="bench/rdzv_protocol.csv")
    parser.add_argument("--png", default="docs/rdzv_scaling.png")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    sizes = [int(s) for s in args.sizes.split(",")]
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp, etcd_server(Path(tmp)) as etcd:
        for n in sizes:
            ours = asyncio.run(runner_round(etcd.endpoint, n, f"bench-{n}"))
            theirs = torch_round(n, f"bench-{n}") if n <= args.torch_max else None
            rows.append({"nodes": n, "runner_etcd_s": round(ours, 3),
                         "torch_c10d_s": "" if theirs is None else round(theirs, 3)})
            print(f"{n:>5} nodes  runner/etcd {ours:7.3f} s   torch/c10d "
                  f"{'-' if theirs is None else f'{theirs:7.3f} s'}", flush=True)
    with open(args.csv, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["nodes", "runner_etcd_s", "torch_c10d_s"])
        writer.writeheader()
        writer.writerows(rows)
    print(f"csv: {args.csv}")
    plot(rows, Path(args.png))


if __name__ == "__main__":
    main()
