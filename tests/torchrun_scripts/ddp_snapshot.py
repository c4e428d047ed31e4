"""A DDP trainer in the style of PyTorch's multinode tutorial: gloo on CPU, a snapshot after every epoch, resumed
when the job is started again. Rank 1 crashes once (after epoch 2, leaving SNAPSHOT.crashed behind) so the first run
fails and the second resumes.

Usage: ddp_snapshot.py SNAPSHOT EPOCHS. Writes $COMPAT_OUT/env_<rank>_<first|resumed>.json and, on rank 0 at the
end, $COMPAT_OUT/result.json (the final weights).
"""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    """Train EPOCHS epochs from the snapshot, if any."""
    snapshot, epochs = Path(sys.argv[1]), int(sys.argv[2])
    out = Path(os.environ["COMPAT_OUT"])
    crashed = Path(f"{snapshot}.crashed")
    phase = "resumed" if crashed.exists() else "first"
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    (out / f"env_{rank}_{phase}.json").write_text(json.dumps({"env": dict(os.environ), "argv": sys.argv}))
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data, target = torch.randn(8, 4), torch.randn(8, 1)
    start = 0
    if snapshot.exists():
        state = torch.load(snapshot)
        model.module.load_state_dict(state["model"])
        start = state["epoch"]
    for epoch in range(start, epochs):
        loss = ((model(data) - target) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "epoch": epoch + 1}, f"{snapshot}.tmp")
            Path(f"{snapshot}.tmp").replace(snapshot)
        dist.barrier()
        if epoch == 1 and rank == 1 and phase == "first":
            crashed.touch()
            sys.exit(3)  # a crash after the snapshot of epoch 2
    if rank == 0:
        weights = [p.detach().flatten().tolist() for p in model.module.parameters()]
        (out / "result.json").write_text(json.dumps({"weights": weights, "resumed_from": start}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
