"""A gloo job that fails on its first attempts and then succeeds: the restart demo (examples/jobs/restart.yaml).

On attempts 0 .. --fail-attempts - 1 (TORCHELASTIC_RESTART_COUNT), rank --fail-rank raises RuntimeError, or with
--exit-code N prints one line to stderr and exits with N; @record writes the raised error to torchrun's error file
($TORCHELASTIC_ERROR_FILE), where the runner reads the root cause. Every other rank, and every rank on a later
attempt, joins the gloo group, all-reduces a 1 and prints `rank R: attempt A ok, all_reduce=<world size>`.
"""

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
    # It fails before init_process_group: the others wait for it there until the runner stops them, so the
    # root cause is always this rank (after init, its death would race with the others' gloo errors).
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
