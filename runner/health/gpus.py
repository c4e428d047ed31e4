"""The GPUs a node needs: visible and healthy as nvidia-smi reports them.

One query, `nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,ecc.errors.uncorrected.volatile.total
--format=csv,noheader,nounits` (fields every driver of the last decade knows), run like a check command (its own
process group, a timeout). A GPU is unhealthy when a field says the GPU is lost or in an unknown error, or when it
counts uncorrectable ECC errors since the driver loaded. nvidia-smi not answering in time (a hung driver) or
exiting non-zero is a failure of its own.

Which GPUs the workers use: the first `needed` of those CUDA_VISIBLE_DEVICES leaves visible, in its order (entries
up to the first that names no GPU, as the CUDA runtime reads it: indices, GPU-UUID prefixes). Indices are
nvidia-smi's, i.e. PCI bus order, which is CUDA's order on a node of identical GPUs (or with
CUDA_DEVICE_ORDER=PCI_BUS_ID). A MIG instance (MIG-...) counts as visible but is not checked itself.

On a machine without NVIDIA GPUs this module is only exercised through `parse_query` and `assess` on recorded
nvidia-smi output (tests/health/test_health.py).
"""

from __future__ import annotations

import csv
import shutil
from collections.abc import Mapping
from dataclasses import dataclass

from runner.health.commands import ProcessGuard, run_command
from runner.health.report import HealthFailure, bounded

FIELDS = ("index", "uuid", "name", "pci.bus_id", "ecc.errors.uncorrected.volatile.total")
TIMEOUT_S = 30.0  # nvidia-smi answers in well under a second on a healthy node
BAD_VALUES = ("gpu is lost", "unknown error", "requires reset", "unable to determine")


@dataclass(frozen=True)
class Gpu:
    """One row of the query; `problem` is "" for a healthy GPU."""

    index: int
    uuid: str
    name: str
    bus_id: str
    problem: str = ""

    def label(self) -> str:
        """How a reason names it."""
        return f"GPU {self.index} ({self.bus_id or self.uuid})"


def query_argv(nvidia_smi: str) -> list[str]:
    """The command line of the query."""
    return [nvidia_smi, f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits"]


def parse_query(text: str) -> tuple[list[Gpu], list[str]]:
    """(the GPUs of the query's output, the lines that are no GPU row: nvidia-smi's own error lines)."""
    gpus: list[Gpu] = []
    other: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        row = [cell.strip() for cell in next(csv.reader([line], skipinitialspace=True), [])]
        if len(row) != len(FIELDS) or not row[0].isascii() or not row[0].isdigit():
            other.append(line.strip())
            continue
        index, uuid, name, bus_id, ecc = row
        gpus.append(Gpu(int(index), uuid, name, bus_id, problem_of(row, ecc)))
    return gpus, other


def problem_of(row: list[str], ecc: str) -> str:
    """Why a GPU row says the GPU is unhealthy ("" if it does not)."""
    for cell in row:
        if any(bad in cell.lower() for bad in BAD_VALUES):
            return cell.strip("[]")
    if ecc.isascii() and ecc.isdigit() and int(ecc) > 0:
        return f"{int(ecc)} uncorrectable ECC error(s) since the driver loaded"
    return ""


def visible(gpus: list[Gpu], cuda_visible_devices: str | None) -> list[Gpu | str]:
    """The GPUs a worker sees, in CUDA's order; a MIG entry is kept as its text (visible, not checked)."""
    if cuda_visible_devices is None:
        ordered: list[Gpu | str] = [*sorted(gpus, key=lambda g: g.index)]
        return ordered
    by_index = {g.index: g for g in gpus}
    out: list[Gpu | str] = []
    for entry in cuda_visible_devices.split(","):
        item = entry.strip()
        if item.startswith("MIG-"):
            out.append(item)
            continue
        if item.isascii() and item.isdigit() and int(item) in by_index:
            found: Gpu | None = by_index[int(item)]
        elif item.startswith("GPU-"):
            matches = [g for g in gpus if g.uuid.startswith(item)]
            found = matches[0] if len(matches) == 1 else None
        else:
            found = None
        if found is None or found in out:
            break  # the CUDA runtime stops at the first entry that names no (new) GPU
        out.append(found)
    return out


def assess(gpus: list[Gpu], needed: int, cuda_visible_devices: str | None) -> list[HealthFailure]:
    """Failures: fewer than `needed` GPUs visible, or an unhealthy one among the first `needed`."""
    seen = visible(gpus, cuda_visible_devices)
    failures = []
    if len(seen) < needed:
        where = "" if cuda_visible_devices is None else f" with CUDA_VISIBLE_DEVICES={cuda_visible_devices!r}"
        failures.append(HealthFailure("gpus", f"needs {needed} GPU(s), {len(seen)} visible{where}"))
    failures += [HealthFailure("gpus", g.problem, g.label()) for g in seen[:needed] if isinstance(g, Gpu) and
                 g.problem]
    return failures


async def check_gpus(
    needed: int,
    *,
    environ: Mapping[str, str],
    helper_environ: Mapping[str, str],
    nvidia_smi: str | None = None,
    timeout: float = TIMEOUT_S,
    guard: ProcessGuard | None = None,
) -> list[HealthFailure]:
    """Failures of the `needed` GPUs the workers (environment `environ`) use; nvidia-smi runs in `helper_environ`."""
    exe = nvidia_smi or shutil.which("nvidia-smi", path=helper_environ.get("PATH"))
    if exe is None:
        return [HealthFailure("gpus", f"needs {needed} NVIDIA GPU(s), but nvidia-smi is not on PATH")]
    result = await run_command(query_argv(exe), timeout=timeout, env=helper_environ, tail_bytes=65536, guard=guard)
    if result.error:
        return [HealthFailure("gpus", result.error)]
    if result.timed_out:
        return [HealthFailure("gpus", f"nvidia-smi did not answer in {timeout:g} s (a hung driver?)")]
    if result.exit_code != 0:
        said = bounded(result.stdout.decode(errors="replace") + "\n" + result.stderr.decode(errors="replace"))
        return [HealthFailure("gpus", f"nvidia-smi failed (exit {result.exit_code}): {said}")]
    gpus, _ = parse_query(result.stdout.decode(errors="replace"))
    return assess(gpus, needed, environ.get("CUDA_VISIBLE_DEVICES"))
