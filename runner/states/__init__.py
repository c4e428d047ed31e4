"""One module per state; each exposes `async def handle(ctx: Context) -> Step | None`."""

from __future__ import annotations

from runner.core.group_state import GroupState
from runner.core.machine import Handler
from runner.states import failed, init, rendezvous, restarting, running, shutdown

HANDLERS: dict[GroupState, Handler] = {
    GroupState.INIT: init.handle,
    GroupState.RENDEZVOUS: rendezvous.handle,
    GroupState.RUNNING: running.handle,
    GroupState.FAILED: failed.handle,
    GroupState.RESTARTING: restarting.handle,
    GroupState.SHUTDOWN: shutdown.handle,
}
