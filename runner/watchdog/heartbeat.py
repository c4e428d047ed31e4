"""Worker heartbeats through file changes: workers touch RUNNER_HEARTBEAT_FILE, the agent watches.

The monitor never compares a file's mtime with the wall clock (a clock step would make a live worker look
hung, or a hung one alive). It looks for a CHANGE of the file's (inode, size, mtime, ctime) and times
silence on the monotonic clock: a change seen at a check counts as a sign of life at that check, so a
worker is reported at least `timeout` seconds after its last beat, never earlier (to the file system's
timestamp granularity), and at most one check interval (`timeout / 4`, at most 5 s) later. Checks are one
loop.call_at handle for all workers; only then are the files stat'ed. A worker that never touches its
file counts from when `watch()` was called, unless `first_sign` is set: then it is timed only once its file
said something, and `on_unsent` hears once, for the first worker still silent `timeout` after its start, that
the script sends none.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from runner.contract import HEARTBEAT_FILE_VAR
from runner.watchdog.clock import Clock, SystemClock

ENV_VAR = HEARTBEAT_FILE_VAR
MAX_CHECK_INTERVAL_S = 5.0
MIN_CHECK_INTERVAL_S = 0.01  # never spin, whatever the timeout

Signature = tuple[int, int, int, int] | None  # (inode, size, mtime_ns, ctime_ns); None while there is no file


def beat(path: str | None = None) -> None:
    """Worker side: touch the heartbeat file (default: $RUNNER_HEARTBEAT_FILE; no-op when unset)."""
    target = path or os.environ.get(ENV_VAR)
    if target:
        Path(target).touch()


def signature(path: Path) -> Signature:
    """What changes when a worker touches or rewrites its file; None if it does not exist (yet)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass
class _Watched:
    path: Path
    seen: object  # the file as of the last check (its signature, or what `sign` reads from it)
    alive_at: float  # monotonic time of the last sign of life
    timed: bool = True  # silence counts (with `first_sign`: once the file said something)


class HeartbeatMonitor:
    """Calls on_silent(local_rank, silent_s) once for a worker whose file has not changed for `timeout` seconds.

    activity(local_rank), when given, is the monotonic time of another sign of life (its last timer request):
    it counts as a beat of a worker that is timed (with `first_sign`, one whose file said something).
    """

    def __init__(
        self,
        timeout: float,
        on_silent: Callable[[int, float], None],
        *,
        clock: Clock | None = None,
        activity: Callable[[int], float | None] | None = None,
        log: structlog.typing.FilteringBoundLogger | None = None,
        sign: Callable[[Path], object] = signature,
        first_sign: bool = False,
        event: str = "heartbeat_silent",
        on_unsent: Callable[[int, float], None] | None = None,
    ) -> None:
        self._timeout = timeout
        self._activity = activity
        self._sign = sign  # what counts as a change: the file's signature, or (progress) the step it reports
        self._first_sign = first_sign  # time a worker only once `sign` read something (None: nothing yet)
        self._event = event
        self._interval = max(min(timeout / 4, MAX_CHECK_INTERVAL_S), MIN_CHECK_INTERVAL_S)
        self._on_silent = on_silent
        self._on_unsent = on_unsent  # once per monitor: a worker not yet timed (first_sign) silent `timeout` long
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._log = log if log is not None else structlog.get_logger("runner.watchdog.heartbeat")
        self._watched: dict[int, _Watched] = {}
        self._handle: asyncio.TimerHandle | None = None

    def watch(self, local_rank: int, path: Path) -> None:
        """Start watching a worker's heartbeat file (call from the event loop, when the worker starts)."""
        path = Path(path)
        seen = self._sign(path)
        self._watched[local_rank] = _Watched(path, seen, self._clock.monotonic(),
                                             timed=not self._first_sign or seen is not None)
        self._arm()

    def watching(self, local_rank: int, path: Path) -> bool:
        """True if `local_rank` is watched through `path` already."""
        w = self._watched.get(local_rank)
        return w is not None and w.path == Path(path)

    def clear(self) -> None:
        """Stop watching every worker (they are being stopped or replaced)."""
        self._watched.clear()
        self._arm()

    def _arm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._watched:  # stat every interval (changes are only seen by looking), or at the first silence
            now = self._clock.monotonic()
            silent_at = min((w.alive_at for w in self._watched.values() if w.timed), default=now) + self._timeout
            when = min(now + self._interval, max(now, silent_at))
            self._handle = asyncio.get_running_loop().call_at(when, self._check)

    def _check(self) -> None:
        self._handle = None
        now = self._clock.monotonic()
        for rank, w in list(self._watched.items()):
            seen = self._sign(w.path)
            if seen != w.seen:
                w.seen, w.alive_at = seen, now
                w.timed = w.timed or seen is not None
            other = self._activity(rank) if self._activity is not None and w.timed else None
            if other is not None and other > w.alive_at:
                w.alive_at = other
            silent_s = now - w.alive_at
            if silent_s < self._timeout:
                continue
            if w.timed:
                del self._watched[rank]
                self._log.warning(self._event, local_rank=rank, silent_s=round(silent_s, 3))
                self._call(self._on_silent, rank, silent_s)
            elif self._on_unsent is not None:  # never a sign: not timed; said once for the whole monitor
                on_unsent, self._on_unsent = self._on_unsent, None
                self._call(on_unsent, rank, silent_s)
        self._arm()

    def _call(self, callback: Callable[[int, float], None], rank: int, silent_s: float) -> None:
        try:
            callback(rank, silent_s)
        except Exception:  # a callback's bug must not stop the monitor
            self._log.exception("heartbeat_callback_failed", local_rank=rank)
