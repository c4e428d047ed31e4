"""FAILED: record the root cause, then let the restart policy decide: retry, or give up."""

from __future__ import annotations

import json
from typing import Any

from runner.errors import EXIT_INFRA, EXIT_WORKERS_FAILED
from runner.machine import Trigger


async def handle(ctx: Any) -> Trigger:
    """Keep the failure (nothing is lost) and charge the restart budget if a restart is allowed."""
    failure = ctx.failure
    ctx.failures.append(failure)
    save(ctx, failure)
    ctx.log.error("failure", **{k: v for k, v in failure.to_dict().items() if k not in ("traceback", "stacks")})
    policy = ctx.spec.restart
    ctx.outcome, ctx.exit_code = "failed", EXIT_WORKERS_FAILED
    if ctx.stop is not None:
        ctx.reason = "stopping: no restart"
        return Trigger.give_up
    if failure.kind == "rendezvous":
        ctx.exit_code = EXIT_INFRA
        ctx.reason = f"not retried: {failure.reason}"
        return Trigger.give_up
    if failure.exit_code is not None and failure.exit_code in policy.non_retryable_exit_codes:
        ctx.reason = f"exit code {failure.exit_code} is non-retryable"
        return Trigger.non_retryable
    used = await ctx.rendezvous.charge_restart(policy.max_restarts)
    if used is None:
        ctx.reason = f"restart budget spent ({policy.max_restarts} of {policy.max_restarts} used)"
        return Trigger.give_up
    ctx.restarts = used
    ctx.outcome, ctx.exit_code = "", 0
    ctx.reason = f"restart {used} of {policy.max_restarts}"
    return Trigger.retry


def save(ctx: Any, failure: Any) -> None:
    """Write the failure next to the attempt's logs: <run dir>/attempt_<k>/failure.json."""
    path = ctx.run_dir / f"attempt_{failure.attempt}" / "failure.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(failure.to_dict(), indent=2, default=str), encoding="utf-8")
