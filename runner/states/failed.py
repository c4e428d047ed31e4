"""FAILED: keep the root cause, then fire `decide`.

The restart policy's guarded edges (runner/machine.py,
runner/restart_policy.py) choose retry, give_up or non_retryable.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from runner.machine import Step, Trigger
from runner.private_files import write_private

if TYPE_CHECKING:
    from runner.context import Context
    from runner.workers.failures import Failure


async def handle(ctx: Context) -> Step:
    """Record the failure (nothing is lost); the policy decides what follows."""
    failure = ctx.failure
    assert failure is not None  # every edge into FAILED sets it
    ctx.failures.append(failure)
    save(ctx, failure)
    ctx.log.error("failure", **{k: v for k, v in failure.to_dict().items() if k not in ("traceback", "stacks")})
    return Step(Trigger.decide)


def save(ctx: Context, failure: Failure) -> None:
    """Write the failure next to the attempt's logs: <run dir>/attempt_<k>/failure.json (a warning if it can't)."""
    path = ctx.run_dir / f"attempt_{failure.attempt}" / "failure.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_private(path, json.dumps(failure.to_dict(), indent=2, default=str))
    except OSError as e:
        ctx.warn("failure_write_failed", path=str(path), error=str(e))
