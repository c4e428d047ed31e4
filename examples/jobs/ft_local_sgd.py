"""Fault-tolerant LocalSGD with TorchFT: replica groups that step alone and average their weights every N steps.

    runner examples/jobs/ft_local_sgd.yaml      # 2 replica groups of 1 worker each (needs `pip install runner[ft]`)

The same model and data as ft_train.py (imported from it), but the groups talk to each other once every
--sync-every steps instead of every step: each group takes N steps with its own optimizer on its own data
(gradients averaged inside the group only, when it has more than one worker), then TorchFT's LocalSGD
(torchft.local_sgd.LocalSGD) asks the lighthouse for a quorum and averages the weights over the groups in it. The
per-step cost of fault tolerance (a quorum and a cross-group allreduce every step) is paid once per N steps.

A failure costs less than a whole-job restart and more than per-step TorchFT: the survivors go on (their next sync
leaves the dead group out), the dead group's steps since the last sync are lost, and the restarted group waits at
its first sync for the survivors' next one, where it copies their weights (TorchFT's healing) and steps with them
again. That first sync is the script's own, before any step: without it the restarted group would take N steps
on its fresh weights, to be thrown away by the healing. At a fresh start it costs the groups that start last up to N
steps once: the first group to ask gets a quorum of its own (TorchFT's lighthouse does not know the others yet) and
steps on, and the others wait for its next sync.

Prints the lines of ft_train.py (parsed by tests and bench/goodput.py), one `step` line per sync from each group's
rank 0: `step` is the sync count (TorchFT's manager.current_step()), `samples` the samples the sync committed
(groups in it x N x the group's batch; 0 when not committed):
    ft_train start mode=localsgd group=0 groups=2 rank=0 world=1 pid=123 attempt=0 params=1820586 time=<epoch s>
    ft_train step mode=localsgd group=0 step=7 commit=1 groups=2 samples=640 loss=2.3 pid=123 time=<epoch s>
    ft_train inner group=0 samples=16 pid=123 time=<epoch s>      (every inner step: its samples, kept once a
                                                                 later sync of the same process commits)
    ft_train heal group=0 step=7 pid=123 time=<epoch s>         (the group copied a live peer's weights)
    ft_train final group=0 step=30 params_sha=<sha256 of the parameters' bytes>
`--log-every N` prints one `step` line in N syncs (default 1: every one), and always the first, the last, one not
committed and one whose `groups` differs from the line before; the `inner` lines only with N = 1 (they are
bench/goodput.py's accounting, one per inner step). The known noise of TorchFT and torch is not printed, as in
ft_train.py (quiet_known_noise). After every inner step, group rank 0 writes {"step": S, "loss": L} to $RUNNER_HEARTBEAT_FILE (S: the syncs
committed), runner's view of the group's progress and its heartbeat.
"""

from __future__ import annotations

import argparse
import copy
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from ft_train import (
    HEALS,
    StepLines,
    log_every,
    on_sigusr1,
    params_sha,
    per_worker_batch,
    pin_cpus,
    quiet_known_noise,
    report_step,
    say,
    setup,
)
from torch import nn
from torch.nn import functional


def make_manager(args: argparse.Namespace, group: int, model: nn.Module, opt: torch.optim.Optimizer):
    """TorchFT's Manager with a synchronous quorum: a group that heals gets the weights before its sync averages."""
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    def state_dict() -> dict[str, object]:
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    def load_state_dict(sd: dict[str, dict[str, object]]) -> None:
        # The peer's tensors lie in read-only bytes: the optimizer's load would keep them (ft_train.py's make_manager).
        model.load_state_dict(sd["model"])
        opt.load_state_dict(copy.deepcopy(sd["optim"]))
        HEALS.loaded += 1

    return Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=args.timeout)),
        min_replica_size=args.min_replicas,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"ft_local_sgd_{group}",
        use_async_quorum=False,
        timeout=timedelta(seconds=args.timeout),
        # a group waits here for the others to reach their sync: up to N steps of theirs (TorchFT's docs: LocalSGD
        # may need a much longer quorum timeout than per-step FT)
        quorum_timeout=timedelta(seconds=args.quorum_timeout),
        connect_timeout=timedelta(seconds=args.timeout),
    )


