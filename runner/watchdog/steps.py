"""Steps reported through the heartbeat file, and the watch that reads them for the ETTR ledger (docs/watchdog.md).

A worker may write, instead of only touching its `$RUNNER_HEARTBEAT_FILE`, one JSON object:

    {"step": 120, "checkpoint": 100}

`step` is the last step it finished (an int >= 0), `checkpoint` (optional) the step its latest saved checkpoint
would resume at. Other keys are ignored (`{"step": S, "loss": L}` of examples/jobs/ft_train.py reads as step S).
Any other content (an empty file from a touch, text, more than MAX_REPORT_BYTES) is a heartbeat and no step: every
file that worked before still does. Write it atomically (a temporary file renamed over it) so a read never sees
half of it; a torn read is only a report missed, never an error.

The watch stats the current workers' files, every 10 ms after a spawn, the interval doubling up to POLL_S, and
reads only a file that changed. The moment of a report
is its file's modification time brought onto the monotonic clock (clamped between the watch's start and the check
that saw it), so the polling does not blur it; a report overwritten before a check is never seen.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import structlog

from runner.observe.ledger import StepReport
from runner.watchdog.clock import Clock, SystemClock

MAX_REPORT_BYTES = 4096
FIRST_POLL_S = 0.01  # after a spawn, so an attempt's first report is seen before its second overwrites it
POLL_S = 0.25  # the interval doubles from FIRST_POLL_S up to this

Signature = tuple[int, int, int] | None  # (inode, size, mtime_ns)


def parse(raw: bytes) -> tuple[int, int | None] | None:
    """(step, checkpoint) from a heartbeat file's content; None when it holds no step report."""
    if not raw.strip() or len(raw) > MAX_REPORT_BYTES:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    step = counter(value.get("step"))
    return None if step is None else (step, counter(value.get("checkpoint")))


def counter(value: object) -> int | None:
    """`value` if it is an int >= 0 (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def read(path: Path) -> tuple[int, int | None, float] | None:
    """(step, checkpoint, mtime in epoch seconds) of one heartbeat file, or None (no file, no report)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_REPORT_BYTES + 1)
            mtime = os.fstat(f.fileno()).st_mtime_ns / 1e9
    except OSError:
        return None
    found = parse(raw)
    return None if found is None else (*found, mtime)


def reported_step(path: Path) -> int | None:
    """The step a worker's heartbeat file reports now (None: no file, or no step report in it)."""
    found = read(path)
    return found[0] if found is not None else None


def signature(path: Path) -> Signature:
    """What changes when the file is rewritten; None while it does not exist."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class StepWatch:
    """Calls on_report(StepReport) when the highest step (or checkpoint) the watched workers reported changes."""

    def __init__(self, on_report: Callable[[StepReport], None], *, clock: Clock | None = None,
                 interval: float = POLL_S) -> None:
        self._on_report = on_report
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._max = interval
        self._interval = min(FIRST_POLL_S, interval)
        self._files: dict[int, Path] = {}
        self._seen: dict[int, Signature] = {}
        self._since: dict[int, float] = {}  # monotonic: when each file was first watched
        self._reports: dict[int, tuple[int, int | None, float]] = {}  # local rank -> (step, checkpoint, at)
        self._last: tuple[int, int | None] | None = None
        self._handle: asyncio.TimerHandle | None = None

    def watch(self, files: Mapping[int, Path], *, replace: bool) -> None:
        """Watch these workers' files (local rank -> path); `replace`: forget every other (a new attempt)."""
        if replace:
            self.clear()
        now = self._clock.monotonic()
        for rank, path in files.items():
            self._files[rank], self._seen[rank], self._since[rank] = Path(path), None, now
            self._reports.pop(rank, None)
        self._interval = min(FIRST_POLL_S, self._max)
        self._arm()

    def clear(self) -> None:
        """Watch nothing (the attempt's workers are gone)."""
        self._files.clear()
        self._seen.clear()
        self._since.clear()
        self._reports.clear()
        self._last = None
        self._cancel()

    def last_touch(self, local_rank: int) -> float | None:
        """Monotonic time of the last change of `local_rank`'s heartbeat file (touch or report), if there is one."""
        path = self._files.get(local_rank)
        if path is None:
            return None
        try:
            mtime = path.stat().st_mtime_ns / 1e9
        except OSError:
            return None
        return self.to_monotonic(local_rank, mtime)

    def to_monotonic(self, local_rank: int, wall: float) -> float:
        """A file time (epoch s) on the monotonic clock, between the file's watch and now."""
        now = self._clock.monotonic()
        return min(now, max(self._since.get(local_rank, now), now - (self._clock.wall() - wall)))

    def poll(self) -> None:
        """Read every changed file now; report the highest step if it (or the checkpoint) changed."""
        for rank, path in self._files.items():
            sig = signature(path)
            if sig == self._seen[rank]:
                continue
            self._seen[rank] = sig
            found = read(path)
            if found is not None:
                step, checkpoint, mtime = found
                self._reports[rank] = (step, checkpoint, self.to_monotonic(rank, mtime))
        if not self._reports:
            return
        step, _, at = max(self._reports.values(), key=lambda r: (r[0], r[2]))
        checkpoints = [c for _, c, _ in self._reports.values() if c is not None]
        checkpoint = max(checkpoints) if checkpoints else None
        if (step, checkpoint) != self._last:
            self._last = (step, checkpoint)
            try:
                self._on_report(StepReport(step, checkpoint, at))
            except Exception:  # the ledger's bookkeeping must never stop the watch
                structlog.get_logger("runner.watchdog.steps").exception("step_report_failed")

    def _check(self) -> None:
        self._handle = None
        self.poll()
        self._arm()

    def _arm(self) -> None:
        self._cancel()
        if self._files:
            self._handle = asyncio.get_running_loop().call_at(self._clock.monotonic() + self._interval, self._check)
            self._interval = min(self._interval * 2, self._max)

    def _cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
