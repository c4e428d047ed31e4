"""Root cause of a failed attempt: which rank, how it died, and why (torch's error file or the stderr tail)."""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.outcomes import FailureKind
from runner.workers.launch_plan import error_file

_HINTS = {
    "SIGKILL": "SIGKILL is often the kernel's OOM killer (check `dmesg` / memory limits) or an external kill",
    "SIGSEGV": "a segfault: often a native extension, a CUDA driver issue, or corrupted memory",
    "SIGABRT": "aborted: often a failed C++ assertion in torch or NCCL; the stderr tail has the message",
    "SIGBUS": "bus error: often /dev/shm too small for DataLoader workers (raise --shm-size in containers)",
    "SIGTERM": "terminated from outside the runner (a scheduler preemption or a kill)",
}
TAIL_LINES = 20


@dataclass(frozen=True)
class Failure:
    """Why an attempt failed; rendered as the short report at the end of the run."""

    kind: FailureKind
    reason: str
    attempt: int
    rank: int | None = None
    local_rank: int | None = None
    exit_code: int | None = None
    signal: str | None = None
    hint: str = ""
    error: str = ""  # message from torch's error file
    traceback: str = ""  # traceback from torch's error file
    stderr_tail: str = ""
    stacks: str = ""  # Python stacks captured before a watchdog kill
    log_dir: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def report(self) -> str:
        """A few lines a human reads first."""
        lines = [f"root cause (attempt {self.attempt}): {self.reason}"]
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        if self.error:
            lines.append(f"  error: {self.error}")
        detail = self.traceback or self.stderr_tail
        if detail:
            label = "traceback" if self.traceback else "last lines of stderr"
            lines.append(f"  {label}:")
            lines += [f"    {line}" for line in detail.rstrip().splitlines()[-TAIL_LINES:]]
        if self.stacks:
            lines.append("  stacks before the kill:")
            lines += [f"    {line}" for line in self.stacks.rstrip().splitlines()[:60]]
        if self.log_dir:
            lines.append(f"  logs: {self.log_dir}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form for the failure file and status."""
        out = {k: v for k, v in self.__dict__.items() if v not in (None, "", {})}
        out["kind"] = self.kind.value
        return out


def signal_name(exit_code: int) -> str | None:
    """'SIGKILL' for -9, None for a normal exit."""
    if exit_code >= 0:
        return None
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


def worker_failure(attempt: int, rank: int, local_rank: int, exit_code: int, log_dir: str) -> Failure:
    """Failure of a worker that exited with `exit_code`, with what its log dir tells."""
    sig = signal_name(exit_code)
    how = f"killed by {sig}" if sig else f"exited with code {exit_code}"
    error, tb = read_error_file(Path(error_file(log_dir)))
    return Failure(
        kind=FailureKind.WORKER,
        reason=f"rank {rank} {how}",
        attempt=attempt,
        rank=rank,
        local_rank=local_rank,
        exit_code=exit_code,
        signal=sig,
        hint=_HINTS.get(sig or "", ""),
        error=error,
        traceback=tb,
        stderr_tail="" if tb else tail(Path(log_dir) / "stderr.log"),
        log_dir=log_dir,
    )


def read_error_file(path: Path) -> tuple[str, str]:
    """(message, traceback) from torch's TORCHELASTIC_ERROR_FILE; empty strings when absent or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
        msg = data["message"]
    except (OSError, ValueError, KeyError, TypeError):
        return "", ""
    if isinstance(msg, str):
        return msg.strip().splitlines()[-1] if msg.strip() else "", ""
    text = str(msg.get("message", ""))
    tb = str(msg.get("extraInfo", {}).get("py_callstack", ""))
    first = text.strip().splitlines()[-1] if text.strip() else ""
    return first, tb


def tail(path: Path, lines: int = TAIL_LINES, max_bytes: int = 16384) -> str:
    """The last `lines` lines of a file (reads at most `max_bytes` from its end)."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])
