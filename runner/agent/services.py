"""The services the state handlers call (runner/core/context.py's Protocols), as the agent provides them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from runner.core.group_state import GroupState
from runner.errors import RendezvousError
from runner.observe.ledger import Ledger, StepReport
from runner.observe.recovery import Recoveries
from runner.outcomes import FailureKind
from runner.rundir.layout import RunDir
from runner.rundir.records import Status, write_status
from runner.watchdog.readiness import Readiness
from runner.watchdog.steps import StepWatch
from runner.workers.group import Worker, WorkerGroup

if TYPE_CHECKING:
    import structlog

    from runner.config.spec import JobSpec
    from runner.core.context import Context
    from runner.diagnosis.failure import Failure
    from runner.events import Event
    from runner.rendezvous.base import Rendezvous
    from runner.system.shepherd import Shepherd
    from runner.system.soft_io import WarnOnce
    from runner.watchdog.service import Watchdog
    from runner.workers.launch_plan import LaunchPlan
    from runner.workers.standby import StandbyPool


class GroupLauncher:
    """Spawns an attempt's workers as a WorkerGroup feeding the agent's event queue, watched by its guard."""

    def __init__(self, spec: JobSpec, events: asyncio.Queue[Event], shepherd: Shepherd,
                 log: structlog.typing.FilteringBoundLogger) -> None:
        self._spec, self._events, self._shepherd, self._log = spec, events, shepherd, log

    def launch(self, plan: LaunchPlan, standbys: StandbyPool | None) -> WorkerGroup:
        """Start every worker of `plan`."""
        group = WorkerGroup(self._events, self._shepherd, tee=self._spec.logs.tee, prefix=self._spec.logs.prefix,
                            log=self._log, standbys=standbys)
        group.start(plan)
        return group


def workers_status(ctx: Context) -> list[dict[str, object]]:
    """The current attempt's workers: rank, local rank, pid, exit code (None while it runs)."""
    workers: list[dict[str, object]] = []
    if ctx.run.group is not None:
        for w in ctx.run.group.workers.values():
            code = w.exited.result() if w.exited.done() else None
            workers.append({"rank": w.plan.rank, "local_rank": w.plan.local_rank, "pid": w.pid, "exit_code": code})
    return workers


def node_status(ctx: Context, state: GroupState) -> dict[str, object]:
    """This node's live state, as published for `runner status` (the JSON boundary: strings from here on)."""
    workers = workers_status(ctx)
    return {
        "node": ctx.inputs.node,
        **ctx.inputs.identity,  # pid and start time: `runner stop` proves it is still this agent
        "state": state.value,
        "attempt": ctx.run.attempt,
        "restarts": ctx.run.restarts,
        "run_id": ctx.spec.name,
        "run_dir": str(ctx.inputs.run_dir),
        "heartbeat": time.time(),
        "workers": workers,
        "outcome": ctx.outcome.value if ctx.outcome is not None else None,
        **({"unhealthy": ctx.run.unhealthy} if ctx.run.unhealthy is not None else {}),  # out of the round: why
        **root_cause(ctx.run.failure, state),  # FAILED: the root cause, for the peers
        **ctx.recovery.status(),  # launch and the last recovery: running_s, ready_s (docs/time_to_recover.md)
        **progress_at(ctx),  # when its ranks last moved: the other nodes' stall detectors ask (docs/hangs.md)
    }


def progress_at(ctx: Context) -> dict[str, object]:
    """`progress_at`: when a rank of this node last moved (epoch seconds), while the stall detector watches ranks."""
    at = ctx.stall.moved_at_wall() if ctx.stall is not None else None
    return {"progress_at": round(at, 3)} if at is not None else {}


CAUSE_CHARS = 300  # a published root cause, at most (one line: the rank, its exception, where it was raised)


def root_cause(failure: Failure | None, state: GroupState) -> dict[str, object]:
    """While FAILED, the root cause for the peers: this node's own (`cause`), or the lost peer it failed of (`lost`).

    A node that failed of a peer's loss is a waiter, never the culprit: a member that sees its FAILED state before
    the loss itself (the round's `lost` key) names the lost peer from `lost`, not the waiter (monitor.py).
    """
    if state is not GroupState.FAILED or failure is None:
        return {}
    if failure.kind is FailureKind.PEER:
        if failure.peer is None:
            return {}
        lost = failure.peer.to_dict()  # its texts as one bounded line each; the node id as it is
        return {"lost": {k: v if k == "node" else one_line(v) for k, v in lost.items()}}
    return {"cause": one_line(failure.reason), "class": failure.failure_class.value} if failure.reason else {}


