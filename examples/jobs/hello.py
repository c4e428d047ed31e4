"""Each rank contributes rank+1; after all_reduce every rank holds world_size*(world_size+1)/2."""

import os

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    assert t.item() == expected, f"all_reduce gave {t.item()}, expected {expected}"
    print(
        f"rank {rank}/{world}: all_reduce={t.item():g} ok, "
        f"torchelastic_launched={dist.is_torchelastic_launched()}, "
        f"restart_count={os.environ['TORCHELASTIC_RESTART_COUNT']}",
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
