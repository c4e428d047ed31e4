"""Worker heartbeats through file mtimes: workers touch RUNNER_HEARTBEAT_FILE, the agent watches.

The monitor keeps one loop.call_at handle at the earliest moment some worker could become silent for
`timeout` seconds; only then does it stat the files (no fast polling). A worker that never touches
its file counts from when `watch()` was called.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

ENV_VAR = "RUNNER_HEARTBEAT_FILE"


def beat(path: str | None = None) -> None:
    """Worker side: touch the heartbeat file (default: $RUNNER_HEARTBEAT_FILE; no-op when unset)."""
    target = path or os.environ.get(ENV_VAR)
    if target:
        Path(target).touch()


class HeartbeatMonitor:
    """Calls on_silent(local_rank, silent_s) once for a worker whose file is older than `timeout`."""

    def __init__(self, timeout: float, on_silent: Callable[[int, float], None], *, log: Any = None) -> None:
        self._timeout = timeout
        self._on_silent = on_silent
        self._log = log if log is not None else structlog.get_logger("runner.watchdog.heartbeat")
        self._files: dict[int, Path] = {}
        self._last: dict[int, float] = {}  # loop time of the last sign of life per rank
        self._handle: asyncio.TimerHandle | None = None

    def watch(self, local_rank: int, path: Path) -> None:
        """Start watching a worker's heartbeat file (call from the event loop, when the worker starts)."""
        self._files[local_rank] = Path(path)
        self._last[local_rank] = asyncio.get_running_loop().time()
        self._arm()

    def watching(self, local_rank: int, path: Path) -> bool:
        """True if `local_rank` is watched through `path` already."""
        return self._files.get(local_rank) == Path(path)

    def clear(self) -> None:
        """Stop watching every worker (they are being stopped or replaced)."""
        self._files.clear()
        self._last.clear()
        self._arm()

    def _arm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._last:
            when = min(self._last.values()) + self._timeout
            self._handle = asyncio.get_running_loop().call_at(when, self._check)

    def _check(self) -> None:
        self._handle = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        for rank, path in list(self._files.items()):
            seen = self._seen(path, now)
            if seen is not None:
                self._last[rank] = max(self._last[rank], seen)
            silent_s = now - self._last[rank]
            if silent_s >= self._timeout:
                del self._files[rank], self._last[rank]
                self._log.warning("heartbeat_silent", local_rank=rank, silent_s=round(silent_s, 3))
                try:
                    self._on_silent(rank, silent_s)
                except Exception:
                    self._log.exception("heartbeat_callback_failed", local_rank=rank)
        self._arm()

    @staticmethod
    def _seen(path: Path, now: float) -> float | None:
        """The file's mtime on the loop's clock, None if there is no file yet."""
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return None
        return now - max(0.0, time.time() - mtime)
