"""Root cause of a failed attempt: which rank, how it died, and why (torch's error file or the stderr tail)."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from runner.events import PEER_REPORTED, PeerLost, TimerExpired
from runner.hangs import Culprit, Verdict, mismatch_words
from runner.outcomes import FailureClass, FailureKind
from runner.rundir.layout import error_file, stderr_log

_HINTS = {
    "SIGKILL": "SIGKILL is often the kernel's OOM killer (check `dmesg` / memory limits) or an external kill",
    "SIGSEGV": "a segfault: often a native extension, a CUDA driver issue, or corrupted memory",
    "SIGABRT": "aborted: often a failed C++ assertion in torch or NCCL; the stderr tail has the message",
    "SIGBUS": "bus error: often /dev/shm too small for DataLoader workers (raise --shm-size in containers)",
    "SIGTERM": "terminated from outside the runner (a scheduler preemption or a kill)",
}
TAIL_LINES = 20
OOM_HINT = "the kernel's OOM killer: the worker needs more memory than its limit (cgroup memory.max, the machine)"
# How a peer's loss reads (runner/rendezvous/etcd/monitor.py words it): a node that ended "stopped" left because
# its agent got a stop signal (the scheduler's SIGTERM: preemption); anything else is a lost node.
PEER_STOPPED = "node ended (stopped)"
_TRACEBACK = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<func>.*)$')
RANK_PREFIX = re.compile(r"^\[(?:default)?rank\d+\]:\s?")  # torch's excepthook marks each line `[rank1]: `
LIBRARY = re.compile(r"/(?:site|dist)-packages/|/lib/python3\.\d+/")  # a frame of a library, not the user's code
EXCEPTION_CHARS = 200  # of an exception line in a reason (gloo's run long)
# What a rank prints when another one died first: its peer's socket closed, its store gone, its communicator aborted
# (gloo's, c10d's and NCCL's words in torch 2.13). Such a failure is collateral: the root cause is elsewhere.
COLLATERAL = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|DistNetworkError|recvValue|failed to recv"
    r"|NCCL communicator was aborted|ProcessGroupNCCL.*(?:[Aa]bort|[Tt]erminat)|Socket Timeout|connect\(\) failed"
)
_VARIES = re.compile(r"0x[0-9a-fA-F]+|\d+")  # addresses and numbers: differ from one attempt to the next


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


def traceback_parts(text: str) -> tuple[str, str] | None:
    """(exception line, innermost frame "file:function") of the last Python traceback in `text`, or None."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == _TRACEBACK]
    if not starts:
        return None
    frame, exc = "", ""
    for line in lines[starts[-1] + 1 :]:
        m = _FRAME.match(line)
        if m:
            frame = f"{m['file']}:{m['func'].strip()}"
        elif line and not line[0].isspace():
            exc = line.strip()
            break
    return (exc, frame) if exc else None


def exception_line(text: str) -> str:
    """`ValueError: bad batch (train.py:42)`: the last traceback's exception and where it was raised, or ''.

    The place is the innermost frame of the user's code (outside the interpreter's and the installed libraries'
    folders), else the innermost frame; torch's `[rank1]: ` marks are read through.
    """
    lines = [RANK_PREFIX.sub("", line) for line in text.splitlines()]
    starts = [i for i, line in enumerate(lines) if line.strip() == _TRACEBACK]
    if not starts:
        return ""
    frames: list[tuple[str, str]] = []
    exc = ""
    for line in lines[starts[-1] + 1 :]:
        m = _FRAME.match(line)
        if m:
            frames.append((m["file"], m["line"]))
        elif line and not line[0].isspace():
            exc = line.strip()
            break
    if not exc:
        return ""
    if len(exc) > EXCEPTION_CHARS:
        exc = exc[: EXCEPTION_CHARS - 3] + "..."
    own = [f for f in frames if not LIBRARY.search(f[0])] or frames
    return f"{exc} ({Path(own[-1][0]).name}:{own[-1][1]})" if own else exc


