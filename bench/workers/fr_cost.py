"""A healthy gloo loop that times its own steps: the flight recorder's cost (bench/hang_culprit.py).

Each rank runs --warmup untimed, then --steps timed all_reduces of --numel floats, and rank 0 appends one JSON line
to --out: the median step in microseconds, the worker's RSS (VmRSS) after the loop, and whether the recorder and
its worker server were on (TORCH_FR_BUFFER_SIZE, RUNNER_FLIGHT_RECORDER_SOCKET).
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--numel", type=int, default=10)
    args = p.parse_args()
    dist.init_process_group("gloo")
    t = torch.ones(args.numel)
    for _ in range(args.warmup):
        dist.all_reduce(t)
    times = []
    for _ in range(args.steps):
        began = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - began)
    if dist.get_rank() == 0:
        line = {"step_us": statistics.median(times) * 1e6, "rss_kib": rss_kib(), "numel": args.numel,
                "fr": os.environ.get("TORCH_FR_BUFFER_SIZE", ""),
                "server": bool(os.environ.get("RUNNER_FLIGHT_RECORDER_SOCKET"))}
        with open(args.out, "a") as f:
            f.write(json.dumps(line) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
