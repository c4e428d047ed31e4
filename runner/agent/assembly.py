"""One run's wiring, for a job of one group and for each replica group alike.

`assemble` builds a run's context (inputs, services, one event queue, a guard, a stop scope); `TransitionLog`
records what every transition of its machine does; `assemble_run` puts a machine, its context and its transition
log together, and `Run.drive` runs the machine to SHUTDOWN and tears down what is left (standbys, workers, guard):
the one teardown of a run, whichever way it ended.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from runner.agent.services import GroupLauncher, Publisher, RecoveryTimer, node_status
from runner.core.context import Context, JobInputs
from runner.core.group_state import GroupState
from runner.core.machine import Edge, Model, Step, build_machine, drive
from runner.core.restart_policy import GUARDS, settle
from runner.events import GuardLost
from runner.observe.logs import JsonLines
from runner.observe.recovery import Recoveries
from runner.outcomes import Outcome
from runner.rundir.layout import RunDir
from runner.states import HANDLERS
from runner.system.shepherd import Shepherd
from runner.system.soft_io import WarnOnce

if TYPE_CHECKING:
    import structlog

    from runner.events import Event
    from runner.rendezvous.base import Rendezvous
    from runner.system.stop_scope import StopScope


def assemble(inputs: JobInputs, rendezvous: Rendezvous, log: structlog.typing.FilteringBoundLogger,
             state: Callable[[], GroupState], *, observe: Callable[[str, float], None] | None = None,
             shepherd: Shepherd | None = None, outer_stops: StopScope | None = None) -> Context:
    """The context of one run: its inputs and the services the handlers call, wired to one event queue and guard.

    `shepherd`: the run's guard; by default the agent's own (the child subreaper, which kills orphans at close).
    A replica group gets one of its own that is not (the supervisor's is, and closes last).
    `outer_stops`: a replica group's: the job's stop scope, which holds the group's (a stop reaches the group with
    its cause).
    """
    events: asyncio.Queue[Event] = asyncio.Queue()
    shepherd = shepherd or Shepherd()
    shepherd.on_lost = lambda why: events.put_nowait(GuardLost(why))
    warnings = WarnOnce(log)
    ctx: Context | None = None  # the status snapshot and the watchdog are read through it once it exists

    def snapshot(now: GroupState) -> dict[str, object]:
        assert ctx is not None
        return node_status(ctx, now)

    publisher = Publisher(inputs.run_dir, rendezvous, warnings, state, snapshot,
                          every=inputs.spec.rendezvous.status_interval)
    recovery = RecoveryTimer(Recoveries(launched_at=inputs.started, observe=observe), publisher,
                             lambda: ctx.timer if ctx is not None else None, log, GroupState.RUNNING)
    launcher = GroupLauncher(inputs.spec, events, shepherd, log)
    ctx = Context(inputs=inputs, rendezvous=rendezvous, log=log, launcher=launcher, status=publisher,
                  recovery=recovery, warnings=warnings, events=events, shepherd=shepherd,
                  outer_stops=outer_stops)
    return ctx


@dataclass
class Run:
    """One run, assembled: its machine, its context, and what records its transitions."""

    model: Model
    ctx: Context
    record: TransitionLog

    async def drive(self) -> None:
        """Run the machine to SHUTDOWN, then tear down what is left of the run, however it ended.

        Normally a no-op: SHUTDOWN closed the standbys, stopped the workers and closed the guard; not so if the
        agent itself failed (an exception out of a handler) or the run was cancelled.
        """
        ctx = self.ctx
        refresh = asyncio.get_running_loop().create_task(ctx.status.refresh_loop(), name="status-refresh")
        try:
            await drive(self.model, HANDLERS, ctx, self.record, settle)
        finally:
            refresh.cancel()
            self.record.sink.close()
            if ctx.run.standbys is not None:
                ctx.run.standbys.close()
            if ctx.run.group is not None:
                ctx.run.group.kill_all()
            ctx.shepherd.close()


def assemble_run(inputs: JobInputs, rendezvous: Rendezvous, log: structlog.typing.FilteringBoundLogger, *,
                 metrics: TransitionMetrics | None = None, observe: Callable[[str, float], None] | None = None,
                 shepherd: Shepherd | None = None, outer_stops: StopScope | None = None,
                 job_sink: JsonLines | None = None, after: Callable[[], None] | None = None) -> Run:
    """A run of the agent's machine (a job of one group, or one replica group): machine, context, transition log.

    Its transitions go to <its run dir>/transitions.jsonl (and a replica group's to the job's `job_sink` too).
    """
    model, _ = build_machine(GUARDS)
    ctx = assemble(inputs, rendezvous, log, lambda: model.state, observe=observe, shepherd=shepherd,
                   outer_stops=outer_stops)
    record = TransitionLog(ctx, JsonLines(RunDir(inputs.run_dir).transitions), metrics, job_sink=job_sink,
                           after=after)
    return Run(model, ctx, record)


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

    async def __call__(self, src: GroupState, dst: GroupState, edge: Edge, step: Step) -> None:
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
        if dst is not GroupState.SHUTDOWN:
            await ctx.status.publish()
        if self.after is not None:
            self.after()

    def time_recovery(self, src: GroupState, dst: GroupState, edge: Edge) -> None:
        """A failure (or membership change) starts a recovery; FAILED's end classes it (and counts it)."""
        ctx, run = self.ctx, self.ctx.run
        ctx.recovery.state_changed(src, dst)  # the ETTR ledger's marks (docs/goodput.md)
        if dst is GroupState.FAILED or (src is GroupState.RUNNING and dst is GroupState.RESTARTING):
            ctx.recovery.attempt_failed(edge.trigger.value, run.failure)  # a recovery starts if the policy restarts
        elif src is GroupState.FAILED and run.failure is not None:
            ctx.recovery.failure_classed(run.failure)
            if self.metrics is not None:  # classed by now (OOM evidence and all)
                self.metrics.on_failure(run.failure.failure_class.value)

    def event(self, src: GroupState, dst: GroupState, edge: Edge, step: Step) -> dict[str, object]:
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
        if dst is GroupState.SHUTDOWN:
            event["outcome"] = (ctx.outcome or Outcome.STOPPED).value
        return event
