"""A 2-rank gloo job that hangs on purpose at step 3 of its first attempt, in one of five ways (docs/hangs.md).

Every rank touches $RUNNER_HEARTBEAT_FILE each step. On attempt 0, at step 3, the culprit rank (--culprit, default
the last rank):
  skip      skips the step's all_reduce and keeps computing and beating: only its peers go silent;
  sleep     sleeps inside the step instead of entering the all_reduce;
  stop      stops itself (SIGSTOP) where the all_reduce would be;
  mismatch  calls all_gather where the others call all_reduce;
  elsewhere calls all_reduce on a process group of itself and rank 0 instead (rank 0 is in the others' call);
  size      every rank calls all_gather, the culprit with a tensor of --size floats (the others: 10): gloo aborts
            the rank that receives more than its call expects (the culprit itself when --size is under 10).
The others wait in the all_reduce. The runner's watchdog finds the silence, reads every rank's flight recorder and
names the culprit; attempt 1 runs clean.
"""

import argparse
import os
import signal
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["skip", "sleep", "stop", "mismatch", "elsewhere", "size"])
    p.add_argument("--size", type=int, default=20, help="size: the culprit's tensor's floats")
    p.add_argument("--culprit", type=int, default=-1, help="the rank that hangs (-1: the last)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--pg-timeout", type=float, default=0, help="init_process_group's timeout in s (0: torch's)")
    p.add_argument("--stamp", default="", help="the culprit writes the time it starts to hang here (benchmarks)")
    p.add_argument("--report-steps", action="store_true",
                   help='write {"step": N} into the heartbeat file each step (watchdog.progress_timeout reads it)')
    args = p.parse_args()
    dist.init_process_group("gloo", **({"timeout": timedelta(seconds=args.pg_timeout)} if args.pg_timeout else {}))
    rank, world = dist.get_rank(), dist.get_world_size()
    culprit = args.culprit % world
    first = int(os.environ["TORCHELASTIC_RESTART_COUNT"]) == 0
    beat = Path(os.environ.get("RUNNER_HEARTBEAT_FILE", os.devnull))  # torchrun sets none
    t = torch.ones(10)
    pair = dist.new_group([0, culprit]) if args.mode == "elsewhere" else None  # every rank makes it
    for step in range(args.steps):
        if args.report_steps and beat != Path(os.devnull):
            part = beat.with_name(beat.name + ".tmp")
            part.write_text(f'{{"step": {step}}}')
            part.replace(beat)  # atomically: a reader never sees half of it
        beat.touch()
        if first and step == 3 and args.mode == "size":
            n = args.size if rank == culprit else 10
            dist.all_gather([torch.ones(n) for _ in range(world)], torch.ones(n))
        if first and rank == culprit and step == 3 and hang(args, beat, t, world):
            continue
        if first and rank == culprit and step == 3 and pair is not None:
            dist.all_reduce(t, group=pair)  # rank 0 never comes: it waits in the others' all_reduce
        dist.all_reduce(t)
        time.sleep(0.05)
    print(f"rank {rank}: {args.steps} steps", flush=True)
    dist.destroy_process_group()


def hang(args: argparse.Namespace, beat: Path, t: torch.Tensor, world: int) -> bool:
    """The culprit's step 3: hang as `args.mode` says; True when it called another collective instead."""
    if args.stamp:
        Path(args.stamp).write_text(f"{time.time()}\n")
    if args.mode == "skip":
        while True:  # a data-dependent branch without the collective; still alive and beating
            beat.touch()
            time.sleep(0.2)
    if args.mode == "sleep":
        time.sleep(3600)
    if args.mode == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    if args.mode == "mismatch":
        dist.all_gather([torch.ones(10) for _ in range(world)], t)
        return True
    return False


if __name__ == "__main__":
    main()
