"""Replica groups (docs/replica_groups.md): N worlds of workers that train together through TorchFT's lighthouse.

Each group is a whole run of its own: its own machine (the same table), handlers, context, rendezvous (a fresh
MASTER_PORT every attempt: its own store), guard, attempts, restart budget, failure classes and standbys, under
<run dir>/group_<k>/. A failure in one group stops and restarts that group only; the others keep stepping (TorchFT
leaves the failed group out of the quorum until it rejoins and copies the live weights from a healthy peer).

This supervisor owns what the groups share: the lighthouse, the stop signals (fanned out to every group), the
minimum (when fewer than `min_active` groups can go on, the rest is stopped: they could never take a step), the
job's status.json (each group's state, attempt, restarts and committed step) and report.json.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.agent.agent import TransitionLog, assemble
from runner.agent.lighthouse import HostedLighthouse, LighthouseError
from runner.config.preflight import lighthouse_program
from runner.config.spec import Nodes
from runner.core.context import Context, JobInputs, Replica
from runner.core.machine import JobState, Model, build_machine, drive
from runner.core.restart_policy import GUARDS, settle
from runner.errors import EXIT_INFRA, EXIT_OK, EXIT_STOPPED_BASE, EXIT_WORKERS_FAILED, RunnerError
from runner.events import StopRequested
from runner.observe.ledger import job_ledger
from runner.observe.logs import JsonLines
from runner.outcomes import Outcome
from runner.rendezvous.local import LocalRendezvous
from runner.states import HANDLERS
from runner.states.shutdown import place_report
from runner.states.shutdown import report as group_report
from runner.states.waiting import Stopped, unless_stopped
from runner.system import signals, soft_io
from runner.system.private_files import private_dir, write_private
from runner.system.shepherd import Shepherd

if TYPE_CHECKING:
    import structlog

    from runner.agent.group_seat import GroupSeat
    from runner.config.spec import JobSpec, ReplicaGroups
    from runner.events import Event
    from runner.observe.group_metrics import GroupMetrics
    from runner.rendezvous.base import Rendezvous

LIGHTHOUSE_POLL_S = 1.0  # several nodes: how often the published lighthouse address is read
LINGER_S = 60.0  # the lighthouse's host waits at most this long for the other nodes to end
LINGER_POLL_S = 0.5
STEP_POLL_S = 0.5  # how often each group's committed step is read (rank 0's heartbeat file)
MAX_STEP_BYTES = 4096  # a heartbeat file larger than this is no step report
MAX_STEP_SAMPLES = 2000  # per group, for the report's timeline (the oldest are thinned out)


@dataclass
class Group:
    """One replica group as the supervisor sees it: its context, its machine, what it last reported."""

    ctx: Context
    model: Model
    step: int | None = None  # the last step its rank 0 committed (None: not reported yet)
    steps: list[tuple[float, int]] = field(default_factory=list)  # (epoch seconds, step) on every change

    @property
    def index(self) -> int:
        """REPLICA_GROUP_ID."""
        assert self.ctx.inputs.replica is not None
        return self.ctx.inputs.replica.group

    def status(self) -> dict[str, object]:
        """This group's line of the job's status (the JSON boundary)."""
        return {
            "group": self.index,
            "state": self.model.state.value,
            "attempt": self.ctx.run.attempt,
            "restarts": self.ctx.run.restarts,
            "step": self.step,
            "outcome": self.ctx.outcome.value if self.ctx.outcome is not None else None,
            "ledger": self.ctx.recovery.status().get("ledger"),  # its ETTR so far (docs/goodput.md)
        }


@dataclass
class ReplicaJob:
    """The job's end: outcome, exit code, why, and every group's report (what `runner run` prints and exits with)."""

    name: str
    run_dir: Path
    outcome: Outcome = Outcome.STOPPED
    exit_code: int = EXIT_INFRA
    reason: str = ""
    fix: str = ""  # what to do about an error that kept the groups from starting
    groups: list[Group] = field(default_factory=list)
    report_path: Path | None = None

    def summary(self) -> list[str]:
        """The lines `runner run` prints at the end."""
        lines = [f"runner: job '{self.name}' {self.outcome} ({self.reason}); exit code {self.exit_code}"]
        if self.fix:
            lines.append(f"runner:   fix: {self.fix}")
        for g in self.groups:
            failures = g.ctx.run.failures
            last = f"; last failure: {failures[-1].reason}" if failures else ""
            step = f", step {g.step}" if g.step is not None else ""
            lines.append(f"runner:   group {g.index}: {g.ctx.outcome} after {g.ctx.run.attempt + 1} attempt(s), "
                         f"{g.ctx.run.restarts} restart(s){step}{last}")
        lines.append(f"runner: logs: {self.run_dir}")
        if self.report_path is None:
            lines.append("runner: warning: report.json could not be written")
        elif self.report_path.parent != self.run_dir:  # as a single group's summary: where it went instead
            lines.append(f"runner: report: {self.report_path} (the run dir could not take it)")
        return lines


class Supervisor:
    """Runs the replica groups of one job on this node until every group is done."""

    def __init__(self, spec: JobSpec, node: str, run_dir: Path, log: structlog.typing.FilteringBoundLogger,
                 identity: dict[str, Any], advertise_addr: str = "127.0.0.1") -> None:
        assert spec.replica_groups is not None
        self.spec, self.node, self.run_dir, self.log, self.identity = spec, node, run_dir, log, identity
        self.addr = advertise_addr  # several nodes: where the other nodes reach this one (its lighthouse, stores)
        self.seat: GroupSeat | None = None  # several nodes (etcd): which group this node runs
        self.events: asyncio.Queue[Event] = asyncio.Queue()  # the stop signals'
        self.metrics: GroupMetrics | None = None  # metrics.enabled
        self.groups_spec: ReplicaGroups = spec.replica_groups
        self.started = time.monotonic()
        self.groups: list[Group] = []
        self.lighthouse: HostedLighthouse | None = None
        self.stop: StopRequested | None = None
        self.left_reason = ""  # why the supervisor stopped the groups still running (too few could go on)
        self.fatal = ""  # why the job cannot go on at all (the hosted lighthouse is gone)
        self.outcome: Outcome | None = None  # the job's, once settled
        self.job_transitions = JsonLines(run_dir / "transitions.jsonl")
        self.reaper = Shepherd()  # the agent's: child subreaper from the start, kills what is left at the very end
        self._publish_due = asyncio.Event()

    async def run(self) -> ReplicaJob:
        """Start the lighthouse and every group, wait for them all, write the job's report."""
        job = ReplicaJob(self.spec.name, self.run_dir)
        hurry = asyncio.Event()
        signals.install(self.events, hurry, self.hurried, names=self.spec.shutdown.signals_to_handle)
        self.reaper.start()
        address = await self.start(job)
        if address is None:
            return await self.end_early(job)
        side = [asyncio.ensure_future(self.forward_stops(self.events)), asyncio.ensure_future(self.watch_steps()),
                asyncio.ensure_future(self.publish_loop())]
        if self.seat is not None and not self.seat.hosts_lighthouse and self.groups_spec.lighthouse.hosted:
            side.append(asyncio.ensure_future(self.follow_lighthouse(address)))
        tasks = {asyncio.ensure_future(self.drive(g)): g for g in self.groups}
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # a group's own error is the agent's error: it propagates
                self.enforce_minimum()
        finally:
            for task in side:
                task.cancel()
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*side, *tasks, return_exceptions=True)
            await self.leave()
            if self.metrics is not None:
                self.metrics.stop()
            self.job_transitions.close()
            self.reaper.close()
        self.settle(job)
        await self.publish()
        job.report_path = self.write_report(job)
        return job

    async def start(self, job: ReplicaJob) -> str | None:
        """Take this node's place (its groups, the lighthouse), make the groups, serve the metrics.

        The lighthouse's address; None when the job ends before any group starts (`job` then says why).
        """
        try:
            mine, address = await unless_stopped(self, self.take_place())
            self.groups = job.groups = [self.make_group(k, address) for k in mine]
            self.start_metrics(mine)
        except Stopped:
            assert self.stop is not None
            signum = self.stop.signum or signal.SIGTERM
            job.reason, job.outcome, job.exit_code = "stop requested", Outcome.STOPPED, EXIT_STOPPED_BASE + signum
            return None
        except RunnerError as e:
            job.reason, job.outcome, job.exit_code, job.fix = e.message, Outcome.ERROR, EXIT_INFRA, e.fix
        if job.outcome is Outcome.ERROR:
            self.log.error("replica_start_failed", error=job.reason, fix=job.fix)
            return None
        return address

    def start_metrics(self, groups: list[int]) -> None:
        """metrics.enabled: one endpoint for the groups this node runs (every series labelled with its group)."""
        if not self.spec.metrics.enabled:
            return
        from runner.observe.group_metrics import GroupMetrics

        self.metrics = GroupMetrics(self.spec, self.node, groups)
        self.metrics.ledgers = lambda: {g.index: g.ctx.recovery.figures() for g in self.groups}  # ETTR gauges
        self.metrics.start(lambda: self.lighthouse.restarts if self.lighthouse is not None else 0)

    async def take_place(self) -> tuple[list[int], str]:
        """The groups this node runs and the lighthouse's address.

        One node: every group, and the lighthouse is hosted here. Several (etcd): the seat the rendezvous gives this
        node names its one group; seat (0, 0) hosts the lighthouse and publishes its address, the others read it.
        """
        light = self.groups_spec.lighthouse
        if self.spec.rendezvous.backend == "local":
            return list(range(self.groups_spec.count)), await self.lighthouse_address()
        from runner.agent.group_seat import GroupSeat  # etcd's client only where used

        self.seat = GroupSeat(self.spec, self.node, self.log)
        await self.seat.open(self.reaper)
        k, _ = await self.seat.take()
        if not light.hosted:
            return [k], await self.lighthouse_address()
        if self.seat.hosts_lighthouse:
            address = await self.lighthouse_address(advertise=self.addr)
            await self.seat.publish_lighthouse(address)
            return [k], address
        return [k], await self.seat.wait_lighthouse()

    async def lighthouse_address(self, advertise: str | None = None) -> str:
        """The hosted lighthouse's address once it listens (reached at `advertise` by other nodes), or the spec's."""
        light = self.groups_spec.lighthouse
        if not light.hosted:
            assert light.address is not None  # the spec's checks require one
            return light.address.rstrip("/")
        program = lighthouse_program(os.environ)
        if program is None:
            raise LighthouseError("a hosted lighthouse needs `torchft_lighthouse`, not found",
                                  fix="pip install 'runner[ft]'")
        self.lighthouse = HostedLighthouse(program, light, self.groups_spec.min_active, self.run_dir, self.log,
                                           advertise=advertise)
        self.lighthouse.on_gone = self.lighthouse_gone
        await self.lighthouse.start()
        return self.lighthouse.address

    async def follow_lighthouse(self, address: str) -> None:
        """Several nodes: when the lighthouse's host was replaced, the group's next attempt uses the new address."""
        assert self.seat is not None
        while True:
            await asyncio.sleep(LIGHTHOUSE_POLL_S)
            try:
                latest = await self.seat.read_lighthouse()
            except RunnerError as e:  # etcd away for a while: the groups run on; the next poll tries again
                self.log.warning("lighthouse_address_unread", error=e.message)
                continue
            if latest is None or latest == address:
                continue
            address = latest
            self.log.warning("lighthouse_moved", address=address, detail="the next attempt of each group uses it")
            for g in self.groups:
                replica = g.ctx.inputs.replica
                assert replica is not None
                g.ctx.inputs = dataclasses.replace(g.ctx.inputs, replica=dataclasses.replace(replica,
                                                                                             lighthouse=address))

    async def end_early(self, job: ReplicaJob) -> ReplicaJob:
        """No group started (a stop while taking a seat, no lighthouse, etcd refused): leave, report, return."""
        await self.leave()
        self.reaper.close()
        job.report_path = self.write_report(job)
        return job

    async def leave(self) -> None:
        """Stop the hosted lighthouse (its host first waits for the other nodes to end) and free the seat."""
        if self.lighthouse is not None:
            if self.seat is not None:
                await self.linger()
            await self.lighthouse.stop()
        if self.seat is not None:
            await self.seat.close()

    async def linger(self) -> None:
        """The lighthouse's host: wait until no other node holds a seat (LINGER_S at most; not once hurried).

        The groups still finishing their last steps keep their quorum.
        """
        assert self.seat is not None
        deadline = time.monotonic() + LINGER_S
        while time.monotonic() < deadline and not any(g.ctx.hurry.is_set() for g in self.groups):
            try:
                others = await self.seat.others_seated()
            except RunnerError:
                return
            if not others:
                return
            self.log.info("lighthouse_waiting_for_nodes", nodes=others, at_most_s=round(deadline - time.monotonic()))
            await asyncio.sleep(LINGER_POLL_S)

    def make_group(self, k: int, lighthouse: str) -> Group:
        """Group k: its own spec view (the group's nproc_per_node), run dir, rendezvous, machine and context."""
        spec = dataclasses.replace(self.spec, nproc_per_node=self.groups_spec.nproc_per_node)
        folder = self.run_dir / f"group_{k}"
        try:
            private_dir(folder)
        except OSError as e:  # a full logs disk: the group runs, its writes fail soft
            soft_io.warn_once("group_dir_unwritable", folder, e)
        replica = Replica(k, self.groups_spec.count, lighthouse)
        rendezvous: Rendezvous
        if self.seat is None:
            node = f"{self.node}/g{k}"
            rendezvous = LocalRendezvous(node, spec.nproc_per_node, "127.0.0.1", None)
        else:  # the group's own rendezvous among its nodes_per_group nodes, under the job's keys
            from runner.agent.group_seat import group_keys
            from runner.rendezvous.etcd.backend import EtcdRendezvous

            node, size = self.node, self.groups_spec.nodes_per_group
            spec = dataclasses.replace(spec, nodes=Nodes(size, size))
            rendezvous = EtcdRendezvous(spec, node, advertise_addr=self.addr, log=self.log.bind(group=k),
                                        keys=group_keys(self.spec, k))
        inputs = JobInputs(spec, node, folder, self.started, self.identity, replica=replica)
        model, _ = build_machine(GUARDS)
        ctx = assemble(inputs, rendezvous, self.log.bind(group=k), lambda: model.state,
                       shepherd=Shepherd(agent=False))  # the supervisor's own is the subreaper
        return Group(ctx, model)

    async def drive(self, group: Group) -> None:
        """Run one group's machine to SHUTDOWN; its transitions go to its own file and to the job's."""
        sink = JsonLines(group.ctx.inputs.run_dir / "transitions.jsonl")
        metrics = self.metrics.group(group.index) if self.metrics is not None else None
        on_transition = TransitionLog(group.ctx, sink, metrics, job_sink=self.job_transitions,
                                      after=self._publish_due.set)
        try:
            await drive(group.model, HANDLERS, group.ctx, on_transition, settle)
        finally:
            self.update_step(group)  # its last report, made after the last poll
            sink.close()
            if group.ctx.run.standbys is not None:
                group.ctx.run.standbys.close()
            if group.ctx.run.group is not None:
                group.ctx.run.group.kill_all()  # normally a no-op: SHUTDOWN stopped them
            group.ctx.shepherd.close()

    def hurried(self, name: str) -> None:
        """A second stop signal: every group kills its workers now."""
        self.log.warning("stop_hurried", signal=name)
        for g in self.groups:
            g.ctx.hurry.set()

    async def forward_stops(self, events: asyncio.Queue[Event]) -> None:
        """Every stop request the signals make reaches every group."""
        while True:
            event = await events.get()
            if isinstance(event, StopRequested):
                self.stop = self.stop or event
                for g in self.groups:
                    g.ctx.events.put_nowait(event)

    def lighthouse_gone(self, reason: str) -> None:
        """The hosted lighthouse could not be restarted: no group can step any more, so every group stops (exit 3)."""
        self.fatal = reason
        for g in self.groups:
            g.ctx.events.put_nowait(StopRequested(signum=signal.SIGTERM, graceful=False))

    def enforce_minimum(self) -> None:
        """When fewer than min_active groups can still take part in a step, stop the others: none could go on."""
        live = [g for g in self.groups if g.model.state is not JobState.SHUTDOWN]
        left = [g for g in self.groups if g.model.state is JobState.SHUTDOWN and g.ctx.outcome is not Outcome.SUCCEEDED]
        if not live or not left or len(live) >= self.groups_spec.min_active or self.stop is not None:
            return
        if not self.left_reason:
            gone = ", ".join(str(g.index) for g in left)
            self.left_reason = (f"only {len(live)} group(s) can go on, fewer than min_active "
                                f"{self.groups_spec.min_active} (group(s) {gone} left with their budget spent)")
            self.log.error("replica_minimum_lost", reason=self.left_reason)
        for g in live:
            g.ctx.events.put_nowait(StopRequested(signum=signal.SIGTERM, graceful=False))

    def settle(self, job: ReplicaJob) -> None:
        """The job's outcome from the groups': it succeeds when at least min_active groups finished."""
        done = [g for g in self.groups if g.ctx.outcome is Outcome.SUCCEEDED]
        if self.fatal and len(done) < len(self.groups):
            job.outcome, job.exit_code, job.reason = Outcome.ERROR, EXIT_INFRA, self.fatal
            job.fix = f"see {self.run_dir / 'lighthouse.log'}"
        elif self.stop is not None and not self.stop.graceful:
            job.outcome, job.exit_code = Outcome.STOPPED, EXIT_STOPPED_BASE + (self.stop.signum or signal.SIGTERM)
            job.reason = f"stop requested (signal {self.stop.signum})"
        elif len(done) >= self.groups_spec.min_active:
            job.outcome, job.exit_code = Outcome.SUCCEEDED, EXIT_OK
            left = len(self.groups) - len(done)
            job.reason = f"{len(done)} of {len(self.groups)} group(s) finished" + (
                f"; {left} left after their budget was spent" if left else "")
        else:
            codes = [g.ctx.exit_code for g in self.groups if g.ctx.outcome in (Outcome.FAILED, Outcome.ERROR)]
            job.outcome = Outcome.ERROR if EXIT_INFRA in codes else Outcome.FAILED
            job.exit_code = EXIT_INFRA if EXIT_INFRA in codes else EXIT_WORKERS_FAILED
            job.reason = self.left_reason or (f"{len(done)} group(s) finished, fewer than min_active "
                                              f"{self.groups_spec.min_active}")
        self.outcome = job.outcome
        self.log.info("replica_job_ended", outcome=job.outcome.value, exit_code=job.exit_code, reason=job.reason)

    async def watch_steps(self) -> None:
        """Read each group's committed step from its rank 0's heartbeat file (what the worker wrote, never guessed)."""
        while True:
            for g in self.groups:
                self.update_step(g)
            await asyncio.sleep(STEP_POLL_S)

    def update_step(self, g: Group) -> None:
        """Keep the group's step, and the time it changed, when its rank 0 reported a new one."""
        step = read_step(g.ctx)
        if step is not None and step != g.step:
            g.step = step
            if self.metrics is not None:
                self.metrics.on_step(g.index, step)
            g.steps.append((round(time.time(), 3), step))
            if len(g.steps) > MAX_STEP_SAMPLES:
                del g.steps[1::2]  # keep the timeline's shape at half the resolution
            self._publish_due.set()

    async def publish_loop(self) -> None:
        """Write the job's status.json whenever a group moved or stepped (at most every STEP_POLL_S)."""
        while True:
            await self._publish_due.wait()
            self._publish_due.clear()
            await self.publish()
            await asyncio.sleep(STEP_POLL_S)

    async def publish(self) -> None:
        """<run dir>/status.json: the job's state and each group's (a failure there is a warning)."""
        status = self.status()
        try:
            write_private(self.run_dir / "status.json", json.dumps(status, indent=2))
        except OSError as e:
            soft_io.warn_once("status_write_failed", self.run_dir / "status.json", e)

    def status(self) -> dict[str, object]:
        """The job's live state: SHUTDOWN once every group is; RUNNING while one runs; else the first group's."""
        states = [g.model.state for g in self.groups]
        if states and all(s is JobState.SHUTDOWN for s in states):
            state = JobState.SHUTDOWN
        elif JobState.RUNNING in states:
            state = JobState.RUNNING
        else:
            state = states[0] if states else JobState.INIT
        return {
            "node": self.node, **self.identity, "state": state.value, "run_id": self.spec.name,
            "run_dir": str(self.run_dir), "heartbeat": time.time(),
            "attempt": max((g.ctx.run.attempt for g in self.groups), default=0),
            "restarts": sum(g.ctx.run.restarts for g in self.groups),
            "workers": [],
            "outcome": self.outcome.value if self.outcome is not None else None,
            "groups": [g.status() for g in self.groups],
            "ledger": job_ledger([dict(g.ctx.recovery.figures(), group=g.index) for g in self.groups]),
            "lighthouse": self.lighthouse_status(),
        }

    def lighthouse_status(self) -> dict[str, object]:
        """Where the lighthouse is, and how often the hosted one was restarted."""
        if self.lighthouse is None:
            return {"hosted": False, "address": self.groups_spec.lighthouse.address}
        return {"hosted": True, "address": self.lighthouse.address, "pid": self.lighthouse.pid,
                "restarts": self.lighthouse.restarts}

    def write_report(self, job: ReplicaJob) -> Path | None:
        """<run dir>/report.json: the job's outcome and every group's own report, with its committed steps."""
        groups = []
        for g in self.groups:
            entry = group_report(g.ctx)
            entry.update(group=g.index, step=g.step, steps=g.steps)
            groups.append(entry)
        data = {
            "job": self.spec.name, "node": self.node, "outcome": job.outcome.value, "exit_code": job.exit_code,
            "reason": job.reason, "duration_s": round(time.monotonic() - self.started, 3),
            "attempts": sum(g.ctx.run.attempt + 1 for g in self.groups),
            "restarts": sum(g.ctx.run.restarts for g in self.groups),
            "failures": [f.to_dict() | {"group": g.index} for g in self.groups for f in g.ctx.run.failures],
            "replica_groups": {"count": self.groups_spec.count, "min_active": self.groups_spec.min_active,
                               "nproc_per_node": self.groups_spec.nproc_per_node,
                               "lighthouse": self.lighthouse_status()},
            "groups": groups, "run_dir": str(self.run_dir),
            "warnings": sorted({w for g in self.groups for w in g.ctx.warnings.seen} | set(soft_io.failures())),
            "ledger": job_ledger([e["ledger"] | {"group": e["group"]} for e in groups]),  # docs/goodput.md
        }
        warned: set[str] = set()

        def warn(event: str, **fields: object) -> None:
            if event not in warned:
                warned.add(event)
                self.log.warning(event, **fields)

        return place_report(json.dumps(data, indent=2, default=str), self.run_dir,
                            f"{self.spec.name}-{self.run_dir.name}", warn, self.log)


def read_step(ctx: Context) -> int | None:
    """The step rank 0 of the group's current attempt last committed: `{"step": N}` in its heartbeat file."""
    plan = ctx.run.plan
    if plan is None or not plan.workers:
        return None
    try:
        with open(plan.workers[0].heartbeat_file, "rb") as f:
            raw = f.read(MAX_STEP_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_STEP_BYTES:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    step = value.get("step") if isinstance(value, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None
