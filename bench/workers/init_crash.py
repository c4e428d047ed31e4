"""Benchmark worker (torch, gloo): the last rank crashes right after init_process_group on attempt 0.

Rank 0 goes on into an all_reduce that can never complete. Attempt >= 1: all_reduce, then
$BENCH_OUT/ok-<attempt>-<rank> is written. $BENCH_CRASH_HOW: 'raise' (an uncaught exception, default) or
'exit' (os._exit(1)).
"""

import os

import torch
import torch.distributed as dist


def main() -> None:
    """One attempt."""
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == world - 1 and attempt == 0:
        if os.environ.get("BENCH_CRASH_HOW", "raise") == "exit":
            os._exit(1)
        raise RuntimeError(f"rank {rank} crashed on attempt {attempt} (on purpose)")
    t = torch.ones(1)
    dist.all_reduce(t)
    with open(
        os.path.join(os.environ["BENCH_OUT"], f"ok-{attempt}-{rank}"),
        "w",
        encoding="ascii",
    ) as f:
        f.write(repr(t.item()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
