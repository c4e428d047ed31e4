"""Benchmark worker (torch, gloo): init_process_group, stamp, then all_reduce in a loop until the group breaks.

After init_process_group: time.time() to $BENCH_OUT/past-<RANK>-<restart count>-<pid> (the node-loss benchmark
reads these). Then one all_reduce every 50 ms, forever: a peer that dies breaks the loop (gloo raises, exit 1) or
the launcher stops the worker.
"""

import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    """One attempt."""
    dist.init_process_group("gloo")
    now = time.time()
    out = os.environ["BENCH_OUT"]
    name = f"past-{dist.get_rank()}-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}-{os.getpid()}"
    with open(os.path.join(out, name + ".tmp"), "w", encoding="ascii") as f:
        f.write(repr(now))
    os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))
    t = torch.ones(1)
    while True:
        dist.all_reduce(t)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
