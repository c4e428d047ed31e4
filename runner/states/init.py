"""INIT: create the run dir, install signal handlers, connect the rendezvous, start the watchdog."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
from typing import Any

from runner.errors import EXIT_SPEC, RunnerError
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
        check_entrypoint(ctx.spec)
        await ctx.rendezvous.open(ctx.events)
        if ctx.spec.watchdog.enabled:
            await start_watchdog(ctx)
    except RunnerError as e:
        kind = "setup" if isinstance(e, SpecRuntimeError) else "rendezvous"
        ctx.failure = Failure(kind=kind, reason=e.message, attempt=0, hint=e.fix)
        ctx.reason, ctx.outcome, ctx.exit_code = e.message, "error", e.exit_code
        return Trigger.fatal
    ctx.reason = f"logs in {ctx.run_dir}"
    return Trigger.initialized


def check_entrypoint(spec: Any) -> None:
    """Fail before any rendezvous when the workers could not even start (missing cwd, script or program)."""
    ep = spec.entrypoint
    if not os.path.isdir(spec.cwd):
        raise SpecRuntimeError(f"cwd {spec.cwd} is not a directory", "fix `cwd` in the spec (relative to the spec file)")
    if ep.script is not None and not os.path.isfile(os.path.join(spec.cwd, ep.script)):
        raise SpecRuntimeError(
            f"entrypoint.script {ep.script} not found in {spec.cwd}",
            "fix the path (relative paths resolve against `cwd`, itself relative to the spec file)",
        )
    program = ep.command[0] if ep.command else (ep.python or None)
    if program and shutil.which(program, path=os.environ.get("PATH")) is None and not (
        os.sep in program and os.access(os.path.join(spec.cwd, program), os.X_OK)
    ):
        raise SpecRuntimeError(f"program '{program}' not found or not executable", "install it or give a full path")


class SpecRuntimeError(RunnerError):
    """The spec is valid but names something this machine does not have."""

    exit_code = EXIT_SPEC


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
