"""One module per state; each exposes `async def handle(ctx: Context) -> Step | None`."""

from __future__ import annotations

from runner.core.machine import Handler, JobState
from runner.states import failed, init, rendezvous, restarting, running, shutdown

HANDLERS: dict[JobState, Handler] = {
    JobState.INIT: init.handle,
    JobState.RENDEZVOUS: rendezvous.handle,
    JobState.RUNNING: running.handle,
    JobState.FAILED: failed.handle,
    JobState.RESTARTING: restarting.handle,
    JobState.SHUTDOWN: shutdown.handle,
}
