"""SHUTDOWN (terminal): stop what still runs, settle the exit code, leave the rendezvous, write the report.

Nothing here may overturn the workers' result: a status write, etcd or the console failing is a warning.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

from runner.errors import EXIT_OK, EXIT_STOPPED_BASE
from runner.outcomes import FailureKind, Outcome
from runner.rundir.records import LedgerRecord, Report, place_report
from runner.system import soft_io

if TYPE_CHECKING:


    from runner.core.context import Context


# A stopped agent's last words to the rendezvous (its state, leaving, a hosted etcd's wait for the others) take at
# most this long: a scheduler SIGKILLs a step whose processes outlive its stop (Slurm's KillWait, Kubernetes'
# terminationGracePeriodSeconds), and the report must be written first. The lease lapses on its own.
STOPPED_ETCD_BUDGET_S = 3.0


async def stop_watchdogs(ctx: Context) -> None:
    """The file-timer server and heartbeat monitor (watchdog on), and the stall detector (stall_timeout)."""
    if ctx.timer is not None:
        await ctx.timer.stop()
    if ctx.stall is not None:
        await ctx.stall.stop()


async def handle(ctx: Context) -> None:
    """Stop workers (the received signal, or the spec's, then grace, then SIGKILL), the watchdog, the rendezvous."""
    if ctx.run.failure is not None and ctx.run.failure not in ctx.run.failures:  # a fatal error that skipped FAILED
        ctx.run.failures.append(ctx.run.failure)
    if ctx.run.standbys is not None:
        ctx.run.standbys.close()
    if ctx.outcome is None and ctx.stop is not None and ctx.stop.signum:  # a signal of this node's own
        await tell_others(ctx)
    if ctx.run.group is not None:
        await ctx.run.group.stop(forwarded_signal(ctx), grace_period(ctx), ctx.hurry)
    await stop_watchdogs(ctx)
    if ctx.recorder is not None:
        ctx.recorder.close()
    if ctx.outcome is None:  # reached by stop_requested
        ctx.outcome = Outcome.STOPPED
        signum = ctx.stop.signum if ctx.stop is not None and ctx.stop.signum else signal.SIGTERM
        ctx.exit_code = EXIT_STOPPED_BASE + signum
    if ctx.outcome is Outcome.SUCCEEDED:
        ctx.exit_code = EXIT_OK
    budget = STOPPED_ETCD_BUDGET_S if ctx.outcome is Outcome.STOPPED else None
    try:
        async with asyncio.timeout(budget):
            await ctx.status.publish()
            await ctx.rendezvous.close(ctx.outcome.value, alone=ctx.run.leaves_alone)
    except TimeoutError:
        ctx.warnings.warn("rendezvous_close_failed", error=f"not done within {budget:g} s of a stop: left as it was "
                          "(a scheduler's stop is followed by SIGKILL: KillWait, terminationGracePeriodSeconds)")
    except Exception as e:
        ctx.warnings.warn("rendezvous_close_failed", error=str(e) or type(e).__name__)
    ctx.shepherd.close()
    write_report(ctx)


async def tell_others(ctx: Context) -> None:
    """Tell the rendezvous that this node stops (`Rendezvous.stopping`), within the stop's budget for etcd.

    The workers' stop must not wait on it.
    """
    try:
        async with asyncio.timeout(STOPPED_ETCD_BUDGET_S):
            await ctx.rendezvous.stopping()
    except TimeoutError:
        ctx.warnings.warn("rendezvous_close_failed", error=f"the other nodes not told of this stop within "
                          f"{STOPPED_ETCD_BUDGET_S:g} s")
    except Exception as e:
        ctx.warnings.warn("rendezvous_close_failed", error=str(e) or type(e).__name__)


def grace_period(ctx: Context) -> float:
    """shutdown.grace_period; for a node that fenced itself, at most a sixth of the lease TTL.

    Its workers are then gone before its lease lapses and the other nodes give their ranks to others
    (runner/rendezvous/etcd/fence.py).
    """
    failure = ctx.run.failure
    if failure is not None and failure.kind is FailureKind.FENCED:
        return min(ctx.spec.shutdown.grace_period, ctx.spec.rendezvous.lease_ttl / 6)
    return ctx.spec.shutdown.grace_period


def forwarded_signal(ctx: Context) -> str:
    """The signal the workers get first: the one the agent received (as torchrun forwards it), else the spec's."""
    stop = ctx.stop
    if stop is not None and stop.signum and not stop.graceful:
        return signal.Signals(stop.signum).name
    return ctx.spec.shutdown.signal


def report(ctx: Context) -> Report:
    """report.json's content: outcome, exit code, attempts, every failure's root cause, side-failure warnings."""
    recovery = dict(ctx.recovery.report())  # launch, recoveries, time_to_recover (docs/time_to_recover.md), ledger
    ledger = recovery.pop("ledger", None)
    return Report(
        job=ctx.spec.name,
        node=ctx.inputs.node,
        outcome=ctx.outcome.value if ctx.outcome is not None else None,
        exit_code=ctx.exit_code,
        attempts=ctx.run.attempt + 1,
        restarts=ctx.run.restarts,
        duration_s=round(time.monotonic() - ctx.inputs.started, 3),
        failures=tuple(f.record() for f in ctx.run.failures),
        ledger=LedgerRecord.from_dict(ledger) if isinstance(ledger, dict) else None,
        warnings=(*ctx.warnings.seen, *(k for k in process_failures(ctx) if k not in ctx.warnings.seen)),
        run_dir=str(ctx.inputs.run_dir),
        extra={
            "health": ctx.run.health,  # the failed tries of the health checks (docs/health.md), the last 20
            **recovery,
            "standby": ctx.run.standbys.summary() if ctx.run.standbys is not None else {"enabled": False},
            # bytes of each rank's output its log files refused (the workers never saw a failed write; the last
            # lines of stderr were kept in memory for the root cause)
            "output_lost_bytes": {str(rank): size for rank, size in sorted(ctx.run.lost_output().items())},
        },
    )


def process_failures(ctx: Context) -> dict[str, str]:
    """The writes the disk refused that a run's report lists beyond its own warnings.

    The process's for a job of one group; none for a replica group, whose own are among its warnings already
    (runner/system/soft_io.py `scoped`).
    """
    return soft_io.failures() if ctx.inputs.replica is None else {}


def write_report(ctx: Context) -> Path | None:
    """Write <run dir>/report.json, or a fallback file the console names when the run dir can't take it."""
    ctx.report_path = place_report(report(ctx), ctx.inputs.run_dir, f"{ctx.spec.name}-{ctx.inputs.run_dir.name}",
                                   ctx.warnings.warn, ctx.log)
    return ctx.report_path
