"""Fit y = 3x + 1 with a DistributedDataParallel linear model on synthetic data; rank 0 reports the loss."""

import argparse

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP


@record
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(1, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard of data
    loss = torch.tensor(0.0)
    for step in range(args.steps):
        x = torch.rand(64, 1, generator=gen) * 2 - 1
        y = 3 * x + 1
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    w, b = model.module.weight.item(), model.module.bias.item()
    if rank == 0:
        print(f"done: {args.steps} steps on {world} ranks, loss {loss.item():.4f}, w={w:.2f} b={b:.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
