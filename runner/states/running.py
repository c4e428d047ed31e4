"""RUNNING: start the planned workers, then turn the first decisive event into a Step."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import TYPE_CHECKING

from runner.contract import CODE_ENDED_FILE
from runner.core.machine import Step, Trigger
from runner.core.restart_policy import claim_round_for_membership
from runner.diagnosis.evidence import mismatch_line
from runner.diagnosis.failure import Failure, worker_failure
from runner.diagnosis.hang import collective_mismatch, peer_hang, watchdog_failure, with_hang, with_mismatch
from runner.diagnosis.lookup import Look, look_for
from runner.errors import EXIT_INFRA, EXIT_OK, EXIT_WORKERS_FAILED
from runner.events import (
    PEER_REPORTED,
    DeadlineReached,
    Event,
    Fenced,
    GuardLost,
    HangQuery,
    MembershipChanged,
    PeerLost,
    StopRequested,
    TimerExpired,
    WorkerExited,
)
from runner.outcomes import FailureKind, Outcome

if TYPE_CHECKING:
    from runner.core.context import Context

SETTLE_S = 2.0  # a rank that failed of a closed connection: how long its peers may take to fail of their own
PEER_SETTLE_S = 3.0  # and, on several nodes, how long the other nodes may take to say they failed (or be lost)
RECOVERY_POLL_S = 0.2  # past that, how often the wait asks whether the rendezvous still mends its store
C10D_WAIT_S = 2.0  # c10d's mismatch check raises on every rank at once: how long the other ranks' words are awaited


async def handle(ctx: Context) -> Step:
    """Start workers if this attempt has none yet; wait for events until one decides the next state."""
    if ctx.run.group is None:
        assert ctx.run.plan is not None  # RENDEZVOUS planned this attempt
        if ctx.run.standbys is not None:
            await ctx.run.standbys.warm()  # the fork server's one import instead of every rank's (bounded)
        group = ctx.run.group = ctx.launcher.launch(ctx.run.plan, ctx.run.standbys)
        ctx.recovery.workers_spawned(ctx.run.attempt, list(group.workers.values()))  # all running: time to recover
        if ctx.timer is not None:
            ctx.timer.watch(group)
        arm_deadline(ctx)
        await ctx.status.publish()
    while True:
        event = await ctx.events.get()
        ctx.recovery.event_seen()  # if it ends the attempt, the agent learnt of the failure now
        step = await on_event(ctx, event)
        if step is not None:
            return await stop_first(ctx, step)


async def stop_first(ctx: Context, step: Step) -> Step:
    """`step`, unless a stop had already reached the agent: then the stop (the job was stopped, not done).

    A signal sent to a whole process group or Slurm step reaches the workers with the agent. On a loaded machine
    the agent may run only after they exited (code 0 from a handler that saved and stopped, or a KeyboardInterrupt),
    and then sees their exits before the signal: that is not a success nor a failure to restart. The signal handler
    recorded the stop in the run's scope before the loop could see those exits (runner/system/stop_scope.py), so it
    is asked here, with no wait; a stop already queued (`runner stop` through etcd) counts too. The replica group's
    scope sits inside the job's, so the same holds for a group.
    """
    if step.trigger is Trigger.stop_requested:
        return step
    kept: list[Event] = []
    queued: StopRequested | None = None
    while not ctx.events.empty():
        event = ctx.events.get_nowait()
        if queued is None and isinstance(event, StopRequested) and not event.graceful:
            queued = event
        else:
            kept.append(event)
    for event in kept:  # later states see the rest in order
        ctx.events.put_nowait(event)
    stop = ctx.stops.stopping() or queued
    if stop is None:
        return step
    ctx.log.info("stop_came_first", signum=stop.signum, instead_of=step.trigger.value, reason=step.reason)
    ctx.run.failure = None  # the exits followed the signal: the stop is the cause
    return await on_event(ctx, stop) or step


async def on_event(ctx: Context, event: Event) -> Step | None:  # noqa: PLR0911 - one return per event kind
    """The Step `event` causes, or None to keep running. Events of earlier workers are ignored."""
    if ctx.run.is_stale(event):
        return None
    if isinstance(event, WorkerExited):
        return await on_worker_exit(ctx, event)
    if isinstance(event, (TimerExpired, HangQuery)):
        return on_hang(ctx, event)
    if isinstance(event, StopRequested):
        ctx.stop = event
        if event.graceful:
            ctx.log.info("graceful_stop", detail="workers finish; no restart", signum=event.signum)
            return None
        return Step(
            Trigger.stop_requested,
            event.reason
            or (f"stop requested (signal {event.signum})" if event.signum else "stop requested (runner stop)"),
        )
    if isinstance(event, PeerLost):
        return await on_peer_lost(ctx, event)
    if isinstance(event, MembershipChanged):
        await claim_round_for_membership(ctx)
        return Step(Trigger.membership_changed, f"node(s) waiting to join: {', '.join(event.waiting)}")
    if isinstance(event, Fenced):
        ctx.run.failure = Failure(kind=FailureKind.FENCED, reason=event.why, attempt=ctx.run.attempt)
        return Step(Trigger.fenced, event.why, Outcome.FAILED, EXIT_INFRA)
    if isinstance(event, GuardLost):
        reason = f"stopping: the shepherd died and could not be replaced ({event.why}); no worker may outlive us"
        ctx.run.failure = Failure(kind=FailureKind.GUARD, reason=reason, attempt=ctx.run.attempt)
        return Step(Trigger.guard_lost, reason, Outcome.ERROR, EXIT_INFRA)
    reason = f"max_run_time ({event.max_run_time:g} s) reached"  # DeadlineReached, the last kind of Event
    ctx.run.failure = Failure(kind=FailureKind.DEADLINE, reason=reason, attempt=ctx.run.attempt)
    return Step(Trigger.deadline_reached, reason, Outcome.FAILED, EXIT_WORKERS_FAILED)


async def on_peer_lost(ctx: Context, event: PeerLost) -> Step:
    """A peer is gone or failed: the attempt fails; on a hang, with the hang's culprit as the root cause.

    A peer that reported FAILED after the hang query this node answered failed on that hang: the root cause is the
    culprit, as on the node that found it (every node analysed the same records).
    """
    reason = f"node {event.node} lost: {event.why}" + (f": {event.cause}" if event.cause else "")
    failure = Failure(kind=FailureKind.PEER, reason=reason, attempt=ctx.run.attempt, peer=event,
                      classified=event.failure_class,  # its own class, as the failing node published it
                      evidence=f"as node {event.node} published it" if event.failure_class is not None else "")
    if event.why == PEER_REPORTED and ctx.recorder is not None and ctx.recorder.asked():
        found = await ctx.recorder.settled()  # bounded by the query's own bounds
        workers = ctx.run.group.workers.values() if ctx.run.group is not None else ()
        failure = peer_hang(failure, found, local_ranks={w.plan.rank: w.plan.local_rank for w in workers},
                            rank_dir=lambda local_rank: rank_dir(ctx, local_rank))
    ctx.run.failure = failure
    return Step(Trigger.peer_lost, failure.reason)


async def peer_news(ctx: Context) -> PeerLost | None:
    """Another node's failure, when one is heard of within PEER_SETTLE_S + lease_ttl (None at once on one node).

    A rank that died of a closed connection (collateral) in a world of several nodes died, most often, of a rank of
    another node: that node's FAILED state (its own root cause) comes within moments, or its lease lapses within
    lease_ttl when its whole host was lost, and names the culprit. The events taken off the queue meanwhile go back,
    in order, ahead of those that came later; a stop ends the wait.
    """
    result = ctx.run.result
    if result is None or result.group_world_size < 2:
        return None
    loop = asyncio.get_running_loop()
    # A node that said nothing may have lost its host with it (no agent, no guard left to revoke its lease): its
    # lease lapses within lease_ttl, and that names it; a node that failed says so well before.
    # A rendezvous mending its store (a hosted founder going on alone) carries that news only once mended: the wait
    # goes on while it mends, for at most connect_timeout more.
    rdzv = ctx.spec.rendezvous
    deadline, held, found = loop.time() + PEER_SETTLE_S + rdzv.lease_ttl, list[Event](), None
    limit = deadline + rdzv.connect_timeout

    def left(now: float) -> float:
        if now < deadline:
            return deadline - now
        return min(RECOVERY_POLL_S, limit - now) if ctx.rendezvous.recovering() else 0.0
    while found is None and (wait := left(loop.time())) > 0:
        try:
            event = await asyncio.wait_for(ctx.events.get(), wait)
        except TimeoutError:
            continue
        if isinstance(event, PeerLost):
            found = event
        else:
            held.append(event)
            if isinstance(event, StopRequested):
                break
    while not ctx.events.empty():
        held.append(ctx.events.get_nowait())
    for event in held:
        ctx.events.put_nowait(event)
    return found


def on_hang(ctx: Context, event: TimerExpired | HangQuery) -> Step | None:
    """A watchdog expiry fails the attempt, its root cause the hang's culprit; another node's hang: answer it."""
    if isinstance(event, HangQuery):
        if ctx.recorder is not None and ctx.run.group is not None:
            ctx.log.info("hang_query", by=event.by)
            ctx.recorder.ask(ctx.run.group.workers.values())
        return None
    workers = ctx.run.group.workers.values() if ctx.run.group is not None and event.culprit is not None else ()
    ctx.run.failure = watchdog_failure(
        event, ctx.run.attempt, local_ranks={w.plan.rank: w.plan.local_rank for w in workers},
        log_dir=rank_dir(ctx, event.local_rank), recorder=bool(ctx.spec.watchdog.flight_recorder),
        rank_dir=lambda local_rank: rank_dir(ctx, local_rank),
    )
    return Step(Trigger.timer_expired, ctx.run.failure.reason)


async def on_worker_exit(ctx: Context, event: WorkerExited) -> Step | None:
    """A failure ends the attempt at once (the first failing rank is the root cause); all zero = success."""
    assert ctx.run.group is not None  # is_stale() is False, so the worker is one of the group's
    worker = ctx.run.group.workers[event.local_rank]
    ctx.log.info("worker_exited", rank=event.rank, pid=event.pid, exit_code=event.exit_code)
    if event.exit_code < 0 and code_ended(worker.plan.log_dir):
        ctx.warnings.warn("worker_died_in_teardown", rank=event.rank, exit_code=event.exit_code,
                          detail="its code and atexit handlers had ended cleanly: counted as exit 0")
        event = dataclasses.replace(event, exit_code=0)
    if event.exit_code != 0:
        root = await ctx.run.group.settle(worker, SETTLE_S) if ctx.run.group.first_failed is None else \
            next(w for w in ctx.run.group.workers.values() if w.plan.rank == ctx.run.group.first_failed)
        if root is not worker:  # this rank failed of a peer's failure: the peer is the root cause
            ctx.events.put_nowait(event)  # its own exit still counts after this step (a worker scope replaces it)
            ctx.log.info("collateral_failure", rank=event.rank, exit_code=event.exit_code, root_cause=root.plan.rank)
            worker = root
            event = WorkerExited(root.plan.local_rank, root.plan.rank, root.pid, root.exited.result(), root.attempt)
        failure = worker_failure(ctx.run.attempt, event.rank, event.local_rank, event.exit_code,
                                 worker.plan.log_dir, ctx.run.group.stderr_tail(event.local_rank))
        workers = ctx.run.group.workers.values()
        look = look_for(failure, recorder=ctx.recorder is not None)  # the diagnosis's rule: cause or collateral
        if look is Look.MISMATCH and ctx.recorder is not None:  # the rank whose call differed
            words = collective_mismatch(failure)
            found = await ctx.recorder.named(workers, mismatched=await dying_words(ctx, event.rank, words))
            failure = with_mismatch(failure, found)
        elif look is Look.TIMEOUT and ctx.recorder is not None:  # a hang that a peer gave up on: its culprit
            failure = with_hang(failure, await ctx.recorder.named(workers, timed_out=(event.rank,)))
        elif look is Look.PEER and (lost := await peer_news(ctx)) is not None:
            ctx.log.info("collateral_failure", rank=event.rank, exit_code=event.exit_code, root_cause=lost.node)
            return await on_peer_lost(ctx, lost)  # the rank died of another node's failure: that node is the culprit
        ctx.run.failure = failure
        return Step(Trigger.worker_failed, ctx.run.failure.reason)
    if not ctx.run.group.running():
        if not all(ended_well(w.exited.result(), w.plan.log_dir) for w in ctx.run.group.workers.values()):
            return None  # one exited at the same moment and failed: its own exit, queued behind this one, decides
        log_queued_exits(ctx)
        return Step(
            Trigger.workers_succeeded,
            f"all {len(ctx.run.group.workers)} worker(s) exited with code 0",
            Outcome.SUCCEEDED,
            EXIT_OK,
        )
    await ctx.status.publish()  # the exit code for `runner status` (an exit that ends the attempt is published with it)
    return None


async def dying_words(ctx: Context, rank: int, words: str) -> dict[int, str]:
    """The mismatch words of `rank` and of every local worker whose stderr has some too.

    c10d's fingerprint check (TORCH_DISTRIBUTED_DEBUG=DETAIL) raises on every rank at once, each naming its call
    and one other's: the other workers' exits are waited for (at most C10D_WAIT_S) so that their words count.
    """
    assert ctx.run.group is not None
    workers = list(ctx.run.group.workers.values())
    if words.startswith("c10d: ") and (pending := [w.exited for w in workers if not w.exited.done()]):
        await asyncio.wait(pending, timeout=C10D_WAIT_S)
    said = {w.plan.rank: line for w in workers if (line := mismatch_line(ctx.run.group.stderr_tail(w.plan.local_rank)))}
    return {**said, rank: words}


def log_queued_exits(ctx: Context) -> None:
    """Log the exits of the attempt's workers still queued behind the one it succeeded on; keep the other events.

    They exited at the same moment, and RUNNING will not handle them: each worker's end is recorded all the same
    (`runner report` reads them).
    """
    kept: list[Event] = []
    while not ctx.events.empty():
        event = ctx.events.get_nowait()
        if isinstance(event, WorkerExited) and not ctx.run.is_stale(event):
            ctx.log.info("worker_exited", rank=event.rank, pid=event.pid, exit_code=event.exit_code)
        else:
            kept.append(event)
    for event in kept:
        ctx.events.put_nowait(event)


def ended_well(exit_code: int, log_dir: str) -> bool:
    """Exit 0, or a death by signal after the worker said its code and atexit handlers ended cleanly."""
    return exit_code == 0 or (exit_code < 0 and code_ended(log_dir))


def code_ended(log_dir: str) -> bool:
    """Whether the worker said its code and atexit handlers ended cleanly (a worker run in a standby does)."""
    return os.path.exists(os.path.join(log_dir, CODE_ENDED_FILE))


def rank_dir(ctx: Context, local_rank: int) -> str:
    """Log dir of the current worker of `local_rank`."""
    worker = ctx.run.group.workers.get(local_rank) if ctx.run.group is not None else None
    return worker.plan.log_dir if worker is not None else ""


def arm_deadline(ctx: Context) -> None:
    """Once per run: put DeadlineReached on the queue when watchdog.max_run_time has passed since start."""
    limit = ctx.spec.watchdog.max_run_time
    if limit is None or ctx.deadline_armed:
        return
    ctx.deadline_armed = True
    loop = asyncio.get_running_loop()
    delay = max(0.0, ctx.inputs.started + limit - loop.time())
    loop.call_later(delay, ctx.events.put_nowait, DeadlineReached(limit))
