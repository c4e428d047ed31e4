"""The books of a job of replica groups: each group's committed steps, the job's status.json and its report.json.

The supervisor (runner/agent/replicas.py) runs the groups under the job's machine; these books only read what it
shows them (a JobView: the groups, the job's phase, its end once settled, the hosted lighthouse) and write it down.
A group's step is what its rank 0 reported in its heartbeat file (runner/watchdog/steps.py reads it, the one parser
of that format), never guessed. A failed write is a warning, never the job's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from runner.agent.services import STATUS_REFRESH_S
from runner.core.group_state import GroupState
from runner.json_types import JSONObject
from runner.observe.ledger import job_ledger
from runner.rundir.layout import RunDir
from runner.rundir.records import LedgerRecord, Report, Status, place_report, write_status
from runner.states.shutdown import report as group_report
from runner.system import soft_io
from runner.watchdog.steps import reported_step

if TYPE_CHECKING:
    import structlog

    from runner.agent.lighthouse import HostedLighthouse
    from runner.agent.replica_group import Group, ReplicaJob
    from runner.config.spec import JobSpec
    from runner.core.job_machine import JobPhase, JobStep
    from runner.observe.group_metrics import GroupMetrics

STEP_POLL_S = 0.5  # how often each group's committed step is read (rank 0's heartbeat file)
MAX_STEP_SAMPLES = 2000  # per group, for the report's timeline (the oldest are thinned out)


@dataclass(frozen=True)
class JobView:
    """What the books show of the job at one moment."""

    groups: Sequence[Group]
    phase: JobPhase
    end: JobStep | None  # the job's end, once its machine settled it
    lighthouse: HostedLighthouse | None  # the hosted one (None: an address given in the spec, or none yet)


class JobBooks:
    """Steps, status and report of one job of replica groups on this node."""

    def __init__(self, spec: JobSpec, node: str, run_dir: Path, identity: dict[str, object], started: float,
                 log: structlog.typing.FilteringBoundLogger) -> None:
        assert spec.replica_groups is not None
        self.spec, self.node, self.run_dir, self.identity, self.started, self.log = (
            spec, node, run_dir, identity, started, log)
        self.groups_spec = spec.replica_groups
        self.metrics: GroupMetrics | None = None  # metrics.enabled: each new step goes there too
        self.due = asyncio.Event()  # a group moved or stepped: the status is due

    async def watch_steps(self, groups: Callable[[], Sequence[Group]]) -> None:
        """Read each group's committed step every STEP_POLL_S."""
        while True:
            for g in groups():
                self.note_step(g)
            await asyncio.sleep(STEP_POLL_S)

    def note_step(self, g: Group) -> None:
        """Keep the group's step, and the time it changed, when its rank 0 reported a new one."""
        plan = g.ctx.run.plan
        step = reported_step(Path(plan.workers[0].heartbeat_file)) if plan is not None and plan.workers else None
        if step is None or step == g.step:
            return
        g.step = step
        if self.metrics is not None:
            self.metrics.on_step(g.index, step)
        g.steps.append((round(time.time(), 3), step))
        if len(g.steps) > MAX_STEP_SAMPLES:
            del g.steps[1::2]  # keep the timeline's shape at half the resolution
        self.due.set()

    async def publish_loop(self, view: Callable[[], JobView]) -> None:
        """Write the job's status.json whenever a group moved or stepped (at most every STEP_POLL_S).

        And every STATUS_REFRESH_S regardless: the live totals (wall time, ETTR) never freeze.
        """
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STATUS_REFRESH_S):
                    await self.due.wait()
            self.due.clear()
            self.publish(view())
            await asyncio.sleep(STEP_POLL_S)

    def publish(self, view: JobView) -> None:
        """<run dir>/status.json: the job's state and each group's (a failure there is a warning)."""
        try:
            write_status(Status.from_dict(self.status(view)), self.run_dir)
        except OSError as e:
            soft_io.warn_once("status_write_failed", RunDir(self.run_dir).status, e)

    def status(self, view: JobView) -> dict[str, object]:
        """The job's live state: SHUTDOWN once every group is; RUNNING while one runs; else the first group's."""
        groups = view.groups
        states = [g.model.state for g in groups]
        if states and all(s is GroupState.SHUTDOWN for s in states):
            state = GroupState.SHUTDOWN
        elif GroupState.RUNNING in states:
            state = GroupState.RUNNING
        else:
            state = states[0] if states else GroupState.INIT
        return {
            "node": self.node, **self.identity, "state": state.value, "run_id": self.spec.name,
            "run_dir": str(self.run_dir), "heartbeat": time.time(),
            "attempt": max((g.ctx.run.attempt for g in groups), default=0),
            "restarts": sum(g.ctx.run.restarts for g in groups),
            "workers": [],
            "outcome": view.end.outcome.value if view.end is not None and view.end.outcome is not None else None,
            "job_phase": view.phase.value,  # the job's own machine (runner/core/job_machine.py)
            "groups": [g.status() for g in groups],
            "ledger": job_ledger([dict(g.ctx.recovery.figures(), group=g.index) for g in groups]),
            "lighthouse": self.lighthouse_status(view.lighthouse),
        }

    def lighthouse_status(self, lighthouse: HostedLighthouse | None) -> dict[str, object]:
        """Where the lighthouse is, and how often the hosted one was restarted."""
        if lighthouse is None:
            return {"hosted": False, "address": self.groups_spec.lighthouse.address}
        return {"hosted": True, "address": lighthouse.address, "pid": lighthouse.pid, "restarts": lighthouse.restarts}

    def write_report(self, job: ReplicaJob, view: JobView) -> Path | None:
        """<run dir>/report.json: the job's outcome and every group's own report, with its committed steps."""
        groups: list[dict[str, object]] = []
        ledgers: list[JSONObject] = []
        for g in view.groups:
            own = group_report(g.ctx)
            groups.append(own.to_dict() | {"group": g.index, "step": g.step, "steps": g.steps})
            ledgers.append((own.ledger.to_dict() if own.ledger is not None else {}) | {"group": g.index})
        report = Report(
            job=self.spec.name, node=self.node, outcome=job.outcome.value, exit_code=job.exit_code,
            reason=job.reason, duration_s=round(time.monotonic() - self.started, 3),
            attempts=sum(g.ctx.run.attempt + 1 for g in view.groups),
            restarts=sum(g.ctx.run.restarts for g in view.groups),
            failures=tuple(replace(f.record(), group=g.index) for g in view.groups for f in g.ctx.run.failures),
            extra={"replica_groups": {"count": self.groups_spec.count, "min_active": self.groups_spec.min_active,
                                      "nproc_per_node": self.groups_spec.nproc_per_node,
                                      "lighthouse": self.lighthouse_status(view.lighthouse)}},
            groups=tuple(groups), run_dir=str(self.run_dir),
            warnings=tuple(sorted({w for g in view.groups for w in g.ctx.warnings.seen} | set(soft_io.failures()))),
            ledger=LedgerRecord.from_dict(job_ledger(ledgers)),  # docs/goodput.md
        )
        return place_report(report, self.run_dir, f"{self.spec.name}-{self.run_dir.name}",
                            soft_io.WarnOnce(self.log).warn, self.log)
