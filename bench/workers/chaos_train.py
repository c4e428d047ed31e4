"""Chaos soak worker (torch, gloo, CPU): a small DDP training loop that checkpoints and resumes (bench/chaos.py).

    chaos_train.py --steps N --ckpt DIR --out DIR [--step-time 0.1] [--every 5]

Fits y = 3x + 1 with a DDP linear model, one step every --step-time seconds (a few steps per second), N steps in
all, then exits 0. Rank 0 saves a checkpoint every --every steps (atomically: a kill mid-write leaves the previous
one) into DIR and every attempt resumes from it, whatever the world size (the global batch is split over the ranks).

What the soak reads, in --out (written atomically, one JSON file each, never in the logs dir):
- start-<node>-<pid>-<ticks>.json when the script starts, before torch is imported: the node ($CHAOS_NODE), pid
  (as the worker's own PID namespace numbers it: on a simulated host, the host's), start time in clock ticks
  (/proc/self/stat, the same in every namespace: the soak proves a pid is this process before it signals it; in the
  name too, since a host that rejoins numbers its processes from 1 again), run dir (from the runner's
  TORCHELASTIC_ERROR_FILE), attempt (TORCHELASTIC_RESTART_COUNT), rank, world size, hostname and the world's
  master (MASTER_ADDR:MASTER_PORT, fresh for every attempt: the soak tells worlds apart by it);
- done-<node>-<pid>-<ticks>.json right before the exit 0, after the last step: the same plus the step it resumed at, N.

Liveness: a thread touches $RUNNER_HEARTBEAT_FILE every 0.5 s from the very start (so torch's import and the wait in
init_process_group are not silence). A SIGSTOP stops that thread too: the watchdog's heartbeat_timeout is what
notices a stopped worker. A beat that fails (a full logs disk) is ignored: the worker goes on.
"""

import argparse
import json
import os
import socket
import threading
import time
from pathlib import Path

BEAT_EVERY_S = 0.5


def start_ticks() -> int:
    """This process's start time in clock ticks since boot (/proc/self/stat field 22)."""
    with open("/proc/self/stat", encoding="ascii") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def beat_forever() -> None:
    """Touch the heartbeat file every BEAT_EVERY_S seconds (no-op without one)."""
    path = os.environ.get("RUNNER_HEARTBEAT_FILE")
    while path:
        try:
            Path(path).touch()
        except OSError:
            pass
        time.sleep(BEAT_EVERY_S)


def write_json(folder: Path, name: str, doc: dict) -> None:
    """folder/name, atomically (a temp file renamed over it)."""
    tmp = folder / f".{name}.tmp"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, folder / name)


def identity() -> dict:
    """Who this worker is, from the environment the runner gives it."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE", "")
    return {
        "node": os.environ.get("CHAOS_NODE", "?"),
        "pid": os.getpid(),
        "start_ticks": start_ticks(),
        "run_dir": str(Path(error_file).parents[2]) if error_file else "",
        "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        "rank": int(os.environ.get("RANK", "0")),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "host": socket.gethostname(),
        "master": f"{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}",
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--step-time", type=float, default=0.1)
    p.add_argument("--every", type=int, default=5)
    args = p.parse_args()
    threading.Thread(target=beat_forever, daemon=True).start()
    out, ckpt = Path(args.out), Path(args.ckpt)
    me = identity()
    write_json(out, f"start-{me['node']}-{me['pid']}-{me['start_ticks']}.json", {**me, "time": time.time()})

    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    net = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    path = ckpt / "model.pt"
    step = torch.zeros(1, dtype=torch.long)
    if rank == 0 and path.exists():
        state = torch.load(path, weights_only=True)
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step[0] = int(state["step"])
    dist.broadcast(step, src=0)
    resumed = int(step.item())
    model = DistributedDataParallel(net)  # rank 0's weights to every rank
    print(f"rank {rank}/{world}: resuming at step {resumed} (attempt {me['attempt']})", flush=True)
    per_rank = max(1, 240 // world)
    for s in range(resumed, args.steps):
        t0 = time.monotonic()
        gen = torch.Generator().manual_seed(s * 1000 + rank)
        x = torch.rand(per_rank, 1, generator=gen) * 2 - 1
        loss = torch.nn.functional.mse_loss(model(x), 3 * x + 1)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and (s + 1) % args.every == 0:
            tmp = ckpt / "model.pt.tmp"
            torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "step": s + 1}, tmp)
            os.replace(tmp, path)
        time.sleep(max(0.0, args.step_time - (time.monotonic() - t0)))
    dist.barrier()  # every rank did every step before any says it is done
    write_json(out, f"done-{me['node']}-{me['pid']}-{me['start_ticks']}.json",
               {**me, "resumed_at": resumed, "steps": args.steps, "world": world, "time": time.time()})
    if rank == 0:
        print(f"done: {args.steps} steps, world size {world}, w={net.weight.item():.2f} b={net.bias.item():.2f}",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
