"""A plain 2-rank gloo script, nothing of the runner's in it (no heartbeat, no timer), for the stall detector.

Modes (argv[1]); every rank first does one all_reduce, then:
  hang        rank 1 sleeps forever; rank 0 waits in all_reduce (a hang torch's gloo would time out in 30 min);
  checkpoint  rank 0 writes a checkpoint file for --seconds (1 MiB every 0.2 s, fsync'ed: a slow disk) while
              rank 1 waits in a barrier;
  first_step  rank 0 computes its first step for --seconds (matrix products) while rank 1 waits in all_reduce;
  loader      rank 0's DataLoader (num_workers=1) warms up for --seconds: its worker decodes (CPU) before the
              first batch; rank 0's main process waits for it, rank 1 waits in all_reduce.
Then 3 more all_reduces and exit 0. `--stamp FILE`: the time the slow part (or the hang) began is written there.
"""

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


def burn(seconds: float) -> None:
    """Compute for `seconds` of wall time."""
    a = torch.rand(128, 128)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        a = torch.tanh(a @ a)


class WarmingUp(Dataset[torch.Tensor]):
    """Its first item takes `seconds` to decode (CPU in the loader's worker process)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 0:
            burn(self.seconds)
        return torch.ones(10)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["hang", "checkpoint", "first_step", "loader"])
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--stamp", default="")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(10)
    dist.all_reduce(t)
    if args.stamp and rank == 0:
        Path(args.stamp).write_text(str(time.time()))
    if rank == 0 and args.mode == "checkpoint":
        out = Path(os.environ.get("OUT", "."), "checkpoint.bin")
        chunk = os.urandom(1 << 20)
        end = time.monotonic() + args.seconds
        with open(out, "wb") as f:
            while time.monotonic() < end:
                f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
                time.sleep(0.2)
        out.unlink()
    elif rank == 0 and args.mode == "first_step":
        burn(args.seconds)
    elif rank == 0 and args.mode == "loader":
        loader = DataLoader(WarmingUp(args.seconds), batch_size=2, num_workers=1)
        for batch in loader:
            t += batch.sum()
    elif rank == 1 and args.mode == "hang":
        time.sleep(3600)
    if args.mode == "checkpoint":
        dist.barrier()
    for _ in range(3):
        dist.all_reduce(t)
    print(f"rank {rank}: done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
