"""Where a run's stop requests land: recorded the moment they arrive, then delivered on the run's event queue.

A scope belongs to one run (the job's, or one replica group's) and may hold inner scopes (the job's holds each
group's). A request that reaches a scope reaches every scope inside it, with its cause. Two steps, so that a signal
handler can take the first:

- `note(stop)` records it at once (it only appends: safe in a Python signal handler, which runs before the event
  loop can see any worker exit the same signal caused). RUNNING asks `stopping()` before it trusts an exit: a
  signal that reached the workers with the agent stops the job even when the workers' exits came out first;
- `deliver(stop)` puts it on the queue (in the event loop), where the waits of every state see it.

`pass_down(stop)` stops the inner scopes only: the job stops its groups for a cause of its own (too few groups can
go on, the lighthouse is gone), carried in the request's `reason`; no signal is made up for it.

Invariants: `received` keeps every request in arrival order (bounded by the signals a run can get, a handful);
a request is delivered to a scope's queue at most once per `deliver` call, and to its inner scopes as well.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runner.events import Event, StopRequested

MAX_KEPT = 64  # requests kept per scope (a signal storm keeps the first ones: the first non-graceful decides)


class StopScope:
    """The stop requests of one run and of the runs inside it."""

    def __init__(self, events: asyncio.Queue[Event], outer: StopScope | None = None) -> None:
        """`events`: the run's queue, where delivered requests go; `outer`: the scope this one is inside."""
        self.events = events
        self.outer = outer
        self.received: list[StopRequested] = []
        self.inner: list[StopScope] = []

    def inside(self, events: asyncio.Queue[Event]) -> StopScope:
        """A scope inside this one (a replica group's, delivering to `events`): every request reaches it.

        Those that came before it was made too: a stop that arrived while the groups were being made stops them.
        """
        scope = StopScope(events, self)
        for stop in self.received:
            scope.request(stop)
        self.inner.append(scope)
        return scope

    def note(self, stop: StopRequested) -> None:
        """Record `stop` here and in every inner scope; nothing else (a signal handler calls it)."""
        if len(self.received) < MAX_KEPT:
            self.received.append(stop)
        for scope in self.inner:
            scope.note(stop)

    def deliver(self, stop: StopRequested) -> None:
        """Put `stop` on this run's queue and on every inner run's (in the event loop)."""
        self.events.put_nowait(stop)
        for scope in self.inner:
            scope.deliver(stop)

    def request(self, stop: StopRequested) -> None:
        """Record and deliver `stop` (from the event loop)."""
        self.note(stop)
        self.deliver(stop)

    def outermost(self) -> StopScope:
        """The job's scope: this one, or the one every scope this one is inside is inside."""
        scope = self
        while scope.outer is not None:
            scope = scope.outer
        return scope

    def request_once(self, stop: StopRequested) -> None:
        """`request(stop)` unless an equal one arrived already (each group's rendezvous sees one `runner stop`)."""
        if stop not in self.received:
            self.request(stop)

    def pass_down(self, stop: StopRequested) -> None:
        """Stop the inner runs only, with `stop`'s cause (the outer run decided it; it did not receive it)."""
        for scope in self.inner:
            scope.request(stop)

    def stopping(self) -> StopRequested | None:
        """The first request that ends the run's work (not graceful), if one has arrived."""
        return next((s for s in self.received if not s.graceful), None)

    def requested(self) -> StopRequested | None:
        """The first request of any kind (graceful or not), if one has arrived."""
        return self.received[0] if self.received else None
