"""Benchmark worker (torch, gloo): $BENCH_OUT/past-<rank> gets time.time() once init_process_group returns.

Then one all_reduce (the group works) and exit 0.
"""

import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    """Init, stamp, all_reduce."""
    dist.init_process_group("gloo")
    now = time.time()
    rank = dist.get_rank()
    with open(os.path.join(os.environ["BENCH_OUT"], f"past-{rank}"), "w", encoding="ascii") as f:
        f.write(repr(now))
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