def average_in_group(model: nn.Module, world: int) -> None:
    """Average the gradients over the group's own workers (a group of one has nothing to average)."""
    if world == 1:
        return
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad.div_(world)


def train(args: argparse.Namespace) -> None:
    quiet_known_noise()
    from torchft.local_sgd import LocalSGD

    if not os.environ.get("TORCHFT_LIGHTHOUSE"):
        sys.exit("needs TORCHFT_LIGHTHOUSE: run it with runner's replica_groups (examples/jobs/ft_local_sgd.yaml)")
    group = int(os.environ.get("REPLICA_GROUP_ID", "0"))
    groups = int(os.environ.get("NUM_REPLICA_GROUPS", "1"))
    pin_cpus(args.cpus, group)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    worker = group * world + rank
    batch = per_worker_batch(args, groups * world)
    model, corpus = setup(args)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    manager = make_manager(args, group, model, opt)
    say("start", mode="localsgd", group=group, groups=groups, rank=rank, world=world, pid=os.getpid(),
        attempt=os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
        params=sum(p.numel() for p in model.parameters()), time=f"{time.time():.3f}")
    inner = 0  # inner steps since the last sync (each draws its own batch)
    lval = float("nan")
    lines = StepLines(args.log_every)

    def synced(committed: bool) -> None:
        step = manager.current_step()
        if rank == 0:
            participants = manager.num_participants()
            HEALS.say_new(group, step)
            lines.say(mode="localsgd", group=group, step=step, commit=int(committed), groups=participants,
                      last=step >= args.outer_steps,
                      samples=participants * args.sync_every * batch * world if committed and inner else 0,
                      loss=f"{lval:.4f}", pid=os.getpid(), time=f"{time.time():.3f}")
            report_step(step, lval)

    # LocalSGD syncs from the optimizer's post-step hook: after every N-th opt.step() it takes a quorum, averages
    # the weights over the groups in it and, if every group commits, copies the average in (else keeps its own).
    with LocalSGD(manager, model, opt, sync_every=args.sync_every) as local_sgd:
        # Join first: a fresh or restarted group meets the others at their next sync and heals from them (at step
        # 0 of a fresh job, every group starts from the same seed: the average changes nothing).
        local_sgd.sync()
        while manager.current_step() < args.outer_steps:
            before = manager.current_step()
            opt.zero_grad()
            x, y = corpus.batch(before * args.sync_every + inner, worker, batch)
            loss = functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            average_in_group(model, world)
            lval = loss.item()
            inner += 1
            if rank == 0 and args.log_every == 1:  # kept once a later sync of this process commits
                say("inner", group=group, samples=batch * world, pid=os.getpid(), time=f"{time.time():.3f}")
            opt.step()  # the N-th one syncs
            if inner == args.sync_every:
                synced(manager.current_step() > before)
                inner = 0
            elif rank == 0:
                report_step(manager.current_step(), lval)
            if args.step_sleep:
                time.sleep(args.step_sleep)
    if rank == 0:
        say("final", group=group, step=manager.current_step(), params_sha=params_sha(model))
    manager.shutdown(wait=False)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--outer-steps", type=int, default=100, help="syncs to commit (then exit 0)")
    p.add_argument("--sync-every", type=int, default=20, help="N: inner steps between two syncs")
    p.add_argument("--global-batch", type=int, default=32, help="sequences per inner step over every worker")
    p.add_argument("--block", type=int, default=64, help="characters per sequence")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--text", default=None, help="train on this UTF-8 file instead of the generated corpus")
    p.add_argument("--min-replicas", type=int, default=1, help="groups a sync needs to commit")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds: collectives, RPCs and a peer's weights")
    p.add_argument("--quorum-timeout", type=float, default=300.0,
                   help="seconds a sync waits for its quorum (the other groups' N steps included)")
    p.add_argument("--cpus", default="", help="pin group k to the k-th of these '|'-separated CPU lists (0,1|2,3)")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep after each inner step (pacing)")
    p.add_argument("--log-every", type=log_every, default=1, metavar="N",
                   help="print one sync's step line in N (and always the first, the last, one not committed and a "
                        "change in the groups that synced); the inner lines only with 1")
    args = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    signal.signal(signal.SIGUSR1, on_sigusr1)
    train(args)


if __name__ == "__main__":
    main()
