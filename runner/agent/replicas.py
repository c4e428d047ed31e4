"""Replica groups (docs/replica_groups.md): N worlds of workers that train together through TorchFT's lighthouse.

Each group is a whole run of its own: its own machine (the same table), handlers, context, rendezvous (a fresh
MASTER_PORT every attempt: its own store), guard, attempts, restart budget, failure classes and standbys, under
<run dir>/group_<k>/. A failure in one group stops and restarts that group only; the others keep stepping (TorchFT
leaves the failed group out of the quorum until it rejoins and copies the live weights from a healthy peer).

This supervisor owns what the groups share, under the job's own machine (runner/core/job_machine.py: STARTING,
TRAINING, DEGRADED, STOPPING, ENDED; pure guards in runner/core/job_policy.py): the lighthouse, the stop signals (the
job's stop scope holds every group's), the minimum (when fewer than `min_active` groups can go on, the rest is
stopped with that cause: they could never take a step); its books (each group's committed step, the job's
status.json and report.json) are runner/agent/replica_books.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runner.agent.assembly import assemble_run
from runner.agent.backends import group_rendezvous
from runner.agent.placement import Placement
from runner.agent.replica_books import JobBooks, JobView
from runner.agent.replica_group import Group, ReplicaJob
from runner.core import job_policy
from runner.core.context import JobInputs, Replica
from runner.core.job_machine import JobEdge, JobPhase, JobStep, JobTrigger, build_job_machine
from runner.errors import EXIT_INFRA, EXIT_STOPPED_BASE, RunnerError
from runner.events import StopRequested
from runner.observe.logs import JsonLines
from runner.outcomes import Outcome
from runner.rundir.layout import RunDir
from runner.states.waiting import Stopped, unless_stopped
from runner.system import signals, soft_io
from runner.system.private_files import private_dir
from runner.system.shepherd import Shepherd
from runner.system.stop_scope import StopScope

if TYPE_CHECKING:
    import structlog

    from runner.config.spec import JobSpec, ReplicaGroups
    from runner.events import Event
    from runner.observe.group_metrics import GroupMetrics



@dataclass
class Waiting:
    """What a wait that honours a stop needs (states/waiting.py): the job's queue, and the stop that ended it."""

    events: asyncio.Queue[Event]
    stop: StopRequested | None = None


@dataclass
class JobRecord:
    """What a job of replica groups learnt on its way (the facts its guards read beside the groups', its outcome)."""

    lighthouse_lost: str = ""  # why the hosted lighthouse could not be restarted
    passed_down: StopRequested | None = None  # the stop the job itself sent its groups, with its cause
    minimum: str = ""  # why the minimum was lost, for the job's end
    end: JobStep | None = None  # the job's outcome, once ENDED


