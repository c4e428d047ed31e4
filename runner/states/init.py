"""INIT: create the run dir, install signal handlers, connect the rendezvous, start the watchdog."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

from runner import signals
from runner.config.redact import spec_for_disk
from runner.errors import EXIT_SPEC, RunnerError
from runner.machine import Trigger
from runner.workers.failures import Failure


async def handle(ctx: Any) -> Trigger:
    """Prepare everything the first rendezvous needs."""
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    (ctx.run_dir / "spec.json").write_text(json.dumps(spec_for_disk(ctx.spec), indent=2), encoding="utf-8")
    signals.install(ctx.events, ctx.hurry, lambda name: ctx.log.warning("stop_hurried", signal=name))
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
        raise SpecRuntimeError(
            f"cwd {spec.cwd} is not a directory", "fix `cwd` in the spec (relative to the spec file)"
        )
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


async def start_watchdog(ctx: Any) -> None:
    """Start the file-timer server; its expiries become TimerExpired events."""
    from runner.watchdog.service import start

    ctx.timer = await start(ctx)