def one_line(text: str) -> str:
    """`text`'s first line, at most CAUSE_CHARS."""
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= CAUSE_CHARS else line[: CAUSE_CHARS - 1] + "…"


STATUS_REFRESH_S = 2.0  # while the run lives, status.json's totals (wall time, ETTR) are at most this old
DUE_SLACK_S = 0.005  # a timer may wake a little early: the rendezvous' copy is due this much before its interval


class Publisher:
    """Writes <run dir>/status.json and publishes to the rendezvous backend, one publish at a time, in order.

    Besides each change (`publish`), `refresh` rewrites the live totals every STATUS_REFRESH_S (the agent's
    refresh task), and republishes them to the rendezvous every `every` s (rendezvous.status_interval; None: on
    changes only): bounded cost (one small file write, one etcd put per node per interval), and `runner status`
    never shows totals frozen at the last change unless the interval is off.
    """

    def __init__(self, run_dir: Path, rendezvous: Rendezvous, warnings: WarnOnce,
                 state: Callable[[], GroupState], snapshot: Callable[[GroupState], dict[str, object]], *,
                 every: float | None) -> None:
        self._run_dir, self._rendezvous, self._warnings, self._every = run_dir, rendezvous, warnings, every
        self._state, self._snapshot = state, snapshot
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._published_at: float | None = None  # the loop's time of the last publish to the rendezvous

    async def publish(self, *, only_in: GroupState | None = None) -> None:
        """Publish now; with `only_in`, nothing is published unless the machine is still in that state."""
        async with self._lock:
            state = self._state()
            if only_in is not None and state is not only_in:
                return
            await self._write(state, to_rendezvous=True)

    async def refresh(self) -> None:
        """The live totals again (not once SHUTDOWN published the last word): status.json, and etcd when due."""
        async with self._lock:
            state = self._state()
            if state is GroupState.SHUTDOWN:
                return
            due = self._rendezvous_due()
            await self._write(state, to_rendezvous=due is not None and asyncio.get_running_loop().time() >= due)

    def _rendezvous_due(self) -> float | None:
        """When the rendezvous' copy is due again (the loop's time; None: on changes only)."""
        if self._every is None:
            return None
        last = self._published_at
        return asyncio.get_running_loop().time() if last is None else last + self._every - DUE_SLACK_S

    async def refresh_loop(self) -> None:
        """status.json every STATUS_REFRESH_S, and the rendezvous' copy `every` s after its last publish.

        A change publishes at once and starts the interval again. Runs until cancelled (the run's end).
        """
        loop = asyncio.get_running_loop()
        file_due = loop.time() + STATUS_REFRESH_S
        while True:
            due = self._rendezvous_due()
            await asyncio.sleep(max(0.0, (file_due if due is None else min(file_due, due)) - loop.time()))
            await self.refresh()
            if loop.time() >= file_due:
                file_due = loop.time() + STATUS_REFRESH_S

    async def _write(self, state: GroupState, *, to_rendezvous: bool) -> None:
        status = self._snapshot(state)
        try:
            write_status(Status.from_dict(status), self._run_dir)
        except OSError as e:
            self._warnings.warn("status_write_failed", path=str(RunDir(self._run_dir).status), error=str(e))
        if not to_rendezvous:
            return
        self._published_at = asyncio.get_running_loop().time()
        try:
            await self._rendezvous.publish(status)
        except RendezvousError as e:
            self._warnings.warn("status_publish_failed", error=e.message)

    def publish_soon(self, *, only_in: GroupState) -> None:
        """Publish from a callback: a task of its own, kept until it is done."""
        task = asyncio.get_running_loop().create_task(self.publish(only_in=only_in))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class RecoveryTimer:
    """Time to recover (observe/recovery.py) on the event loop's clock, with readiness from heartbeats and timers."""

    def __init__(self, recoveries: Recoveries, publisher: Publisher, timer: Callable[[], Watchdog | None],
                 log: structlog.typing.FilteringBoundLogger, running: GroupState) -> None:
        self.recoveries = recoveries
        self._publisher, self._timer, self._log, self._running = publisher, timer, log, running
        self._readiness: Readiness | None = None  # made at the first spawn
        self.ledger = Ledger(recoveries.launched_at)  # the ETTR ledger (docs/goodput.md)
        self._steps: StepWatch | None = None  # the steps the workers report (made at the first spawn)
        self._ended_at: float | None = None  # the run's end: its first report (a replica group's is read again later)

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def event_seen(self) -> None:
        """RUNNING took an event off the queue: if it ends the attempt, this is when the agent learnt of it."""
        self.recoveries.seen(self._now())

    def attempt_failed(self, trigger: str, failure: Failure | None) -> None:
        """The attempt ended in a failure (or a membership change): the start of a recovery, if one follows."""
        self.recoveries.failed(self._now(), trigger, failure.to_dict() if failure is not None else None)
        if self._readiness is not None:
            self._readiness.clear()
        pending = self.recoveries.pending
        learnt = pending.since if pending is not None else self._now()
        if self._steps is not None:
            self._steps.poll()  # the last step reported before the failure
        self.ledger.failed(learnt, self.detection(failure, learnt), trigger,
                           failure.to_dict() if failure is not None else None)

    def detection(self, failure: Failure | None, learnt: float) -> float | None:
        """Seconds from the failure's cause to `learnt` (None where the agent cannot know: a peer lost, ...).

        0 for an exit (its pidfd tells at once) or a membership change; for a watchdog expiry, since the rank's
        last sign of life (its heartbeat file's last change, or its last timer request).
        """
        if failure is None or failure.kind is FailureKind.WORKER:
            return 0.0
        if failure.kind is not FailureKind.WATCHDOG or failure.local_rank is None:
            return None
        timer = self._timer()
        signs = [self._steps.last_touch(failure.local_rank) if self._steps is not None else None,
                 timer.server.last_activity(failure.local_rank) if timer is not None else None]
        known = [s for s in signs if s is not None]
        return max(0.0, learnt - max(known)) if known else None

    def state_changed(self, src: GroupState, dst: GroupState) -> None:
        """The ledger's marks between a failure and the next attempt: teardown done, the round complete."""
        if src is GroupState.RENDEZVOUS and dst is GroupState.RUNNING:
            self.ledger.entered_running(self._now())
        elif src is GroupState.RESTARTING and dst is GroupState.RENDEZVOUS:
            self.ledger.torn_down(self._now())

    def step_reported(self, report: StepReport) -> None:
        """A worker of the current attempt reported a step (its heartbeat file's content)."""
        self.ledger.step(report)

    def failure_classed(self, failure: Failure) -> None:
        """FAILED is done with the failure (classed on its evidence): the recovery, if one follows, shows that."""
        self.recoveries.classed(failure.to_dict())
        self.ledger.classed(failure.to_dict())

    def workers_spawned(self, attempt: int, workers: Sequence[Worker], *, scope: str = "job") -> None:
        """Every worker of this attempt (`workers`) is spawned: "running"; watch each until it says it is ready."""
        self.recoveries.running(self._now(), attempt, [w.plan.local_rank for w in workers], scope=scope)
        if self._readiness is None:
            self._readiness = Readiness(self.worker_ready)
        timer = self._timer()
        if timer is not None:
            timer.on_first_request = self._readiness.request
        self._readiness.watch({w.plan.local_rank: Path(w.plan.heartbeat_file) for w in workers})
        self.ledger.spawned(self._now(), attempt, scope)
        if self._steps is None:
            self._steps = StepWatch(self.step_reported)
        self._steps.watch({w.plan.local_rank: Path(w.plan.heartbeat_file) for w in workers}, replace=scope != "worker")

    def worker_ready(self, local_rank: int, at: float, source: str) -> None:
        """A worker of this attempt said it is ready; once all have, publish it (status.json, etcd)."""
        rec = self.recoveries.ready(local_rank, at, source)
        if rec is not None:
            self._log.info("workers_ready", attempt=rec.attempt, scope=rec.scope, running_s=rec.running_s,
                           ready_s=rec.ready_s)
            if rec.ready_at is not None:
                self.ledger.ready(rec.ready_at)
            self._publisher.publish_soon(only_in=self._running)

    def status(self) -> dict[str, object]:
        """The launch and the last recovery, for status.json."""
        return {**self.recoveries.status(), "ledger": self.ledger.status(self.until(self._now()))}

    def report(self) -> dict[str, object]:
        """Every recovery, for report.json."""
        if self._ended_at is None:  # the first report is made at the run's end (SHUTDOWN)
            if self._steps is not None:
                self._steps.poll()  # the last report before the end
                self._steps.clear()
            self._ended_at = self._now()
        return {**self.recoveries.report(), "ledger": self.ledger.report(self._ended_at)}

    def until(self, now: float) -> float:
        """`now`, or the run's end once it ended (a replica group ended before the job)."""
        return now if self._ended_at is None else min(now, self._ended_at)

    def figures(self) -> dict[str, object]:
        """The ledger so far, callable from any thread (the metrics' gauges): the loop's clock is time.monotonic."""
        return self.ledger.report(self.until(time.monotonic()))

    def line(self) -> str:
        """The summary's line on recoveries ("" when there was none)."""
        return self.recoveries.line()
