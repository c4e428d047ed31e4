"""The clocks the watchdog reads: the system's, and an autojump clock that lets tests skip idle time.

The watchdog schedules with the running loop's `call_at`, so `Clock.monotonic()` must be that loop's
`time()`. `SystemClock` reads the running loop and `time.time()`. `AutojumpClock` is modelled on trio's
`MockClock(autojump_threshold=0)`: it makes its own event loop whose time stands still while anything is
ready to run, and jumps straight to the next deadline when the loop would otherwise sleep. "Nothing
happens before the deadline" and "it expires after it" then take no real time; real I/O (a FIFO, a
pidfd) is still polled before every jump.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Coroutine
from typing import Protocol, TypeVar

T = TypeVar("T")


class Clock(Protocol):
    """Monotonic time on the running loop's scale (deadlines, `call_at`) and wall-clock time (the wire's)."""

    def monotonic(self) -> float:
        """Seconds on the running event loop's clock (what `loop.call_at` takes)."""
        ...

    def wall(self) -> float:
        """Seconds since the epoch, as `time.time()` (the clock torch's clients write deadlines in)."""
        ...


class SystemClock:
    """The real clocks: the running loop's `time()` and `time.time()`."""

    def monotonic(self) -> float:
        """The running loop's time."""
        return asyncio.get_running_loop().time()

    def wall(self) -> float:
        """time.time()."""
        return time.time()


class AutojumpClock:
    """A virtual clock for tests: time moves only when the loop it made is idle, straight to the next deadline.

    Use `run(coro)` (or `asyncio.Runner(loop_factory=clock.new_event_loop)`). Wall time is `wall_start`
    plus the virtual monotonic time plus any `step_wall()`, so a wall-clock step can be simulated without
    moving monotonic time.
    """

    def __init__(self, *, wall_start: float = 1_700_000_000.0) -> None:
        self._now = 0.0
        self._wall_start = wall_start
        self._wall_step = 0.0
        self.jumps = 0  # how many times idle time was skipped

    def monotonic(self) -> float:
        """Virtual seconds since the clock was made."""
        return self._now

    def wall(self) -> float:
        """Virtual time.time()."""
        return self._wall_start + self._now + self._wall_step

    def jump(self, seconds: float) -> None:
        """Move both clocks forward by `seconds` (what the loop does when it is idle)."""
        if seconds > 0:
            self._now += seconds
            self.jumps += 1

    def step_wall(self, seconds: float) -> None:
        """Step the wall clock alone (an NTP correction, an admin's `date -s`); monotonic time does not move."""
        self._wall_step += seconds

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        """An event loop that runs on this clock."""
        return _AutojumpLoop(self)

    def run(self, coro: Coroutine[object, object, T]) -> T:
        """Run `coro` to completion on a fresh loop driven by this clock."""
        with asyncio.Runner(loop_factory=self.new_event_loop) as runner:
            return runner.run(coro)


class _AutojumpSelector(selectors.DefaultSelector):
    """Polls real I/O without blocking; when nothing is ready, jumps the clock by the loop's timeout instead."""

    def __init__(self, clock: AutojumpClock) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        """Ready I/O now; else, if the loop has a deadline ahead, jump to it and report nothing."""
        if timeout is None or timeout <= 0:
            return super().select(timeout)  # ready callbacks (0), or nothing scheduled at all (wait for I/O)
        events = super().select(0)
        if not events:
            self._clock.jump(timeout)
        return events


class _AutojumpLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose time() is the autojump clock's."""

    def __init__(self, clock: AutojumpClock) -> None:
        self._autojump_clock = clock
        super().__init__(_AutojumpSelector(clock))

    def time(self) -> float:
        """The virtual monotonic time."""
        return self._autojump_clock.monotonic()
