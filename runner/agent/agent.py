"""The agent: assembles a Context (inputs and services), the state machine and the handlers; runs one job on a node."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import structlog

from runner.agent.backends import make_rendezvous
from runner.agent.services import GroupLauncher, Publisher, RecoveryTimer, node_status
from runner.config.spec import JobSpec
from runner.core.context import Context, JobInputs, Warnings
from runner.core.machine import Edge, JobState, Step, build_machine, drive
from runner.core.restart_policy import GUARDS, settle
from runner.events import GuardLost
from runner.observe.logs import RUN_LOG, JsonLines
from runner.observe.recovery import Recoveries
from runner.outcomes import Outcome
from runner.runs import index as runs_index
from runner.runs.control import agent_identity
from runner.states import HANDLERS
from runner.system import soft_io
from runner.system.private_files import private_dir
from runner.system.shepherd import Shepherd

if TYPE_CHECKING:
    from runner.agent.replicas import ReplicaJob
    from runner.events import Event
    from runner.rendezvous.base import Rendezvous


def default_node_id() -> str:
    """This node's id when none is given: SLURM_NODEID, a pod ordinal (JOB_COMPLETION_INDEX), else the hostname."""
    for var in ("RUNNER_NODE", "SLURM_NODEID", "JOB_COMPLETION_INDEX"):
        if os.environ.get(var):
            return f"node{os.environ[var]}" if os.environ[var].isdigit() else os.environ[var]
    return socket.gethostname()


