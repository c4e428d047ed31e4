"""Elastic DDP: fit y = 3x + 1, checkpointing every --every steps; every restart resumes from the checkpoint.

The world size may differ between attempts (nodes come and go); the global batch is split across ranks,
so the training is the same whatever the world size. Rank 0 reads and writes the checkpoint and the others get
its step (and, through DDP, its weights).

Where: --checkpoint PATH (a path every node sees, for several machines), else inside this run's run dir, so the
example writes nothing into the source tree. A new run starts fresh: a checkpoint is read only on a restart
(TORCHELASTIC_RESTART_COUNT > 0) or with --resume / ELASTIC_RESUME=1 (to continue an earlier run's PATH).

After each step every rank writes {"step": N, "checkpoint": M} to $RUNNER_HEARTBEAT_FILE: runner's ETTR ledger then
knows the steps each failure cost (docs/goodput.md); it is also a heartbeat.
"""

import argparse
import json
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

GLOBAL_BATCH = 240


def load(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    """Restore model and optimizer; the step to resume at (0 without a checkpoint)."""
    if not path.exists():
        return 0
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    return int(state["step"])


def default_checkpoint() -> Path:
    """<run dir>/elastic-checkpoint.pt (the runner's error file is <run dir>/attempt_K/rank_R/error.json)."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        return Path(error_file).parents[2] / "elastic-checkpoint.pt"
    return Path(tempfile.gettempdir()) / f"elastic-checkpoint-{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}.pt"


def save(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    """Write atomically: a crash mid-write never leaves a torn checkpoint."""
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
    os.replace(tmp, path)


def report(step: int, checkpoint: int) -> None:
    """Tell runner this rank's progress through its heartbeat file, atomically (nothing without one)."""
    target = os.environ.get("RUNNER_HEARTBEAT_FILE")
    if target:
        tmp = Path(target).with_name("heartbeat.tmp")
        tmp.write_text(json.dumps({"step": step, "checkpoint": checkpoint}))
        os.replace(tmp, target)


@record
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--checkpoint", default="", help="default: inside the run dir")
    p.add_argument("--resume", action="store_true", help="read the checkpoint on the first attempt too")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    path = Path(args.checkpoint) if args.checkpoint else default_checkpoint()
    net = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    step = torch.zeros(1, dtype=torch.long)
    resume = args.resume or os.environ.get("ELASTIC_RESUME") == "1"
    if rank == 0 and (restarted or resume):
        step[0] = load(path, net, opt)
    dist.broadcast(step, src=0)
    start = int(step.item())
    model = DDP(net)  # broadcasts rank 0's weights to every rank
    print(f"rank {rank}/{world}: resuming at step {start} "
          f"(restart {os.environ['TORCHELASTIC_RESTART_COUNT']})", flush=True)
    per_rank = GLOBAL_BATCH // world
    saved = start  # the step a restart would resume at
    for step in range(start, args.steps):
        gen = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.rand(per_rank, 1, generator=gen) * 2 - 1
        loss = torch.nn.functional.mse_loss(model(x), 3 * x + 1)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % args.every == 0:
            if rank == 0:
                save(path, net, opt, step + 1)
            saved = step + 1
        report(step + 1, saved)
    if rank == 0:
        w, b = net.weight.item(), net.bias.item()
        print(f"done: {args.steps} steps, last world size {world}, w={w:.2f} b={b:.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
