"""Readiness: when each new worker first says "I am ready" (heartbeat file touched, or a first timer request).

It feeds the time to recover (runner/observe/recovery.py) and never kills or fails anything. A timer request is reported
by the file-timer server as it is read (`request()`). The heartbeat file is looked at: its rank's log dir is new
for every attempt, so the file exists only once the worker has touched it. Files are stat'ed on one
`loop.call_at` handle for all workers still waited for, every 10 ms at first, the interval doubling to 0.25 s (a
script that never says it is ready costs four stats a second). The moment recorded is not when the file was seen
but when it was touched: its mtime, brought onto the monotonic clock through the wall clock's offset at the check,
and kept between the worker's spawn and the check (so a clock step cannot move it outside what is known).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog

from runner.watchdog.clock import Clock, SystemClock

FIRST_INTERVAL_S = 0.01
MAX_INTERVAL_S = 0.25
HEARTBEAT = "heartbeat"
TIMER = "timer"


@dataclass
class _Waiting:
    path: Path
    since: float  # monotonic: when the worker was spawned (watched)


class Readiness:
    """Calls on_ready(local_rank, at, source) once per watched worker: source is "heartbeat" or "timer"."""

    def __init__(
        self,
        on_ready: Callable[[int, float, str], None],
        *,
        clock: Clock | None = None,
        first_interval: float = FIRST_INTERVAL_S,
        max_interval: float = MAX_INTERVAL_S,
    ) -> None:
        self._on_ready = on_ready
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._first = first_interval
        self._max = max_interval
        self._interval = first_interval
        self._waiting: dict[int, _Waiting] = {}
        self._handle: asyncio.TimerHandle | None = None

    def watch(self, heartbeat_files: Mapping[int, Path]) -> None:
        """Wait for these workers (local rank -> heartbeat file), just spawned; a rank watched before is replaced."""
        now = self._clock.monotonic()
        for rank, path in heartbeat_files.items():
            self._waiting[rank] = _Waiting(Path(path), now)
        self._interval = self._first
        self._check()

    def waiting(self) -> list[int]:
        """Local ranks not ready yet."""
        return sorted(self._waiting)

    def request(self, local_rank: int, at: float) -> None:
        """The file-timer server read the first request of `local_rank`'s worker at `at` (monotonic)."""
        if self._waiting.pop(local_rank, None) is not None:
            self._ready(local_rank, at, TIMER)
            if not self._waiting:
                self._cancel()

    def clear(self) -> None:
        """Stop waiting for anyone (the attempt ended)."""
        self._waiting.clear()
        self._cancel()

    def _check(self) -> None:
        self._handle = None
        now, wall = self._clock.monotonic(), self._clock.wall()
        for rank, w in list(self._waiting.items()):
            try:
                touched = w.path.stat().st_mtime_ns / 1e9
            except OSError:
                continue  # not touched yet (or unreadable: then never ready, which is what we can know)
            del self._waiting[rank]
            at = min(now, max(w.since, now - (wall - touched)))
            self._ready(rank, at, HEARTBEAT)
        self._arm()

    def _ready(self, local_rank: int, at: float, source: str) -> None:
        try:
            self._on_ready(local_rank, at, source)
        except Exception:  # a figure's bookkeeping must never stop the watch of the others
            structlog.get_logger("runner.watchdog.readiness").exception("readiness_callback_failed")

    def _arm(self) -> None:
        """The next check, one interval on (the interval doubles up to its cap); none when nobody is waited for."""
        self._cancel()
        if self._waiting:
            when = self._clock.monotonic() + self._interval
            self._interval = min(self._interval * 2, self._max)
            self._handle = asyncio.get_running_loop().call_at(when, self._check)

    def _cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
