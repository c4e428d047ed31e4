"""The failure record: why an attempt failed, and how it reads in the report.

Which rank, how it died, the class the budgets charge; built from a worker's exit here, from the flight recorder's
verdict in runner.diagnosis.hang.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from runner.diagnosis.evidence import (
    TAIL_LINES,
    exception_line,
    fingerprint,
    last_lines,
    read_error_file,
    signal_name,
    tail,
)
from runner.events import PEER_REPORTED, PeerLost
from runner.hangs import Verdict
from runner.outcomes import FailureClass, FailureKind
from runner.rundir.layout import error_file, stderr_log
from runner.rundir.records import FailureRecord

HINTS = {
    "SIGKILL": "SIGKILL is often the kernel's OOM killer (check `dmesg` / memory limits) or an external kill",
    "SIGSEGV": "a segfault: often a native extension, a CUDA driver issue, or corrupted memory",
    "SIGABRT": "aborted: often a failed C++ assertion in torch or NCCL; the stderr tail has the message",
    "SIGBUS": "bus error: often /dev/shm too small for DataLoader workers (raise --shm-size in containers)",
    "SIGTERM": "terminated from outside the runner (a scheduler preemption or a kill)",
}
OOM_HINT = "the kernel's OOM killer: the worker needs more memory than its limit (cgroup memory.max, the machine)"
# How a peer's loss reads (runner/rendezvous/etcd/monitor.py words it): a node that ended "stopped" left because
# its agent got a stop signal (the scheduler's SIGTERM: preemption); anything else is a lost node.
PEER_STOPPED = "node ended (stopped)"


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
    extra: dict[str, object] = field(default_factory=dict)
    classified: FailureClass | None = None  # set from evidence; None: the kind's usual class (default_class)
    evidence: str = ""  # what decided the class beyond the kind (the OOM killer's record, ...)
    hang: Verdict | None = None  # a hang's culprit, from every rank's flight recorder (docs/hangs.md)
    detected: str = ""  # a hang: what the watchdog saw (the rank it timed out), when the culprit is another
    culprit_note: str = ""  # a hang whose culprit could not be named: why
    peer: PeerLost | None = None  # a peer's loss: which node, why, its cause (published, so the peers name it too)

    @property
    def failure_class(self) -> FailureClass:
        """The class the restart budgets charge (docs/failure_classes.md)."""
        return self.classified or default_class(self.kind, self.signal, self.reason)

    @property
    def fingerprint(self) -> str:
        """Exception type and message (numbers removed) and innermost frame: the same on every attempt of a crash loop.

        "" when there is no Python traceback (a plain non-zero exit, a signal): such failures never make a loop.
        """
        if self.failure_class is not FailureClass.EXCEPTION:
            return ""
        return fingerprint(self.traceback or self.stderr_tail, self.error)

    def report(self) -> str:
        """A few lines a human reads first."""
        lines = [f"root cause (attempt {self.attempt}): {self.reason}"]
        lines.append(f"  class: {self.failure_class}" + (f" ({self.evidence})" if self.evidence else ""))
        if self.detected:
            lines.append(f"  detected: {self.detected}")
        if self.culprit_note:
            lines.append(f"  culprit: {self.culprit_note}")
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

    def to_dict(self) -> dict[str, object]:
        """JSON-able form for the failure file and status."""
        out = {k: v for k, v in self.__dict__.items() if v not in (None, "", {}) and k != "classified"}
        out["kind"] = self.kind.value
        if self.hang is not None:
            out["hang"] = self.hang.to_dict()
        if self.peer is not None:
            out["peer"] = self.peer.to_dict()
        out["class"] = self.failure_class.value
        if self.fingerprint:
            out["fingerprint"] = self.fingerprint
        return out

    def record(self) -> FailureRecord:
        """The record written to failure.json and report.json (runner.rundir.records)."""
        return FailureRecord.from_dict(json.loads(json.dumps(self.to_dict(), default=str)))

    def with_oom_evidence(self, evidence: str) -> Failure:
        """This failure classed `oom` on `evidence` (runner.workers.oom); unchanged when there is none."""
        if not evidence:
            return self
        return replace(self, classified=FailureClass.OOM, evidence=evidence, hint=OOM_HINT)


def default_class(kind: FailureKind, sig: str | None, reason: str = "") -> FailureClass:
    """The class a failure of `kind` gets from what the agent saw, before any further evidence.

    A worker killed by SIGTERM from outside the runner is `preempted` (Slurm signals a job step's processes when it
    preempts or cancels it); any other signal is `signal` (SIGKILL becomes `oom` only on evidence). A plain non-zero
    exit is `exception`, with or without a traceback. A peer that ended "stopped" (its agent got a stop signal) is
    `preempted`; any other loss of a peer, `node_lost`.
    """
    if kind is FailureKind.WORKER:
        if sig == "SIGTERM":
            return FailureClass.PREEMPTED
        return FailureClass.SIGNAL if sig else FailureClass.EXCEPTION
    if kind is FailureKind.PEER:
        return FailureClass.PREEMPTED if reason.endswith(PEER_STOPPED) else FailureClass.NODE_LOST
    if kind in (FailureKind.WATCHDOG, FailureKind.DEADLINE):
        return FailureClass.HANG
    return FailureClass.INFRA


def worker_failure(attempt: int, rank: int, local_rank: int, exit_code: int, log_dir: str,
                   stderr_seen: str = "") -> Failure:
    """Failure of a worker that exited with `exit_code`, with what its log dir tells.

    `stderr_seen` is the end of its stderr as the agent's tee saw it (kept in memory): preferred to the log file,
    which a full or read-only logs disk may have left short or never created.
    """
    sig = signal_name(exit_code)
    how = f"killed by {sig}" if sig else f"exited with code {exit_code}"
    error, tb = read_error_file(Path(error_file(log_dir)))
    stderr_tail = "" if tb else last_lines(stderr_seen) or tail(Path(stderr_log(log_dir)))
    raised = exception_line(tb or stderr_seen or stderr_tail)
    return Failure(
        kind=FailureKind.WORKER,
        reason=f"rank {rank} {how}" + (f": {raised}" if raised else ""),
        attempt=attempt,
        rank=rank,
        local_rank=local_rank,
        exit_code=exit_code,
        signal=sig,
        hint=HINTS.get(sig or "", ""),
        error=error,
        traceback=tb,
        stderr_tail=stderr_tail,
        log_dir=log_dir,
    )


def reported_line(reason: str) -> str:
    """A peer's `node b lost: reported FAILED: <its cause>` as what this node detected: `node b reported FAILED`."""
    found = re.match(f"(.*?) lost: {PEER_REPORTED}(?:$|: )", reason, re.DOTALL)
    return f"{found[1]} {PEER_REPORTED}" if found else reason.replace(" lost: ", " ")


def peer_reported(failure: Failure) -> bool:
    """A peer's loss seen through its own FAILED state: that peer is alive and charges the failure with its class.

    Read from the loss itself (`peer.why`), never from the words: a hang's analysis rewrites the reason and
    `detected` (a mismatch's "node a reported FAILED"), and a node that missed this charged the round first, with
    its own guess of the class (node_lost), for the peer too (CI).
    """
    if failure.kind is not FailureKind.PEER:
        return False
    if failure.peer is not None:
        return failure.peer.why == PEER_REPORTED
    text = failure.detected or failure.reason  # "node b lost: reported FAILED", then ": <its root cause>" if known
    return re.search(f" lost: {PEER_REPORTED}(?:$|: )", text) is not None