def collateral(text: str) -> bool:
    """Whether the last exception in a worker's output says a peer died first (a closed connection, a lost store)."""
    return bool(COLLATERAL.search(exception_line(text)))


def fingerprint(traceback: str, error: str = "") -> str:
    """The normalised identity of the exception `traceback` shows ("" without one).

    `error` (torch's error file message) stands in for a missing exception line.
    """
    parts = traceback_parts(traceback)
    if parts is None:
        return ""
    exc, frame = parts
    return f"{_VARIES.sub('N', exc or error)} @ {frame}"  # the frame's path as it is: /data2 is not /data3


def signal_name(exit_code: int) -> str | None:
    """'SIGKILL' for -9, None for a normal exit."""
    if exit_code >= 0:
        return None
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


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
        hint=_HINTS.get(sig or "", ""),
        error=error,
        traceback=tb,
        stderr_tail=stderr_tail,
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


def last_lines(text: str, lines: int = TAIL_LINES) -> str:
    """The last `lines` lines of `text`."""
    return "\n".join(text.splitlines()[-lines:])


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
    return last_lines(data.decode(errors="replace"), lines)


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


# A worker that gave up waiting in a collective: gloo's transport, NCCL's watchdog, c10d's wait (torch 2.13 words)
COLLECTIVE_TIMEOUT = re.compile(
    r"Timed out waiting \d+ms for \w+ operation|Watchdog caught collective operation timeout"
    r"|[Cc]ollective operation timeout|wait timeout after \d+ ?ms|DistBackendError.*[Tt]imed out"
)


def collective_timeout(failure: Failure) -> bool:
    """Whether the worker's error is a collective timeout: a hang a rank gave up on (docs/hangs.md)."""
    return bool(COLLECTIVE_TIMEOUT.search(f"{failure.error}\n{failure.traceback}\n{failure.stderr_tail}"))


# A worker that died of a collective mismatch: gloo's words (a receiver got more than its call expected), c10d's
# (TORCH_DISTRIBUTED_DEBUG=DETAIL's collective fingerprints), NCCL's (torch 2.13 words; NCCL's not tried: no GPU)
COLLECTIVE_MISMATCH = re.compile(
    r"Is there a distributed collective mismatch|Received data size doesn't match expected size"
    r"|[Dd]etected mismatch between collectives|[Cc]ollective (?:operation )?mismatch|[Mm]ismatched collective"
)


def collective_mismatch(failure: Failure) -> str:
    """The line of the worker's error that says it died of a collective mismatch, short ("" when it did not)."""
    return mismatch_line(f"{failure.error}\n{failure.traceback}\n{failure.stderr_tail}")


def mismatch_line(text: str) -> str:
    """The line of `text` that says a collective mismatch, short (runner.hangs.mismatch_words); "" for none."""
    for line in text.splitlines():
        if COLLECTIVE_MISMATCH.search(line):
            return mismatch_words(line)
    return ""


def with_mismatch(failure: Failure, found: Culprit | None) -> Failure:
    """A worker's death of a collective mismatch, with the rank whose call differed as its root cause.

    When the records of the ranks still alive name it; its class stays the death's (a signal, an exception).
    """
    if found is None or not found.verdict.named:
        note = unnamed(found.verdict if found is not None else None, recorder=True)
        return replace(failure, hang=found.verdict if found is not None else None, culprit_note=note)
    return replace(failure, reason=found.verdict.reason(), detected=f"{failure.reason}: a collective mismatch",
                   hang=found.verdict, stacks="\n".join(found.stacks_text()))