def new_run_dir(spec: JobSpec) -> Path:
    """<logs.dir>/<job>/<UTC time>-<random>: a new folder every run, so no earlier run's logs are overwritten."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base = Path(spec.logs.dir).expanduser().absolute() / spec.name
    run_dir = base / f"{stamp}-{os.urandom(3).hex()}"
    try:
        private_dir(run_dir)  # 0700: the run's files are the user's own (docs/secrets.md)
    except OSError as e:  # the disk lost its last inode since the CLI chose logs.dir: every write fails soft
        soft_io.warn_once("run_dir_unwritable", run_dir, e)
    latest = base / "latest"
    try:
        tmp = base / f".latest-{os.urandom(3).hex()}"
        tmp.symlink_to(run_dir.name)
        tmp.replace(latest)
    except OSError:
        pass  # a convenience only
    return run_dir


async def run(spec: JobSpec, node: str | None = None, advertise_addr: str | None = None) -> Context | ReplicaJob:
    """Run the job on this node until SHUTDOWN; the returned context holds outcome, exit code and failures.

    A job with replica groups runs each group's machine under a supervisor (runner/agent/replicas.py).
    """
    node = node or default_node_id()
    structlog.contextvars.bind_contextvars(job=spec.name, node=node)
    log: structlog.typing.FilteringBoundLogger = structlog.get_logger("runner")
    run_dir = new_run_dir(spec)
    RUN_LOG.open(run_dir / "agent.jsonl")
    runs_index.announce(spec, node, run_dir, log)  # the console's header; this run in `runner runs`
    addr = advertise_addr or spec.rendezvous.master_addr
    if addr is None:
        addr = "127.0.0.1" if spec.rendezvous.backend == "local" else socket.getfqdn()
    if spec.replica_groups is not None:
        return await run_replica_groups(spec, node, run_dir, log, addr)
    metrics = None
    if spec.metrics.enabled:
        from runner.observe.metrics import AgentMetrics

        metrics = AgentMetrics(spec, node)
    model, _ = build_machine(GUARDS)
    inputs = JobInputs(spec, node, run_dir, time.monotonic(), agent_identity())
    ctx = assemble(inputs, make_rendezvous(spec, node, addr, run_dir=run_dir), log, lambda: model.state,
                   observe=metrics.on_recovery if metrics is not None else None)  # runner_time_to_recover_seconds
    transitions = JsonLines(run_dir / "transitions.jsonl")
    on_transition = TransitionLog(ctx, transitions, metrics)
    try:
        if metrics is not None:
            metrics.ledger = ctx.recovery.figures  # runner_ettr, runner_lost_seconds
            metrics.start()
        await drive(model, HANDLERS, ctx, on_transition, settle)
    finally:
        if metrics is not None:
            metrics.stop()
        transitions.close()
        runs_index.record_end(node, run_dir, str(ctx.outcome or "stopped"), ctx.exit_code, ctx.run.attempt + 1,
                              ctx.run.restarts, log)
        RUN_LOG.close()
        if ctx.run.standbys is not None:
            ctx.run.standbys.close()  # normally a no-op: SHUTDOWN closed it
        if ctx.run.group is not None:
            ctx.run.group.kill_all()  # normally a no-op: SHUTDOWN stopped them; not so if the agent itself failed
        ctx.shepherd.close()
    return ctx


def assemble(inputs: JobInputs, rendezvous: Rendezvous, log: structlog.typing.FilteringBoundLogger,
             state: Callable[[], JobState], *, observe: Callable[[str, float], None] | None = None,
             shepherd: Shepherd | None = None) -> Context:
    """The context of one run: its inputs and the services the handlers call, wired to one event queue and guard.

    `shepherd`: the run's guard; by default the agent's own (the child subreaper, which kills orphans at close).
    A replica group gets one of its own that is not (the supervisor's is, and closes last).
    """
    events: asyncio.Queue[Event] = asyncio.Queue()
    shepherd = shepherd or Shepherd()
    shepherd.on_lost = lambda why: events.put_nowait(GuardLost(why))
    warnings = Warnings(log)
    ctx: Context | None = None  # the status snapshot and the watchdog are read through it once it exists

    def snapshot(now: JobState) -> dict[str, object]:
        assert ctx is not None
        return node_status(ctx, now)

    publisher = Publisher(inputs.run_dir, rendezvous, warnings, state, snapshot)
    recovery = RecoveryTimer(Recoveries(launched_at=inputs.started, observe=observe), publisher,
                             lambda: ctx.timer if ctx is not None else None, log, JobState.RUNNING)
    launcher = GroupLauncher(inputs.spec, events, shepherd, log)
    ctx = Context(inputs=inputs, rendezvous=rendezvous, log=log, launcher=launcher, status=publisher,
                  recovery=recovery, warnings=warnings, events=events, shepherd=shepherd)
    return ctx


async def run_replica_groups(spec: JobSpec, node: str, run_dir: Path,
                             log: structlog.typing.FilteringBoundLogger, addr: str) -> ReplicaJob:
    """The replica groups' supervisor, with the run's own bookkeeping around it (the runs index, agent.jsonl)."""
    from runner.agent.replicas import Supervisor

    job: ReplicaJob | None = None
    try:
        job = await Supervisor(spec, node, run_dir, log, agent_identity(), addr).run()
        return job
    finally:
        outcome, code = (job.outcome.value, job.exit_code) if job is not None else ("error", 3)
        attempts = sum(g.ctx.run.attempt + 1 for g in job.groups) if job is not None else 0
        restarts = sum(g.ctx.run.restarts for g in job.groups) if job is not None else 0
        runs_index.record_end(node, run_dir, outcome, code, attempts, restarts, log)
        RUN_LOG.close()


class TransitionMetrics(Protocol):
    """What TransitionLog tells the metrics (AgentMetrics, or one replica group's view of GroupMetrics)."""

    def on_transition(self, src: str, dst: str, trigger: str, attempt: int, restarts: int) -> None:
        """One state change."""

    def on_failure(self, failure_class: str) -> None:
        """One failed attempt, once classed."""


class TransitionLog:
    """After every state change, the one place its effects happen.

    One `transition` event (console, agent.jsonl, transitions.jsonl), the metrics, the step's outcome on the
    context, and the new state published (SHUTDOWN publishes once its work is done).
    """

    def __init__(self, ctx: Context, sink: JsonLines, metrics: TransitionMetrics | None, *,
                 job_sink: JsonLines | None = None, after: Callable[[], None] | None = None) -> None:
        """`job_sink`: a replica group's transitions also go to the job's file; `after`: told of every one."""
        self.ctx, self.sink, self.metrics = ctx, sink, metrics
        self.job_sink, self.after = job_sink, after

    async def __call__(self, src: JobState, dst: JobState, edge: Edge, step: Step) -> None:
        """Record the transition `src --edge--> dst` that `step` caused."""
        ctx, run = self.ctx, self.ctx.run
        if step.outcome is not None:
            ctx.outcome = step.outcome
        if step.exit_code is not None:
            ctx.exit_code = step.exit_code
        if self.metrics is not None:
            self.metrics.on_transition(src.value, dst.value, edge.trigger.value, run.attempt, run.restarts)
        self.time_recovery(src, dst, edge)
        event = self.event(src, dst, edge, step)
        for sink in (self.sink, self.job_sink):
            try:
                if sink is not None:
                    sink.write(event)
            except OSError as e:
                ctx.warnings.warn("transition_write_failed", error=str(e))
        ctx.log.info("transition", **{k: v for k, v in event.items() if k not in ("event", "job", "node")})
        if dst is not JobState.SHUTDOWN:
            await ctx.status.publish()
        if self.after is not None:
            self.after()

    def time_recovery(self, src: JobState, dst: JobState, edge: Edge) -> None:
        """A failure (or membership change) starts a recovery; FAILED's end classes it (and counts it)."""
        ctx, run = self.ctx, self.ctx.run
        ctx.recovery.state_changed(src, dst)  # the ETTR ledger's marks (docs/goodput.md)
        if dst is JobState.FAILED or (src is JobState.RUNNING and dst is JobState.RESTARTING):
            ctx.recovery.attempt_failed(edge.trigger.value, run.failure)  # a recovery starts if the policy restarts
        elif src is JobState.FAILED and run.failure is not None:
            ctx.recovery.failure_classed(run.failure)
            if self.metrics is not None:  # classed by now (OOM evidence and all)
                self.metrics.on_failure(run.failure.failure_class.value)

    def event(self, src: JobState, dst: JobState, edge: Edge, step: Step) -> dict[str, object]:
        """The one `transition` event (a replica group's names its group; SHUTDOWN's carries the outcome)."""
        ctx = self.ctx
        event: dict[str, object] = {
            "event": "transition",
            "src": src.value,
            "dst": dst.value,
            "trigger": edge.trigger.value,
            "reason": step.reason,
            "attempt": ctx.run.attempt,
            "job": ctx.spec.name,
            "node": ctx.inputs.node,
            "time": time.time(),
        }
        if ctx.inputs.replica is not None:
            event["group"] = ctx.inputs.replica.group
        if dst is JobState.SHUTDOWN:
            event["outcome"] = (ctx.outcome or Outcome.STOPPED).value
        return event
