"""The one restart loop of a helper server the agent hosts (the TorchFT lighthouse, the hosted etcd).

While the job runs, a helper that exits is started again under a `RestartPolicy` (data: how many restarts, how many
failed starts in a row, the pauses), until the policy is spent: then `supervise` returns why, and the caller says
the helper is gone (the lighthouse stops the groups, etcd is ended for good). The helper is behind a small Protocol:
it waits for its own exit (its pidfd), reaps itself, starts again and waits until it serves, or discards what a
failed start left.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger


@dataclass(frozen=True)
class RestartPolicy:
    """How a helper that exited is started again."""

    restarting: str  # the warning logged at every restart (`lighthouse_restarting`)
    max_restarts: int  # in all, while the job runs
    max_failed_starts: int  # in a row (1: the first start that fails gives the helper up)
    pause_s: float = 0.0  # before a restart's first start, doubled for every restart after it (0: at once)
    retry_s: float = 0.0  # after a failed start, times the failed starts in a row

    def pause(self, restart: int) -> float:
        """The pause before restart number `restart` (1 for the first)."""
        return self.pause_s * 2.0 ** (restart - 1)


class StartFailed(Exception):
    """A start of the helper failed (it exited, or did not serve in time); `why` says how."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class Supervised(Protocol):
    """What the loop needs of a helper."""

    restarts: int  # restarts so far (the loop counts them; status.json shows them)

    def stopping(self) -> bool:
        """The agent is stopping it for good: no restart."""
        ...

    async def exited(self) -> None:
        """Wait until the running process exits (not reaped)."""
        ...

    def reaped(self) -> str:
        """Reap the process that exited; how it ended, for the log ("exit code 1", "signal SIGKILL", and more)."""
        ...

    async def respawn(self) -> None:
        """Start it again and wait until it serves; StartFailed when it cannot."""
        ...

    def discard(self) -> None:
        """Kill and reap what a failed start left running, if anything."""
        ...


async def supervise(helper: Supervised, policy: RestartPolicy, log: FilteringBoundLogger) -> str | None:
    """Start `helper` again whenever it exits, under `policy`; why it was given up, or None once it is stopping."""
    while not helper.stopping():
        await helper.exited()
        if helper.stopping():
            return None
        why = helper.reaped()
        failed = 0
        while True:
            if helper.restarts >= policy.max_restarts or failed >= policy.max_failed_starts:
                return f"after {helper.restarts} restart(s): {why}"
            helper.restarts += 1
            pause = policy.pause(helper.restarts)
            log.warning(policy.restarting, exit=why, restart=helper.restarts, after_s=pause)
            if pause:
                await asyncio.sleep(pause)
                if helper.stopping():
                    return None
            try:
                await helper.respawn()
                break
            except StartFailed as exc:
                helper.discard()
                failed += 1
                why = exc.why
                await asyncio.sleep(policy.retry_s * failed)
    return None
