"""Uses torch's own FileTimerClient unchanged: each step runs inside `expires(after=2)`.

On its first attempts the chosen rank hangs inside a step (a stuck collective, a deadlocked loader...):
the runner's watchdog sees the scope expire, captures the Python stacks, and kills only that worker.
"""

import argparse
import os
import time

from torch.distributed.elastic.timer import FileTimerClient, configure, expires


def train_step(step: int, hang: bool) -> None:
    """Pretend to work; hang forever when told to."""
    time.sleep(0.05)
    while hang:
        time.sleep(1)  # the hang: py-spy will show this line


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hang-rank", type=int, default=1)
    p.add_argument("--hang-attempts", type=int, default=1)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()
    rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    for step in range(args.steps):
        hang = rank == args.hang_rank and attempt < args.hang_attempts and step == 2
        with expires(after=2, scope="train_step"):
            train_step(step, hang)
    print(f"rank {rank}: attempt {attempt} finished {args.steps} steps", flush=True)


if __name__ == "__main__":
    main()
