"""Benchmark worker (torch): how soon after a crash is every rank of the next attempt past init_process_group?

Every attempt: init_process_group($BENCH_BACKEND, default gloo), then $BENCH_OUT/past-<attempt>-<rank> gets
time.time(). The timed crash is on attempt $BENCH_CRASH_ATTEMPT (default 0; earlier attempts end with an untimed
os._exit(1) of the last rank after the same wait); "attempt 0" and "attempt 1" below mean that one and the next. Attempt 0: the last rank waits $BENCH_CRASH_AFTER s (the launchers' standbys, if any, get warm),
writes time.time() to $BENCH_OUT/crash and raises ($BENCH_CRASH_HOW=exit: os._exit(1), no interpreter
teardown); the other ranks wait to be stopped (no collective pending).
Attempt >= 1: one all_reduce (the new group works), $BENCH_OUT/ok-<attempt>-<rank>, exit 0.
$BENCH_OUT/cuda-<attempt>-<rank> records whether CUDA was initialised before this script touched it.
"""

import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    """One attempt."""
    out = os.environ["BENCH_OUT"]
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    backend = os.environ.get("BENCH_BACKEND", "gloo")
    cuda_before = torch.cuda.is_initialized()
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    now = time.time()
    rank, world = dist.get_rank(), dist.get_world_size()
    write(out, f"past-{attempt}-{rank}", repr(now))
    write(out, f"cuda-{attempt}-{rank}", repr(cuda_before))
    measured = int(os.environ.get("BENCH_CRASH_ATTEMPT", "0"))
    if attempt < measured:  # an earlier crash, only to reach the measured attempt (not timed)
        if rank == world - 1:
            time.sleep(float(os.environ.get("BENCH_CRASH_AFTER", "8")))
            os._exit(1)
        while True:
            time.sleep(1)
    if attempt == measured:
        if rank == world - 1:
            time.sleep(float(os.environ.get("BENCH_CRASH_AFTER", "8")))
            write(out, "crash", repr(time.time()))
            if os.environ.get("BENCH_CRASH_HOW", "raise") == "exit":
                os._exit(1)  # dies at once: what follows is the launcher's recovery alone
            raise RuntimeError(f"rank {rank} crashed on attempt {attempt} (on purpose)")
        while True:
            time.sleep(1)
    t = torch.ones(1, device=device)
    dist.all_reduce(t)
    write(out, f"ok-{attempt}-{rank}", repr(t.item()))
    dist.destroy_process_group()


def write(out: str, name: str, text: str) -> None:
    """One small file in $BENCH_OUT."""
    with open(os.path.join(out, name), "w", encoding="ascii") as f:
        f.write(text)


if __name__ == "__main__":
    main()
