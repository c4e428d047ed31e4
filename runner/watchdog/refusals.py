"""Refused timer requests, logged per pid and rate-limited: who tried to arm a timer it may not, never a flood of lines.

The file-timer server refuses a request naming pid 1, the agent itself, the agent's guard, a process not of the
job, a worker of another rank, or a worker over its scope cap. Each refusal is a `timer_request_refused` warning
(pid, reason, local rank of the channel), but per pid only the first at once and then at most one per `interval`
seconds. A line stands for one refusal plus `suppressed`, the pid's refusals not logged since its previous line,
so lines plus their `suppressed` add up to every refusal (`flush()` logs what is left when the server stops).
At most `max_pids` pids are tracked; refusals of further pids (a writer naming a new pid on every line) share one
line per interval (`pid: null`).

Bounded either way: memory holds `max_pids` + 1 entries, and an interval logs at most 2 lines per entry (a pid's
last count when its entry is dropped to make room, then its first line again), however fast the FIFO is written.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from runner.system import procs
from runner.watchdog.clock import Clock

MAX_PIDS = 16  # pids tracked at once (a flood naming more shares one line): <= 3.4 lines/s, ever
INTERVAL_S = 10.0  # per pid: at most one line per interval after the first
GUARD_MODULE = "runner.system.shepherd_main"  # in the guard's command line (runner/system/shepherd.py)


@dataclass
class _Entry:
    last: float  # monotonic time of the pid's last line
    suppressed: int = 0  # refusals since then, not logged
    local_rank: int = -1
    reason: str = ""  # of the first refusal suppressed since the pid's last line (worded once, not per request)


def who(pid: int) -> str:
    """What `pid` is, for the log: init, the agent, the agent's guard, or a process not of this job."""
    if pid == 1:
        return "pid 1 (init)"
    if pid == os.getpid():
        return "the agent itself"
    if GUARD_MODULE in procs.cmdline(pid):
        return "the agent's guard"
    return "not a process of this job"


class RefusalLog:
    """Logs refused requests per pid, rate-limited and in bounded memory (see the module docstring)."""

    def __init__(self, log: structlog.typing.FilteringBoundLogger, clock: Clock, *, interval: float = INTERVAL_S,
                 max_pids: int = MAX_PIDS) -> None:
        self._log = log
        self._clock = clock
        self._interval = interval
        self._max_pids = max_pids
        self._pids: dict[int, _Entry] = {}
        self._others: _Entry | None = None  # refusals of pids beyond max_pids
        self.lines = 0  # lines logged so far (tests, benchmarks)

    def refused(self, pid: int, local_rank: int, reason: str | Callable[[], str]) -> None:
        """A request naming `pid` on `local_rank`'s channel was refused; `reason` is called only if a line is due."""
        now = self._clock.monotonic()
        entry = self._pids.get(pid)
        if entry is None and len(self._pids) >= self._max_pids:
            self._make_room(now)
        if entry is None and len(self._pids) < self._max_pids:
            self._pids[pid] = _Entry(now, local_rank=local_rank)
            self._line(pid, local_rank, reason() if callable(reason) else reason, 0)
            return
        if entry is None:
            self._other(now, local_rank)
            return
        if now - entry.last >= self._interval:
            self._line(pid, local_rank, reason() if callable(reason) else reason, entry.suppressed)
            entry.last, entry.suppressed, entry.reason = now, 0, ""
        else:
            entry.suppressed += 1
            entry.local_rank = local_rank
            if not entry.reason:
                entry.reason = reason() if callable(reason) else reason

    def flush(self) -> None:
        """Log what is still suppressed (the server stops): no count is lost."""
        for pid, entry in self._pids.items():
            if entry.suppressed:
                self._line(pid, entry.local_rank, entry.reason, entry.suppressed - 1)
        if self._others is not None and self._others.suppressed:
            self._line(None, self._others.local_rank, self._others.reason, self._others.suppressed - 1)
        self._pids.clear()
        self._others = None

    def _make_room(self, now: float) -> None:
        """Drop the entries whose interval is over (their suppressed count logged first)."""
        for pid, entry in list(self._pids.items()):
            if now - entry.last >= self._interval:
                if entry.suppressed:
                    self._line(pid, entry.local_rank, entry.reason, entry.suppressed - 1)
                del self._pids[pid]

    def _other(self, now: float, local_rank: int) -> None:
        reason = f"one of more than {self._max_pids} pids refused at once (not each named)"
        if self._others is None:
            self._others = _Entry(now, local_rank=local_rank, reason=reason)
            self._line(None, local_rank, reason, 0)
        elif now - self._others.last >= self._interval:
            self._line(None, local_rank, reason, self._others.suppressed)
            self._others.last, self._others.suppressed = now, 0
        else:
            self._others.suppressed += 1
            self._others.local_rank = local_rank

    def _line(self, pid: int | None, local_rank: int, reason: str, suppressed: int) -> None:
        """One warning: one refusal, and `suppressed` more of the same pid not logged since its previous line."""
        self.lines += 1
        self._log.warning("timer_request_refused", pid=pid, reason=reason, local_rank=local_rank,
                          suppressed=suppressed)
