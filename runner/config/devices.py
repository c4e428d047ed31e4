"""`nproc_per_node: auto | gpu | xpu | cpu`: count this machine's devices as torchrun does, without importing torch.

torchrun asks torch (`torch.cuda.device_count()`, `torch.xpu.device_count()`, `torch.accelerator`); the agent
never imports torch, so the counts come from what the drivers expose:

- gpu: NVIDIA GPUs (/proc/driver/nvidia/gpus, one folder each) or AMD GPUs (/sys/class/kfd topology nodes with
  SIMD units), narrowed by CUDA_VISIBLE_DEVICES (HIP_VISIBLE_DEVICES for AMD) as the CUDA runtime reads it:
  entries up to the first one that is not a device.
- xpu: Intel GPUs (/sys/class/drm/cardN bound to the i915 or xe driver), narrowed by ZE_AFFINITY_MASK.
- cpu: the CPUs this process may run on (sched_getaffinity: taskset and cgroup cpusets), as torch._utils.cpu_count.
- auto: GPUs if any, else Intel GPUs, else CPUs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

KINDS = ("auto", "gpu", "xpu", "cpu")


def visible(environ: Mapping[str, str], name: str, present: int) -> int:
    """How many of `present` devices a `*_VISIBLE_DEVICES` list leaves: entries up to the first invalid one."""
    raw = environ.get(name)
    if raw is None:
        return present
    count = 0
    for entry in raw.split(","):
        item = entry.strip()
        if item.startswith(("GPU-", "MIG-")) or (item.isdigit() and int(item) < present):
            count += 1
        else:
            break
    return min(count, present)


def nvidia_gpus(root: Path) -> int:
    """NVIDIA GPUs the driver lists."""
    folder = root / "proc/driver/nvidia/gpus"
    try:
        return sum(1 for _ in folder.iterdir())
    except OSError:
        return 0


def amd_gpus(root: Path) -> int:
    """AMD GPUs: kfd topology nodes with SIMD units (CPU nodes have none)."""
    count = 0
    try:
        nodes = list((root / "sys/class/kfd/kfd/topology/nodes").iterdir())
    except OSError:
        return 0
    for node in nodes:
        try:
            props = (node / "properties").read_text(encoding="ascii", errors="replace")
        except OSError:
            continue
        simd = next((line.split()[-1] for line in props.splitlines() if line.startswith("simd_count")), "0")
        count += simd.isdigit() and int(simd) > 0
    return count


def intel_gpus(root: Path) -> int:
    """Intel GPUs: DRM cards bound to the i915 or xe driver."""
    count = 0
    try:
        cards = [c for c in (root / "sys/class/drm").iterdir() if c.name.startswith("card") and c.name[4:].isdigit()]
    except OSError:
        return 0
    for card in cards:
        try:
            driver = (card / "device/driver").resolve().name
        except OSError:
            continue
        count += driver in ("i915", "xe")
    return count


def gpus(environ: Mapping[str, str], root: Path = Path("/")) -> int:
    """NVIDIA or AMD GPUs this process would see."""
    nvidia = nvidia_gpus(root)
    if nvidia:
        return visible(environ, "CUDA_VISIBLE_DEVICES", nvidia)
    amd = amd_gpus(root)
    amd = visible(environ, "HIP_VISIBLE_DEVICES", amd)
    return visible(environ, "CUDA_VISIBLE_DEVICES", amd)


def xpus(environ: Mapping[str, str], root: Path = Path("/")) -> int:
    """Intel GPUs this process would see (ZE_AFFINITY_MASK lists devices or sub-devices, one entry each)."""
    present = intel_gpus(root)
    mask = environ.get("ZE_AFFINITY_MASK")
    if mask is None or not present:
        return present
    return len({entry.strip().split(".")[0] for entry in mask.split(",") if entry.strip()})


def cpus() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0))


def count(kind: str, environ: Mapping[str, str], root: Path = Path("/")) -> int:
    """Workers per node for `kind` (one of KINDS); 0 when there is no such device."""
    if kind == "cpu":
        return cpus()
    if kind == "gpu":
        return gpus(environ, root)
    if kind == "xpu":
        return xpus(environ, root)
    return gpus(environ, root) or xpus(environ, root) or cpus()


def nvidia_gpus_used(nproc_raw: object, nproc: int, gpus_per_node: int, environ: Mapping[str, str],
                     root: Path = Path("/")) -> int:
    """`health.gpus: auto`: the NVIDIA GPUs the spec uses on this node (0: none, nothing to check).

    nproc_per_node when it counted NVIDIA GPUs (`gpu`, or `auto` on a node whose driver lists some); else
    cluster.gpus_per_node (what the scheduler was asked for), unless this node's GPUs are AMD's (nvidia-smi cannot
    check those).
    """
    nvidia = nvidia_gpus(root) > 0
    if nproc_raw in ("gpu", "auto") and nvidia and gpus(environ, root) > 0:
        return nproc
    if gpus_per_node and (nvidia or not amd_gpus(root)):
        return gpus_per_node
    return 0
