"""Benchmark worker (torch, gloo) for simulated hosts: init_process_group, a stamp, then a beat every 0.1 s.

After init_process_group: time.time() to $BENCH_OUT/past-<RANK>-<restart count>-<hostname>-<pid> (the pid as the
worker's host numbers it). Then, forever: one all_reduce (the whole job trains), and time.time() appended to
$BENCH_OUT/beat-<hostname>, every 0.1 s. A stall of the job is a gap between two beats; a peer that dies breaks the
loop (gloo raises, exit 1), or the launcher stops the worker.
"""

import os
import socket
import time

import torch
import torch.distributed as dist

BEAT_S = 0.1


def main() -> None:
    """One attempt."""
    dist.init_process_group("gloo")
    now = time.time()
    out = os.environ["BENCH_OUT"]
    host = socket.gethostname()
    name = f"past-{dist.get_rank()}-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}-{host}-{os.getpid()}"
    with open(os.path.join(out, name + ".tmp"), "w", encoding="ascii") as f:
        f.write(repr(now))
    os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))
    t = torch.ones(1)
    with open(os.path.join(out, f"beat-{host}"), "a", encoding="ascii") as beats:
        while True:
            dist.all_reduce(t)
            beats.write(f"{time.time()!r}\n")
            beats.flush()
            time.sleep(BEAT_S)


if __name__ == "__main__":
    main()
