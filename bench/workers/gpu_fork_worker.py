"""Worker of bench/gpu_fork_server.py: attempt 0 crashes at once; attempt 1 all_reduces on the GPU (or the CPU
with gloo) and writes $BENCH_OUT/ok-1 with what it saw (torch already imported? CUDA initialised before its code?).
"""

import os
import sys

PRELOADED = "torch" in sys.modules

import torch
import torch.distributed as dist

attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
out = os.environ["BENCH_OUT"]
cuda_before = torch.cuda.is_initialized()
if attempt == 0:
    raise RuntimeError("attempt 0 crashes at once (on purpose)")
backend = os.environ.get("BENCH_BACKEND", "nccl")
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else torch.device("cpu")
if device.type == "cuda":
    torch.cuda.set_device(device)
dist.init_process_group(backend)
t = torch.ones(4, device=device)
dist.all_reduce(t)
torch.cuda.synchronize() if device.type == "cuda" else None
with open(os.path.join(out, f"ok-{attempt}"), "w") as f:
    f.write(f"preloaded={PRELOADED} cuda_before={cuda_before} device={device} sum={t.sum().item()}")
dist.destroy_process_group()
