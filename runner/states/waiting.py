"""Wait for something while staying responsive to a stop request (the only event that matters then)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

from runner.events import StopRequested

if TYPE_CHECKING:
    from runner.core.context import Context

T = TypeVar("T")


class Stopped(Exception):
    """A stop request arrived while waiting (graceful or not: no workers run now, so there is nothing to finish)."""


async def unless_stopped(ctx: Context, work: Awaitable[T]) -> T:
    """Await `work`; raise Stopped if a StopRequested arrives first. Other events are stale here."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            getter = asyncio.ensure_future(ctx.events.get())
            done, _ = await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                event = getter.result()
                if isinstance(event, StopRequested):
                    ctx.stop = event
                    raise Stopped
            else:
                getter.cancel()
            if task in done:
                return task.result()
    finally:
        for pending in (task,):
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pending
