"""Where the agent handles signals.

Which ones stop the job, which one stops it gracefully, and what a second stop signal means. Everything a signal does becomes a StopRequested event on the agent's queue.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from runner.events import Event, StopRequested

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
GRACEFUL_SIGNAL = signal.SIGUSR2  # `runner stop --graceful` on one node: let workers finish


def install(
    events: asyncio.Queue[Event],
    hurry: asyncio.Event,
    on_hurry: Callable[[str], None] | None = None,
) -> None:
    """Stop signals put a StopRequested on `events`; a second non-graceful one also sets `hurry` (kill now)."""
    loop = asyncio.get_running_loop()
    seen: list[int] = []

    def on_signal(signum: int) -> None:
        graceful = signum == GRACEFUL_SIGNAL
        if not graceful and any(s != GRACEFUL_SIGNAL for s in seen):
            hurry.set()
            if on_hurry is not None:
                on_hurry(signal.Signals(signum).name)
        seen.append(signum)
        events.put_nowait(StopRequested(signum=signum, graceful=graceful))

    for sig in (*STOP_SIGNALS, GRACEFUL_SIGNAL):
        loop.add_signal_handler(sig, on_signal, sig)
