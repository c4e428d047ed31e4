"""SHUTDOWN (terminal): stop what still runs, close the rendezvous, write the report, settle the exit code."""

from __future__ import annotations

import json
import time
from typing import Any

from runner.errors import EXIT_OK, EXIT_STOPPED_BASE


async def handle(ctx: Any) -> None:
    """Stop workers (signal, grace, SIGKILL), stop the watchdog, leave the rendezvous, keep the report."""
    spec = ctx.spec
    if ctx.failure is not None and ctx.failure not in ctx.failures:  # a fatal error that skipped FAILED
        ctx.failures.append(ctx.failure)
    if ctx.group is not None:
        await ctx.group.stop(spec.shutdown.signal, spec.shutdown.grace_period, ctx.hurry)
    if ctx.timer is not None:
        await ctx.timer.stop()
    if not ctx.outcome:  # reached by stop_requested
        ctx.outcome = "stopped"
        signum = ctx.stop.signum if ctx.stop is not None and ctx.stop.signum else 15
        ctx.exit_code = EXIT_STOPPED_BASE + signum
    if ctx.outcome == "succeeded":
        ctx.exit_code = EXIT_OK
    ctx.state_name = "SHUTDOWN"
    await ctx.publish()
    await ctx.rendezvous.close(ctx.outcome)
    ctx.shepherd.close()
    write_report(ctx)


def write_report(ctx: Any) -> None:
    """<run dir>/report.json: outcome, exit code, attempts and every failure's root cause."""
    report = {
        "job": ctx.spec.name,
        "node": ctx.node,
        "outcome": ctx.outcome,
        "exit_code": ctx.exit_code,
        "attempts": ctx.attempt + 1,
        "restarts": ctx.restarts,
        "duration_s": round(time.monotonic() - ctx.started, 3),
        "failures": [f.to_dict() for f in ctx.failures],
        "run_dir": str(ctx.run_dir),
    }
    (ctx.run_dir / "report.json").write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
