"""Chaos soak worker for replica groups (torch, torchft, gloo, CPU): bench/chaos.py --replica-groups.

    chaos_ft.py --steps N --out DIR [--step-time 0.1] [--timeout 5] [--quorum-timeout 30]

One replica group's worker: fits y = 3x + 1 with a linear model, averaging its gradients with the other groups through
TorchFT's Manager, the way examples/jobs/ft_train.py does (the group's own gloo world for the Manager's store, a
quorum from the lighthouse every step, should_commit() before the optimizer steps; a group that comes back copies
the live weights from a peer). No checkpoint file: a group's state lives in the groups still running. Exits 0 once
the Manager's committed step reaches N; at most one step every --step-time seconds.

What the soak reads, in --out (the soak's own disk, never the logs dir, so a full logs disk hides none of it):
- start-g<group>-<pid>.json when the script starts, before torch is imported: pid, start time in clock ticks
  (/proc/self/stat: the soak proves a pid is this process before it signals it), the group's run dir (from the
  runner's TORCHELASTIC_ERROR_FILE: <run dir>/group_<k>/attempt_<a>/rank_<r>/error.json), the job's run dir, group,
  attempt (TORCHELASTIC_RESTART_COUNT), rank;
- steps-g<group>-<pid>.log from the group's rank 0: one line per step, `step=S commit=0|1 groups=G time=T` (S the
  committed step after it, G the groups the step averaged, T epoch seconds), written as the step ends;
- done-g<group>-<pid>.json right before the exit 0: the same as start, plus the final step.

Like ft_train.py, after each committed step rank 0 writes {"step": S} to $RUNNER_HEARTBEAT_FILE (atomically), which
is how runner learns the group's progress. A thread also touches that file every 0.5 s from the very start (torch's
import and a quorum's wait are no silence); a SIGSTOP stops that thread too, so the watchdog's heartbeat_timeout is
what notices a stopped worker. A write that fails (a full logs disk) is ignored: the worker goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported at run time only after the start marker is written
    import torch
    from torchft.manager import Manager

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


def report_step(step: int) -> None:
    """{"step": S} in $RUNNER_HEARTBEAT_FILE, replaced atomically (a failure is ignored)."""
    path = os.environ.get("RUNNER_HEARTBEAT_FILE")
    if not path:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(json.dumps({"step": step}) + "\n")
        os.replace(tmp, path)
    except OSError:
        pass


def write_json(folder: Path, name: str, doc: dict) -> None:
    """folder/name, atomically (a temp file renamed over it)."""
    tmp = folder / f".{name}.tmp"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, folder / name)


def identity() -> dict:
    """Who this worker is, from the environment the runner gives it."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE", "")
    group_dir = Path(error_file).parents[2] if error_file else None
    return {
        "node": os.environ.get("CHAOS_NODE", "?"),
        "pid": os.getpid(),
        "start_ticks": start_ticks(),
        "run_dir": str(group_dir) if group_dir else "",
        "job_run_dir": str(group_dir.parent) if group_dir else "",
        "group": int(os.environ.get("REPLICA_GROUP_ID", "0")),
        "groups": int(os.environ.get("NUM_REPLICA_GROUPS", "1")),
        "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        "rank": int(os.environ.get("RANK", "0")),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
    }


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--step-time", type=float, default=0.1)
    p.add_argument("--timeout", type=float, default=5.0, help="seconds: collectives, the store, the Manager's RPCs")
    p.add_argument("--quorum-timeout", type=float, default=30.0)
    return p.parse_args()


def make_manager(args: argparse.Namespace, group: int, net: torch.nn.Module, opt: torch.optim.Optimizer) -> Manager:
    """TorchFT's Manager of this group, as ft_train.py makes it (what a recovering peer copies: model and optimizer)."""
    from datetime import timedelta

    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    def state_dict() -> dict:
        return {"model": net.state_dict(), "opt": opt.state_dict()}

    def load_state_dict(sd: dict) -> None:
        net.load_state_dict(sd["model"])
        opt.load_state_dict(sd["opt"])

    return Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=args.timeout)),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"chaos_ft_{group}",  # trailing digits: the group's id
        timeout=timedelta(seconds=args.timeout),
        quorum_timeout=timedelta(seconds=args.quorum_timeout),
        connect_timeout=timedelta(seconds=args.timeout),
    )


def main() -> None:
    args = parse()
    threading.Thread(target=beat_forever, daemon=True).start()
    out = Path(args.out)
    me = identity()
    group = me["group"]
    write_json(out, f"start-g{group}-{me['pid']}.json", {**me, "time": time.time()})

    os.environ.setdefault("RUST_LOG", "warn")
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))  # the group's store (rank 0 hosts it)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # every group starts from the same weights
    net = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    manager = make_manager(args, group, net, opt)
    lines = open(out / f"steps-g{group}-{me['pid']}.log", "a", buffering=1) if rank == 0 else None  # noqa: SIM115
    per_rank = max(1, 240 // (world * me["groups"]))
    while manager.current_step() < args.steps:
        t0 = time.monotonic()
        manager.start_quorum()
        opt.zero_grad()
        gen = torch.Generator().manual_seed(manager.current_step() * 1000 + group * 100 + rank)
        x = torch.rand(per_rank, 1, generator=gen) * 2 - 1
        torch.nn.functional.mse_loss(net(x), 3 * x + 1).backward()
        grads = torch.cat([q.grad.flatten() for q in net.parameters()])
        if world > 1:
            dist.all_reduce(grads)
            grads /= world
        manager.allreduce(grads).wait()  # averaged over the quorum's groups; a failed one is the Manager's to record
        committed = manager.should_commit()  # False when a peer failed during the step: the step is dropped
        if committed:
            torch.nn.utils.vector_to_parameters(grads, [q.grad for q in net.parameters()])
            opt.step()
        step = manager.current_step()
        if lines is not None:
            lines.write(f"step={step} commit={int(committed)} groups={manager.num_participants()} "
                        f"time={time.time():.3f}\n")
            if committed:
                report_step(step)
        time.sleep(max(0.0, args.step_time - (time.monotonic() - t0)))
    final = manager.current_step()
    write_json(out, f"done-g{group}-{me['pid']}.json", {**me, "step": final, "time": time.time()})
    if rank == 0:
        print(f"done: group {group} at step {final}, w={net.weight.item():.2f} b={net.bias.item():.2f}", flush=True)
    manager.shutdown(wait=False)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
