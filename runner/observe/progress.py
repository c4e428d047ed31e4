"""Long waits shown while they last: a rendezvous missing nodes, the restart backoff, the stop's grace period.

    with Progress(log, "backoff", lambda: {"restart": 2}, deadline=loop.time() + 8):
        await asyncio.sleep(8)

On the calm console's terminal the live line (observe/live_line.py) is redrawn every TICK_S with the wait's fields
(`left_s` counted down to `deadline`), and erased when the wait ends. Whatever the console, a `waiting` event
(`wait`, the fields, `waited_s`) is logged once per step: after 5 s, then at intervals doubling up to 60 s, so a
wait of hours adds about one line a minute to agent.jsonl and a wait under 5 s adds none. Timers only (the loop's
call_later): nothing runs between two ticks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Protocol, Self

from runner.observe.live_line import LIVE

TICK_S = 0.5  # the live line's refresh: a countdown in whole seconds never lags by more
STEP_S = 5.0  # the first `waiting` event, after this long
STEP_MAX_S = 60.0  # then at intervals doubling up to this


class InfoLog(Protocol):
    """The one logger method a Progress uses (a structlog bound logger)."""

    def info(self, event: str, **fields: object) -> object:
        """Log `event` at INFO."""
        ...


def step_intervals() -> Iterator[float]:
    """Seconds between two `waiting` events of one wait: 5, 10, 20, 40, 60, 60, ..."""
    interval = STEP_S
    while True:
        yield interval
        interval = min(STEP_MAX_S, interval * 2)


class Progress:
    """One long wait, shown while the `with` block runs; `describe()` gives its fields (JSON-safe) when asked."""

    def __init__(self, log: InfoLog, wait: str, describe: Callable[[], dict[str, object]],
                 deadline: float | None = None) -> None:
        self.log = log
        self.wait = wait
        self.describe = describe
        self.deadline = deadline  # in the loop's clock; None: no countdown of its own
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = 0.0
        self._steps = step_intervals()
        self._tick_handle: asyncio.TimerHandle | None = None
        self._step_handle: asyncio.TimerHandle | None = None

    def fields(self) -> dict[str, object]:
        """What the wait is at now: `wait`, describe()'s fields, `left_s` when it has a deadline."""
        fields: dict[str, object] = {"wait": self.wait, **self.describe()}
        if self.deadline is not None and self._loop is not None:
            fields["left_s"] = round(max(0.0, self.deadline - self._loop.time()), 1)
        return fields

    def __enter__(self) -> Self:
        """Start showing the wait (the live line at once; the first event after STEP_S)."""
        self._loop = asyncio.get_running_loop()
        self._started = self._loop.time()
        self._step_handle = self._loop.call_later(next(self._steps), self._step)
        self._tick()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        """The wait ended: stop the timers, erase the line."""
        for handle in (self._tick_handle, self._step_handle):
            if handle is not None:
                handle.cancel()
        self._tick_handle = self._step_handle = None
        LIVE.clear()

    def _tick(self) -> None:
        """Redraw the live line (only while there is one to draw) and come back in TICK_S."""
        self._tick_handle = None
        if self._loop is None or not (LIVE.on and LIVE.waits):
            return
        LIVE.update(self.fields())
        self._tick_handle = self._loop.call_later(TICK_S, self._tick)

    def _step(self) -> None:
        """One `waiting` event; the next one a longer step later."""
        if self._loop is None:
            return
        self.log.info("waiting", **self.fields(), waited_s=round(self._loop.time() - self._started, 1))
        self._step_handle = self._loop.call_later(next(self._steps), self._step)
