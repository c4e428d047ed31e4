"""A gloo job whose chosen rank crashes (before init_process_group) on its first attempts; the others wait in init."""

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--fail-rank", type=int, default=1)
    p.add_argument("--fail-attempts", type=int, default=1, help="crash on attempts 0..N-1")
    p.add_argument("--exit-code", type=int, default=0, help="exit with this code instead of raising")
    args = p.parse_args()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank = int(os.environ["RANK"])
    # The failing rank fails before init_process_group: the others wait for it there and are stopped by the
    # runner, so the root cause is always this rank (a crash after init would race with the others' gloo errors).
    if rank == args.fail_rank and attempt < args.fail_attempts:
        if args.exit_code:
            print(f"rank {rank}: exiting with code {args.exit_code} on attempt {attempt}", file=sys.stderr)
            sys.exit(args.exit_code)
        raise RuntimeError(f"rank {rank} crashed on attempt {attempt} (on purpose)")
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"rank {rank}: attempt {attempt} ok, all_reduce={t.item():g}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
