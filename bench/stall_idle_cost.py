"""What a rank blocked in gloo uses, as watchdog.stall_timeout reads it (docs/hangs.md "Why these thresholds").

Two gloo ranks (spawned, torch on CPU): after one all_reduce, rank 1 sleeps and rank 0 waits in `all_reduce` (the
default) or `barrier` (argv[1]). Each rank's whole process tree is read with runner/watchdog/stall.py's read_tree
(CPU clock ticks, rchar+wchar) 30 s apart.

Run: .venv/bin/python bench/stall_idle_cost.py all_reduce; .venv/bin/python bench/stall_idle_cost.py barrier
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time

WINDOW_S = 30.0


def worker(rank: int, mode: str) -> None:
    """One rank: an all_reduce, then rank 1 sleeps and rank 0 waits in `mode`."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29611")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    t = torch.ones(10)
    dist.all_reduce(t)
    if rank == 1:
        time.sleep(3600)
    if mode == "barrier":
        dist.barrier()
    else:
        dist.all_reduce(t)


def main() -> None:
    from runner.watchdog.stall import read_tree

    mode = sys.argv[1] if len(sys.argv) > 1 else "all_reduce"
    procs = [mp.get_context("spawn").Process(target=worker, args=(r, mode)) for r in range(2)]
    for p in procs:
        p.start()
    time.sleep(8)  # both are in their wait
    before = [read_tree(p.pid or 0, None) for p in procs]
    began = time.monotonic()
    time.sleep(WINDOW_S)
    after = [read_tree(p.pid or 0, None) for p in procs]
    took = time.monotonic() - began
    for rank, (a, b) in enumerate(zip(before, after, strict=True)):
        cpu = (b.cpu or 0) - (a.cpu or 0)
        io = (b.io or 0) - (a.io or 0)
        print(f"{mode}: rank {rank} ({'asleep' if rank else 'waiting'}): {cpu} clock ticks of CPU and {io} bytes "
              f"of I/O in {took:.1f} s")
    for p in procs:
        p.kill()


if __name__ == "__main__":
    main()
