"""A pytorch/examples-style DDP script that never calls destroy_process_group (as many real scripts don't).

Trains a small model for a few epochs with gloo on the CPU, prints the last epoch, and returns from main: the
process group is torn down by the interpreter's exit, with gloo's threads still alive. bench/abort_at_exit.py counts
how often that exit aborts (SIGABRT: "terminate called without an active exception") under each launcher.
"""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(int(os.environ.get("EPOCHS", "3"))):
        for _ in range(10):
            x = torch.randn(16, 32)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
