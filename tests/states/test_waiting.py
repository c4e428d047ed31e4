"""states/waiting.unless_stopped: a wait that is itself cancelled leaves nothing behind on the event queue."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from runner.events import StopRequested, WorkerExited
from runner.states.waiting import Stopped, unless_stopped


def test_a_cancelled_wait_does_not_swallow_a_later_event():
    """Cancelling unless_stopped (e.g. an outer timeout) must cancel its queue getter too.

    Before the fix, only the awaited work was cancelled: the getter stayed pending on the queue and took the next
    event put there, which no one would ever see.
    """

    async def go():
        owner = SimpleNamespace(events=asyncio.Queue(), stop=None)
        waiter = asyncio.ensure_future(unless_stopped(owner, asyncio.Event().wait()))
        await asyncio.sleep(0.01)  # the wait is now blocked on the work and on the queue
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        event = WorkerExited(local_rank=0, rank=0, pid=1234, exit_code=1, attempt=0)
        owner.events.put_nowait(event)
        await asyncio.sleep(0.01)  # an orphaned getter would run now and take it
        return owner.events.qsize(), event

    size, _event = asyncio.run(go())
    assert size == 1


def test_a_stop_ends_the_wait_and_is_kept():
    async def go():
        owner = SimpleNamespace(events=asyncio.Queue(), stop=None)
        asyncio.get_running_loop().call_later(0.01, owner.events.put_nowait, StopRequested(15, graceful=False))
        try:
            await unless_stopped(owner, asyncio.Event().wait())
        except Stopped:
            return owner.stop
        return None

    assert asyncio.run(go()) == StopRequested(15, graceful=False)


def test_the_work_result_is_returned_and_no_getter_is_left():
    async def go():
        owner = SimpleNamespace(events=asyncio.Queue(), stop=None)
        result = await unless_stopped(owner, asyncio.sleep(0.01, result="done"))
        owner.events.put_nowait(StopRequested(2, graceful=True))
        await asyncio.sleep(0.01)
        return result, owner.events.qsize()

    assert asyncio.run(go()) == ("done", 1)
