"""INIT: write the resolved spec, install signal handlers, connect the rendezvous, start the watchdog."""

from __future__ import annotations

import json
import math
import os
import time
from typing import TYPE_CHECKING

from runner.config.redact import spec_for_disk
from runner.core.machine import Step, Trigger
from runner.diagnosis.failure import Failure
from runner.errors import RunnerError
from runner.outcomes import FailureKind, Outcome
from runner.rendezvous.etcd.lease_revoke import LeaseHolder
from runner.rundir.layout import RunDir
from runner.states.waiting import Stopped, unless_stopped
from runner.system import signals
from runner.system.private_files import write_private
from runner.workers.standby import StandbyPool

if TYPE_CHECKING:
    from runner.core.context import Context


async def handle(ctx: Context) -> Step:
    """Prepare everything the first rendezvous needs; a stop signal is honoured while connecting."""
    if ctx.inputs.replica is None:  # a replica group's stops come from the job's supervisor (agent/replicas.py)
        signals.install(
            ctx.stops,
            ctx.hurry,
            lambda name: ctx.log.warning("stop_hurried", signal=name),
            names=ctx.spec.shutdown.signals_to_handle,
        )
    try:
        ctx.inputs.run_dir.mkdir(parents=True, exist_ok=True)
        write_private(RunDir(ctx.inputs.run_dir).spec, json.dumps(spec_for_disk(ctx.spec), indent=2))
    except OSError as e:
        ctx.warnings.warn("spec_write_failed", error=str(e))
    start_standbys(ctx)  # their imports overlap the agent's own start and the rendezvous
    if isinstance(ctx.rendezvous, LeaseHolder):  # etcd: if this agent dies, its guard revokes its lease at once
        ctx.rendezvous.on_lease(ctx.shepherd.revoke_at_death)
    ctx.rendezvous.on_stop(ctx.stops.outermost().request_once)  # `runner stop` reaches the job above the groups
    try:
        await unless_stopped(ctx, ctx.rendezvous.open(ctx.events))
        start_recorder(ctx)
        start_stall_watch(ctx)
        if ctx.spec.watchdog.enabled or os.environ.get("TORCHELASTIC_ENABLE_FILE_TIMER") == "1":  # as torchrun
            await start_watchdog(ctx)
    except Stopped:
        return Step(Trigger.stop_requested, "stop requested while connecting")
    except RunnerError as e:
        ctx.run.failure = Failure(kind=FailureKind.RENDEZVOUS, reason=e.message, attempt=0, hint=e.fix)
        return Step(Trigger.fatal, e.message, Outcome.ERROR, e.exit_code)
    return Step(Trigger.initialized, f"logs in {ctx.inputs.run_dir}")


def start_standbys(ctx: Context) -> None:
    """One pre-warmed standby worker per local rank (restart.standby, script/module entrypoints)."""
    if not StandbyPool.wanted(ctx.spec, os.environ):
        return
    ctx.run.standbys = StandbyPool(
        ctx.spec, ctx.shepherd, nproc=ctx.spec.nproc_per_node, run_dir=ctx.inputs.run_dir, base_env=os.environ,
        log=ctx.log,
    )
    ctx.run.standbys.fill()  # now, whatever the rendezvous: attempt 0 runs in them (docs/standby.md)


def start_recorder(ctx: Context) -> None:
    """Every rank's flight recorder, read when a hang is found (docs/hangs.md); none with flight_recorder: 0."""
    if not ctx.spec.watchdog.flight_recorder:
        return
    from runner.watchdog.flight import FlightRecorder

    ctx.recorder = FlightRecorder(ctx.spec.watchdog.flight_recorder, ctx.inputs.node, ctx.log,
                                  ctx.rendezvous.share_hang)
    ctx.recorder.capture = ctx.spec.watchdog.capture_stacks
    if (folder := ctx.recorder.open_folder()) is not None:
        ctx.shepherd.remove_at_death(folder)  # an agent SIGKILLed leaves no sockets' folder behind


def start_stall_watch(ctx: Context) -> None:
    """The stall detector (watchdog.stall_timeout, on by default, watchdog or not): docs/hangs.md."""
    bound = ctx.spec.watchdog.stall_timeout
    if bound is None:
        return
    from runner.watchdog.stall import StallWatch

    elsewhere = (lambda: others_moved_s_ago(ctx)) if ctx.spec.nodes.max > 1 else None
    ctx.stall = StallWatch(bound, events=ctx.events, log=ctx.log, group=lambda: ctx.run.group, node=ctx.inputs.node,
                           recorder=ctx.recorder, capture=ctx.spec.watchdog.capture_stacks, elsewhere=elsewhere)
    ctx.stall.start()


async def others_moved_s_ago(ctx: Context) -> float:
    """Seconds since a rank of another node last moved, as the nodes published it (inf: none known).

    Less what that news may lag: a status republished every rendezvous.status_interval, of a sample taken every
    interval of the detector.
    """
    now = time.time()
    ages = [now - at for node, at in (await ctx.rendezvous.progress_of_nodes()).items() if node != ctx.inputs.node]
    lag = (ctx.spec.rendezvous.status_interval or 0.0) + (ctx.stall.interval if ctx.stall is not None else 0.0)
    return max(min(ages, default=math.inf) - lag, 0.0)


async def start_watchdog(ctx: Context) -> None:
    """Start the file-timer server; its expiries become TimerExpired events."""
    from runner.watchdog.service import Watchdog

    timer = Watchdog(ctx.spec.watchdog, run_dir=ctx.inputs.run_dir, events=ctx.events, log=ctx.log,
                     group=lambda: ctx.run.group, recorder=ctx.recorder)
    await timer.start()
    ctx.timer = timer