def peer_hang(failure: Failure, found: Culprit | None, *, local_ranks: dict[int, int],
              rank_dir: Callable[[int], str]) -> Failure:
    """A peer's FAILED report that follows the hang query this node answered: the hang's culprit as the root cause.

    Every node analysed the same records, so this node names the culprit the detecting node names (one story on
    every node). Unchanged when the records name no culprit.
    """
    if found is None or not found.verdict.named:
        return failure
    verdict = found.verdict
    first = verdict.culprits[0][0]
    local = local_ranks.get(first) if len(verdict.culprits) == 1 else None
    hang = not verdict.died  # a mismatch that aborts keeps its own class, on the node where a rank died of it
    return replace(
        failure, reason=verdict.reason(), detected=reported_line(failure.reason), hang=verdict,
        stacks="\n".join(found.stacks_text()), classified=FailureClass.HANG if hang else None,
        evidence="another node's hang query" if hang else "",
        rank=first if len(verdict.culprits) == 1 else None, local_rank=local,
        log_dir=rank_dir(local) if local is not None else "",
    )


def with_hang(failure: Failure, found: Culprit | None) -> Failure:
    """A collective timeout's failure with the hang's culprit as its root cause, when the records name one.

    Classed `hang` (evidence: the timeout). The rank that timed out stays the failure's rank (its traceback, its
    logs; `restart.scope: worker` replaces it), and what it saw is kept as `detected`.
    """
    if found is None or not found.verdict.named:
        note = unnamed(found.verdict if found is not None else None, recorder=True)
        return replace(failure, hang=found.verdict if found is not None else None, culprit_note=note,
                       classified=FailureClass.HANG, evidence="a collective timeout")
    stacks = "\n".join(found.stacks_text())
    return replace(failure, reason=found.verdict.reason(), detected=f"{failure.reason}: a collective timeout",
                   hang=found.verdict, stacks=stacks, classified=FailureClass.HANG, evidence="a collective timeout")


def watchdog_failure(event: TimerExpired, attempt: int, *, local_ranks: dict[int, int], log_dir: str,
                     recorder: bool, rank_dir: Callable[[int], str]) -> Failure:
    """The failure a watchdog expiry makes: the hang's culprit as the root cause when the records name one.

    `local_ranks` maps this node's global ranks to local ones; `rank_dir(local_rank)` is a rank's log dir;
    `log_dir` the expired worker's. Without a named culprit the rank the watchdog timed out stays the root cause,
    with a line saying why no culprit was named.
    """
    verdict = event.culprit.verdict if event.culprit is not None else None
    base = Failure(kind=FailureKind.WATCHDOG, reason=event.reason, attempt=attempt, rank=event.rank,
                   local_rank=event.local_rank, stacks=event.stacks, log_dir=log_dir, hang=verdict)
    if verdict is None or not verdict.named:
        return replace(base, culprit_note=unnamed(verdict, recorder=recorder))
    assert event.culprit is not None
    stacks = event.culprit.stacks_text()
    if event.stacks:
        stacks.append(f"rank {event.rank} (timed out by the watchdog):\n{event.stacks.rstrip()}")
    first = verdict.culprits[0][0]
    local = local_ranks.get(first) if len(verdict.culprits) == 1 else None
    return replace(
        base, reason=verdict.reason(), detected=event.reason, stacks="\n".join(stacks),
        rank=first if len(verdict.culprits) == 1 else None, local_rank=local,
        log_dir=rank_dir(local) if local is not None else "",
    )


def unnamed(verdict: Verdict | None, *, recorder: bool) -> str:
    """Why a hang's culprit was not named: the line the report shows."""
    if not recorder:
        return ("not analysed: the flight recorder is off (watchdog.flight_recorder: 0); the rank named is the one "
                "the watchdog timed out, which may be one that waited for another")
    if verdict is None:
        return "not analysed (the query failed: see agent.jsonl)"
    if verdict.ranks == 0 and verdict.recorder_off:
        return ("not analysed: the flight recorder is off in the workers (their dumps have no entries: "
                "TORCH_FR_BUFFER_SIZE or TORCH_NCCL_TRACE_BUFFER_SIZE is 0 in their environment); the rank named is "
                "the one seen first, which may be one that waited for another")
    if verdict.ranks == 0 and not verdict.died:
        return ("no rank's flight recorder could be read (workers started cold, or torch not preloaded: "
                "docs/hangs.md)")
    return verdict.reason()
