"""Wait for something while staying responsive to a stop request (the only event that matters then)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Protocol, TypeVar

from runner.events import StopRequested

if TYPE_CHECKING:
    from runner.events import Event

T = TypeVar("T")


class Stoppable(Protocol):
    """What a wait needs of the agent: its event queue, and where a stop request that ends the wait is kept."""

    events: asyncio.Queue[Event]
    stop: StopRequested | None


class Stopped(Exception):
    """A stop request arrived while waiting (graceful or not: no workers run now, so there is nothing to finish)."""


async def unless_stopped(owner: Stoppable, work: Awaitable[T]) -> T:
    """Await `work`; raise Stopped if a StopRequested arrives first. Other events are stale here.

    Whatever ends the wait (the work, a stop, or this coroutine being cancelled), the work and the queue getter are
    both cancelled: a getter left pending would take the next event off the queue and lose it.
    """
    task = asyncio.ensure_future(work)
    getter: asyncio.Future[Event] | None = None
    try:
        while True:
            getter = asyncio.ensure_future(owner.events.get())
            done, _ = await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                event = getter.result()
                if isinstance(event, StopRequested):
                    owner.stop = event
                    raise Stopped
            if task in done:
                return task.result()
    finally:
        for pending in (task, getter):
            if pending is not None and not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pending