class Supervisor:
    """Runs the replica groups of one job on this node until every group is done, under the job's own machine.

    The job's machine (runner/core/job_machine.py) decides; this class gathers its facts, fires its triggers, and
    does what an edge means once taken: stop the groups with the edge's cause (a stop scope holds each group's),
    settle the job's outcome.
    """

    def __init__(self, spec: JobSpec, node: str, run_dir: Path, log: structlog.typing.FilteringBoundLogger,
                 identity: dict[str, object], advertise_addr: str = "127.0.0.1") -> None:
        assert spec.replica_groups is not None
        self.spec, self.node, self.run_dir, self.log, self.identity = spec, node, run_dir, log, identity
        self.addr = advertise_addr  # several nodes: where the other nodes reach this one (its lighthouse, stores)
        self.events: asyncio.Queue[Event] = asyncio.Queue()  # the stop requests the job receives
        self.stops = StopScope(self.events)  # the job's: each group's scope is inside it
        self.metrics: GroupMetrics | None = None  # metrics.enabled
        self.groups_spec: ReplicaGroups = spec.replica_groups
        self.started = time.monotonic()
        self.groups: list[Group] = []
        self.model, _ = build_job_machine(job_policy.GUARDS)
        self.learnt = JobRecord()  # what the job learnt on its way: facts beside the groups', and its outcome
        self.changed = asyncio.Event()  # something the job's guards read may have changed: review
        self.job_transitions = JsonLines(RunDir(run_dir).transitions)
        self.reaper = Shepherd()  # the agent's: child subreaper from the start, kills what is left at the very end
        self.place = Placement(spec, node, advertise_addr, run_dir, log, self.reaper, self.lighthouse_gone)
        self.books = JobBooks(spec, node, run_dir, identity, self.started, log)

    async def run(self) -> ReplicaJob:
        """Start the lighthouse and every group, review the job after every change until it ENDED, report."""
        job = ReplicaJob(self.spec.name, self.run_dir)
        hurry = asyncio.Event()
        signals.install(self.stops, hurry, self.hurried, names=self.spec.shutdown.signals_to_handle)
        self.reaper.start()
        address = await self.start(job)
        if address is None:
            return await self.wind_up(job)
        side = [asyncio.ensure_future(self.watch_stops()),
                asyncio.ensure_future(self.books.watch_steps(lambda: self.groups)),
                asyncio.ensure_future(self.books.publish_loop(self.view))]
        if self.place.follows:
            side.append(asyncio.ensure_future(self.place.follow_lighthouse(address, lambda: self.groups)))
        tasks = [asyncio.ensure_future(self.drive(g)) for g in self.groups]
        try:
            while self.model.state is not JobPhase.ENDED:
                await self.changed.wait()
                self.changed.clear()
                for task in tasks:
                    if task.done():
                        task.result()  # a group's own error is the agent's error: it propagates
                await self.review()
        except BaseException:
            await stop_tasks([*side, *tasks])
            await self.wind_down()
            raise
        await stop_tasks([*side, *tasks])
        return await self.wind_up(job)

    def view(self) -> JobView:
        """What the books show of the job now."""
        return JobView(tuple(self.groups), self.model.state, self.learnt.end, self.place.lighthouse)

    def facts(self) -> job_policy.JobFacts:
        """What the job's guards read now."""
        stopping = self.stops.stopping()
        passed = self.learnt.passed_down
        groups_stopping = stopping is not None or (passed is not None and not passed.graceful)
        return job_policy.JobFacts(tuple(g.view() for g in self.groups), self.groups_spec.min_active,
                                   stopping or self.stops.requested(), self.learnt.lighthouse_lost, groups_stopping)

    async def review(self) -> None:
        """Fire `review` until no guarded edge holds (or the job ENDED); act on every edge taken."""
        while self.model.state is not JobPhase.ENDED:
            facts = self.facts()
            src = self.model.state
            if not await self.model.trigger(JobTrigger.review.value, facts=facts):
                return
            edge = self.model.taken
            assert edge is not None
            self.took(src, edge, self.act(edge, facts))

    def act(self, edge: JobEdge, facts: job_policy.JobFacts) -> JobStep:
        """What the edge just taken means, done now that the guard decided; its step (cause, outcome)."""
        trigger = edge.trigger
        if trigger is JobTrigger.groups_ended:
            self.learnt.end = job_policy.ended(facts, self.learnt.minimum)
            return self.learnt.end
        if trigger is JobTrigger.stop_requested:  # the stop reached every group's scope with the signal itself
            stop = facts.stop
            assert stop is not None
            kind = "graceful stop" if stop.graceful else "stop"
            return JobStep(trigger, f"{kind} requested (signal {stop.signum})" if stop.signum
                           else f"{kind} requested (runner stop)")
        if trigger is JobTrigger.lighthouse_lost:
            self.pass_down(f"the job stopped every group: {facts.lighthouse_gone}")
            return JobStep(trigger, facts.lighthouse_gone)
        if trigger is JobTrigger.minimum_lost:
            self.learnt.minimum = job_policy.minimum_reason(facts)
            self.log.error("replica_minimum_lost", reason=self.learnt.minimum)
            self.pass_down(f"the job stopped the groups left: {self.learnt.minimum}")
            return JobStep(trigger, self.learnt.minimum)
        down = [g for g in facts.groups if not g.up]
        if trigger is JobTrigger.group_down:
            return JobStep(trigger, "; ".join(f"group {g.index} {g.state.value}"
                                              + (f" ({g.outcome.value})" if g.outcome is not None else "")
                                              for g in down))
        return JobStep(trigger, f"every group is up ({len(facts.groups)})")  # recovered

    def pass_down(self, reason: str) -> None:
        """Stop every group with the job's cause (not a signal: each group forwards the spec's shutdown.signal)."""
        self.learnt.passed_down = StopRequested(signum=0, graceful=False, reason=reason)
        self.stops.pass_down(self.learnt.passed_down)

    def took(self, src: JobPhase, edge: JobEdge, step: JobStep) -> None:
        """One `job_transition` event (console, agent.jsonl, the job's transitions.jsonl); the status is due."""
        event: dict[str, object] = {
            "event": "job_transition", "src": src.value, "dst": edge.dest.value, "trigger": edge.trigger.value,
            "reason": step.reason, "job": self.spec.name, "node": self.node, "time": time.time(),
        }
        if step.outcome is not None:
            event["outcome"] = step.outcome.value
        try:
            self.job_transitions.write(event)
        except OSError as e:
            soft_io.warn_once("transition_write_failed", RunDir(self.run_dir).transitions, e)
        self.log.info("job_transition", **{k: v for k, v in event.items() if k not in ("event", "job", "node")})
        self.books.due.set()

    async def fire(self, trigger: JobTrigger, step: JobStep) -> None:
        """Fire one of the job's unguarded edges (out of STARTING) and record it."""
        src = self.model.state
        took = await self.model.trigger(trigger.value, facts=self.facts())
        edge = self.model.taken
        assert took, f"{trigger.value} took no edge from {src.value}"
        assert edge is not None
        self.took(src, edge, step)

    async def start(self, job: ReplicaJob) -> str | None:
        """Take this node's place (its groups, the lighthouse), make the groups, serve the metrics.

        The lighthouse's address; None when the job ends before any group starts (STARTING -> ENDED says why).
        """
        waiting = Waiting(self.events)
        try:
            mine, address = await unless_stopped(waiting, self.place.take())
            self.start_metrics(mine)
            self.groups = job.groups = [self.make_group(k, address) for k in mine]
        except Stopped:
            assert waiting.stop is not None
            signum = waiting.stop.signum or signal.SIGTERM
            self.learnt.end = JobStep(JobTrigger.stop_requested, "stop requested", Outcome.STOPPED,
                               EXIT_STOPPED_BASE + signum)
        except RunnerError as e:
            self.learnt.end = JobStep(JobTrigger.start_failed, e.message, Outcome.ERROR, EXIT_INFRA, e.fix)
        if self.learnt.end is not None:
            if self.learnt.end.trigger is JobTrigger.start_failed:
                self.log.error("replica_start_failed", error=self.learnt.end.reason, fix=self.learnt.end.fix)
            await self.fire(self.learnt.end.trigger, self.learnt.end)
            return None
        seat = self.place.seat
        where = f"lighthouse {address}" + (f", seat {seat.taken}" if seat is not None else "")
        await self.fire(JobTrigger.started, JobStep(JobTrigger.started, f"group(s) {mine} on this node; {where}"))
        return address

    def start_metrics(self, groups: list[int]) -> None:
        """metrics.enabled: one endpoint for the groups this node runs (every series labelled with its group)."""
        if not self.spec.metrics.enabled:
            return
        from runner.observe.group_metrics import GroupMetrics

        self.metrics = GroupMetrics(self.spec, self.node, groups)
        self.metrics.ledgers = lambda: {g.index: g.ctx.recovery.figures() for g in self.groups}  # ETTR gauges
        self.metrics.start(lambda: self.place.lighthouse.restarts if self.place.lighthouse is not None else 0)
        self.books.metrics = self.metrics

    async def wind_up(self, job: ReplicaJob) -> ReplicaJob:
        """The job's end, however it came: leave, close, settle, write the status and the report.

        Also when no group started (a stop while taking a seat, no lighthouse, etcd refused): one ending, one place.
        """
        await self.wind_down()
        assert self.learnt.end is not None
        self.settle(job, self.learnt.end)
        self.books.publish(self.view())
        job.report_path = self.books.write_report(job, self.view())
        return job

    async def wind_down(self) -> None:
        """Leave (the lighthouse's host lingers for the others), stop the metrics, close the logs and the reaper."""
        await self.place.leave(lambda: any(g.ctx.hurry.is_set() for g in self.groups))
        if self.metrics is not None:
            self.metrics.stop()
        self.job_transitions.close()
        self.reaper.close()

    def make_group(self, k: int, lighthouse: str) -> Group:
        """Group k: its own spec view (the group's nproc_per_node), run dir, rendezvous, machine and context."""
        folder = RunDir(self.run_dir).group(k).root
        try:
            private_dir(folder)
        except OSError as e:  # a full logs disk: the group runs, its writes fail soft
            soft_io.warn_once("group_dir_unwritable", folder, e)
        replica = Replica(k, self.groups_spec.count, lighthouse)
        spec, node, rendezvous = group_rendezvous(self.spec, k, self.node, self.addr, self.log,
                                                  seated=self.place.seat is not None)
        inputs = JobInputs(spec, node, folder, self.started, self.identity, replica=replica)
        metrics = self.metrics.group(k) if self.metrics is not None else None
        run = assemble_run(inputs, rendezvous, self.log.bind(group=k), metrics=metrics,
                           shepherd=Shepherd(agent=False),  # the supervisor's own is the subreaper
                           outer_stops=self.stops,  # a stop the job receives or decides reaches the group
                           job_sink=self.job_transitions, after=self.moved)
        if self.place.follows:
            run.ctx.before_plan = self.place.settled
        return Group(run)

    async def drive(self, group: Group) -> None:
        """Run one group's machine to SHUTDOWN; its transitions go to its own file and to the job's."""
        try:
            with soft_io.scoped(group.ctx.warnings):  # its report lists its own write failures, not every group's
                await group.run.drive()
        finally:
            self.books.note_step(group)  # its last report, made after the last poll
            group.ended = True
            self.changed.set()

    def moved(self) -> None:
        """A group took an edge: its status is due, and the job reviews."""
        self.books.due.set()
        self.changed.set()

    def hurried(self, name: str) -> None:
        """A second stop signal: every group kills its workers now."""
        self.log.warning("stop_hurried", signal=name)
        for g in self.groups:
            g.ctx.hurry.set()

    async def watch_stops(self) -> None:
        """Every stop request the job receives is a change to review (it reached the groups' scopes already)."""
        while True:
            await self.events.get()
            self.changed.set()

    def lighthouse_gone(self, reason: str) -> None:
        """The hosted lighthouse could not be restarted: no group can step any more (the job reviews: exit 3)."""
        self.learnt.lighthouse_lost = reason
        self.changed.set()

    def settle(self, job: ReplicaJob, end: JobStep) -> None:
        """The job's end, as its last edge settled it."""
        assert end.outcome is not None
        assert end.exit_code is not None
        job.outcome, job.exit_code, job.reason, job.fix = end.outcome, end.exit_code, end.reason, end.fix
        if job.outcome is Outcome.ERROR and self.learnt.lighthouse_lost and not job.fix:
            job.fix = f"see {self.run_dir / 'lighthouse.log'}"
        self.log.info("replica_job_ended", outcome=job.outcome.value, exit_code=job.exit_code, reason=job.reason)


async def stop_tasks(tasks: list[asyncio.Future[None]]) -> None:
    """Cancel the supervisor's tasks and wait until they are done."""
    for task in tasks:
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.gather(*tasks, return_exceptions=True)
