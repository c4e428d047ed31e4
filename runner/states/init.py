"""INIT: write the resolved spec, install signal handlers, connect the rendezvous, start the watchdog."""

from __future__ import annotations

import json
import os
import shutil
from typing import TYPE_CHECKING

from runner import signals
from runner.config.redact import spec_for_disk
from runner.errors import EXIT_SPEC, RunnerError
from runner.machine import Step, Trigger
from runner.outcomes import FailureKind, Outcome
from runner.private_files import write_private
from runner.states.waiting import Stopped, unless_stopped
from runner.workers.failures import Failure

if TYPE_CHECKING:
    from runner.config.spec import JobSpec
    from runner.context import Context


async def handle(ctx: Context) -> Step:
    """Prepare everything the first rendezvous needs; a stop signal is honoured while connecting."""
    signals.install(
        ctx.events,
        ctx.hurry,
        lambda name: ctx.log.warning("stop_hurried", signal=name),
        names=ctx.spec.shutdown.signals_to_handle,
    )
    try:
        ctx.run_dir.mkdir(parents=True, exist_ok=True)
        write_private(ctx.run_dir / "spec.json", json.dumps(spec_for_disk(ctx.spec), indent=2))
    except OSError as e:
        ctx.warn("spec_write_failed", error=str(e))
    try:
        check_entrypoint(ctx.spec)
        await unless_stopped(ctx, ctx.rendezvous.open(ctx.events))
        if ctx.spec.watchdog.enabled:
            await start_watchdog(ctx)
    except Stopped:
        return Step(Trigger.stop_requested, "stop requested while connecting")
    except RunnerError as e:
        kind = FailureKind.SETUP if isinstance(e, SpecRuntimeError) else FailureKind.RENDEZVOUS
        ctx.failure = Failure(kind=kind, reason=e.message, attempt=0, hint=e.fix)
        return Step(Trigger.fatal, e.message, Outcome.ERROR, e.exit_code)
    return Step(Trigger.initialized, f"logs in {ctx.run_dir}")


def check_entrypoint(spec: JobSpec) -> None:
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


async def start_watchdog(ctx: Context) -> None:
    """Start the file-timer server; its expiries become TimerExpired events."""
    from runner.watchdog.service import start

    ctx.timer = await start(
        ctx.spec.watchdog, run_dir=ctx.run_dir, events=ctx.events, log=ctx.log, group=lambda: ctx.group
    )
