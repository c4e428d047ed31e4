"""INIT: create the run dir, install signal handlers, connect the rendezvous, start the watchdog."""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Any

from runner.errors import EXIT_INFRA, RunnerError
from runner.events import StopRequested
from runner.failures import Failure
from runner.machine import Trigger

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
GRACEFUL_SIGNAL = signal.SIGUSR2  # `runner stop --graceful` on one node: let workers finish


async def handle(ctx: Any) -> Trigger:
    """Prepare everything the first rendezvous needs."""
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    (ctx.run_dir / "spec.json").write_text(json.dumps(ctx.spec.to_dict(), indent=2), encoding="utf-8")
    install_signal_handlers(ctx)
    try:
        await ctx.rendezvous.open(ctx.events)
        if ctx.spec.watchdog.enabled:
            await start_watchdog(ctx)
    except RunnerError as e:
        ctx.failure = Failure(kind="rendezvous", reason=e.message, attempt=0, hint=e.fix)
        ctx.reason, ctx.outcome, ctx.exit_code = e.message, "error", EXIT_INFRA
        return Trigger.fatal
    ctx.reason = f"logs in {ctx.run_dir}"
    return Trigger.initialized


def install_signal_handlers(ctx: Any) -> None:
    """SIGTERM/SIGINT stop (a second one kills at once); SIGUSR2 stops gracefully."""
    loop = asyncio.get_running_loop()
    seen: list[int] = []

    def on_signal(signum: int) -> None:
        graceful = signum == GRACEFUL_SIGNAL
        if not graceful and any(s != GRACEFUL_SIGNAL for s in seen):
            ctx.hurry.set()
            ctx.log.warning("stop_hurried", signal=signal.Signals(signum).name)
        seen.append(signum)
        ctx.events.put_nowait(StopRequested(signum=signum, graceful=graceful))

    for sig in (*STOP_SIGNALS, GRACEFUL_SIGNAL):
        loop.add_signal_handler(sig, on_signal, sig)


async def start_watchdog(ctx: Any) -> None:
    """Start the file-timer server; its expiries become TimerExpired events."""
    from runner.watchdog import start  # noqa: PLC0415 - only when the watchdog is on

    ctx.timer = await start(ctx)
