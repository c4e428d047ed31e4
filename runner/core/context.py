"""Context: what the state handlers share while one agent runs one job on one node."""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from runner.core.machine import JobState
from runner.errors import RendezvousError
from runner.events import Event, StopRequested, TimerExpired, WorkerExited
from runner.observe.recovery import Recoveries
from runner.outcomes import Outcome
from runner.runs.control import agent_identity
from runner.system.private_files import write_private
from runner.system.shepherd import Shepherd
from runner.watchdog.readiness import Readiness
from runner.workers.failures import Failure
from runner.workers.group import Worker, WorkerGroup
from runner.workers.launch_plan import LaunchPlan, build_plan

if TYPE_CHECKING:
    from runner.config.spec import JobSpec
    from runner.rendezvous.base import Rendezvous, RendezvousResult
    from runner.watchdog.service import Watchdog
    from runner.workers.standby import StandbyPool


@dataclass
class Context:
    """Mutable run state. Handlers read and update it, then return a Step; the driver records outcome and exit code."""

    spec: JobSpec
    node: str
    run_dir: Path
    rendezvous: Rendezvous
    log: structlog.typing.FilteringBoundLogger
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    shepherd: Shepherd = field(default_factory=Shepherd)
    state: JobState = JobState.INIT
    attempt: int = 0
    restarts: int = 0  # restarts charged to the budget so far
    result: RendezvousResult | None = None
    plan: LaunchPlan | None = None
    group: WorkerGroup | None = None
    standbys: StandbyPool | None = None  # pre-warmed standby workers (restart.standby), from INIT on
    failure: Failure | None = None  # the current attempt's root cause
    failures: list[Failure] = field(default_factory=list)
    stop: StopRequested | None = None
    hurry: asyncio.Event = field(default_factory=asyncio.Event)  # a second stop signal: kill now
    outcome: Outcome | None = None  # set once a step settles it (None while the job goes on)
    exit_code: int = 0
    timer: Watchdog | None = None  # the file-timer server and heartbeat monitor, when the watchdog is on
    started: float = field(default_factory=time.monotonic)
    identity: dict[str, Any] = field(default_factory=agent_identity)  # read once: it never changes while we run
    deadline_armed: bool = False
    warnings: list[str] = field(default_factory=list)  # side failures (status writes, etcd) that did not stop the job
    report_path: Path | None = None  # where report.json went (the run dir, or a fallback when it could not)
    budget_error: str = ""  # why the restart budget could not be charged (etcd unreachable), if it could not
    recoveries: Recoveries = field(init=False)  # time to recover (runner/observe/recovery.py)
    readiness: Readiness | None = None  # who of the current attempt has not said it is ready (made at first spawn)
    publishing: asyncio.Lock = field(default_factory=asyncio.Lock)  # one publish at a time, in order
    side_tasks: set[asyncio.Task[None]] = field(default_factory=set)  # publishes started by a callback

    def __post_init__(self) -> None:
        """The launch is timed from the agent's start."""
        self.recoveries = Recoveries(launched_at=self.started)

    def status(self) -> dict[str, Any]:
        """This node's live state, as published for `runner status` (the JSON boundary: strings from here on)."""
        workers = []
        if self.group is not None:
            for w in self.group.workers.values():
                code = w.exited.result() if w.exited.done() else None
                workers.append({"rank": w.plan.rank, "local_rank": w.plan.local_rank, "pid": w.pid, "exit_code": code})
        return {
            "node": self.node,
            **self.identity,  # pid and start time: `runner stop` proves it is still this agent
            "state": self.state.value,
            "attempt": self.attempt,
            "restarts": self.restarts,
            "run_id": self.spec.name,
            "run_dir": str(self.run_dir),
            "heartbeat": time.time(),
            "workers": workers,
            "outcome": self.outcome.value if self.outcome is not None else None,
            **self.recoveries.status(),  # launch and the last recovery: running_s, ready_s (docs/time_to_recover.md)
        }

    def make_plan(self) -> LaunchPlan:
        """Plan this node's workers for the current attempt from the last rendezvous result."""
        assert self.result is not None  # only called after a completed round
        return build_plan(
            self.spec,
            self.result,
            attempt=self.attempt,
            run_dir=str(self.run_dir),
            base_env=os.environ,
            rank_env=self.timer.worker_env(range(self.result.nproc_per_node)) if self.timer is not None else None,
        )

    def is_stale(self, event: Event) -> bool:
        """True for a worker exit or timer expiry of a process that is not one of the current workers."""
        if not isinstance(event, (WorkerExited, TimerExpired)):
            return False
        worker = self.group.workers.get(event.local_rank) if self.group is not None else None
        return worker is None or worker.pid != event.pid

    def warn(self, event: str, **fields: object) -> None:
        """Log a side failure once per kind and keep it for the report: it never changes the job's result."""
        if event not in self.warnings:
            self.warnings.append(event)
            self.log.warning(event, **fields)

    async def publish(self, *, only_in: JobState | None = None) -> None:
        """Publish status to <run dir>/status.json and to the rendezvous backend; failures there are warnings.

        Publishes never overlap (the last one started is the last one written); with `only_in`, nothing is
        published unless the agent is still in that state when its turn comes.
        """
        async with self.publishing:
            if only_in is not None and self.state is not only_in:
                return
            status = self.status()
            path = self.run_dir / "status.json"
            try:
                write_private(path, json.dumps(status, indent=2))
            except OSError as e:
                self.warn("status_write_failed", path=str(path), error=str(e))
            try:
                await self.rendezvous.publish(status)
            except RendezvousError as e:
                self.warn("status_publish_failed", error=e.message)

    def event_seen(self) -> None:
        """RUNNING took an event off the queue: if it ends the attempt, this is when the agent learnt of it."""
        self.recoveries.seen(asyncio.get_running_loop().time())

    def attempt_failed(self, trigger: str) -> None:
        """The attempt ended in a failure (or a membership change): the start of a recovery, if one follows."""
        failure = self.failure.to_dict() if self.failure is not None else None
        self.recoveries.failed(asyncio.get_running_loop().time(), trigger, failure)
        if self.readiness is not None:
            self.readiness.clear()

    def failure_classed(self) -> None:
        """FAILED is done with the failure (classed on its evidence): the recovery, if one follows, shows that."""
        if self.failure is not None:
            self.recoveries.classed(self.failure.to_dict())

    def workers_spawned(self, workers: list[Worker], *, scope: str = "job") -> None:
        """Every worker of this attempt (`workers`) is spawned: "running"; watch each until it says it is ready."""
        loop = asyncio.get_running_loop()
        self.recoveries.running(loop.time(), self.attempt, [w.plan.local_rank for w in workers], scope=scope)
        if self.readiness is None:
            self.readiness = Readiness(self.worker_ready)
        if self.timer is not None:
            self.timer.on_first_request = self.readiness.request
        self.readiness.watch({w.plan.local_rank: Path(w.plan.heartbeat_file) for w in workers})

    def worker_ready(self, local_rank: int, at: float, source: str) -> None:
        """A worker of this attempt said it is ready; once all have, publish it (status.json, etcd)."""
        rec = self.recoveries.ready(local_rank, at, source)
        if rec is not None:
            self.log.info("workers_ready", attempt=rec.attempt, scope=rec.scope, running_s=rec.running_s,
                          ready_s=rec.ready_s)
            task = asyncio.get_running_loop().create_task(self.publish(only_in=JobState.RUNNING))
            self.side_tasks.add(task)
            task.add_done_callback(self.side_tasks.discard)
