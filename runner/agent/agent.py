"""The agent: wires a Context, the state machine and the state handlers, and runs one job on this node."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from runner.agent.backends import make_rendezvous
from runner.config.spec import JobSpec
from runner.core.context import Context
from runner.core.machine import Edge, JobState, Step, build_machine, drive
from runner.core.restart_policy import GUARDS, settle
from runner.events import GuardLost
from runner.observe.logs import RUN_LOG, JsonLines
from runner.outcomes import Outcome
from runner.runs import index as runs_index
from runner.states import HANDLERS
from runner.system.private_files import private_dir

if TYPE_CHECKING:
    from runner.observe.metrics import AgentMetrics


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
    private_dir(run_dir)  # 0700: the run's files are the user's own (docs/secrets.md)
    latest = base / "latest"
    try:
        tmp = base / f".latest-{os.urandom(3).hex()}"
        tmp.symlink_to(run_dir.name)
        tmp.replace(latest)
    except OSError:
        pass  # a convenience only
    return run_dir


async def run(spec: JobSpec, node: str | None = None, advertise_addr: str | None = None) -> Context:
    """Run the job on this node until SHUTDOWN; the returned context holds outcome, exit code and failures."""
    node = node or default_node_id()
    structlog.contextvars.bind_contextvars(job=spec.name, node=node)
    log: structlog.typing.FilteringBoundLogger = structlog.get_logger("runner")
    run_dir = new_run_dir(spec)
    RUN_LOG.open(run_dir / "agent.jsonl")
    runs_index.announce(spec, node, run_dir, log)  # the console's header; this run in `runner runs`
    addr = advertise_addr or spec.rendezvous.master_addr
    if addr is None:
        addr = "127.0.0.1" if spec.rendezvous.backend == "local" else socket.getfqdn()
    ctx = Context(
        spec=spec,
        node=node,
        run_dir=run_dir,
        rendezvous=make_rendezvous(spec, node, addr, run_dir=run_dir),
        log=log,
    )
    ctx.shepherd.on_lost = lambda why: ctx.events.put_nowait(GuardLost(why))
    transitions = JsonLines(run_dir / "transitions.jsonl")
    metrics = None
    if spec.metrics.enabled:
        from runner.observe.metrics import AgentMetrics

        metrics = AgentMetrics(spec, node)
        ctx.recoveries.observe = metrics.on_recovery  # runner_time_to_recover_seconds
    on_transition = TransitionLog(ctx, transitions, metrics)
    model, _ = build_machine(GUARDS)
    try:
        if metrics is not None:
            metrics.start()
        await drive(model, HANDLERS, ctx, on_transition, settle)
    finally:
        if metrics is not None:
            metrics.stop()
        transitions.close()
        runs_index.record_end(ctx)
        RUN_LOG.close()
        if ctx.standbys is not None:
            ctx.standbys.close()  # normally a no-op: SHUTDOWN closed it
        if ctx.group is not None:
            ctx.group.kill_all()  # normally a no-op: SHUTDOWN stopped them; not so if the agent itself failed
        ctx.shepherd.close()
    return ctx


class TransitionLog:
    """After every state change, the one place its effects happen.

    One `transition` event (console, agent.jsonl, transitions.jsonl), the metrics, the step's outcome on the
    context, and the new state published (SHUTDOWN publishes once its work is done).
    """

    def __init__(self, ctx: Context, sink: JsonLines, metrics: AgentMetrics | None) -> None:
        self.ctx, self.sink, self.metrics = ctx, sink, metrics

    async def __call__(self, src: JobState, dst: JobState, edge: Edge, step: Step) -> None:
        """Record the transition `src --edge--> dst` that `step` caused."""
        ctx = self.ctx
        ctx.state = dst
        if step.outcome is not None:
            ctx.outcome = step.outcome
        if step.exit_code is not None:
            ctx.exit_code = step.exit_code
        if self.metrics is not None:
            self.metrics.on_transition(src.value, dst.value, edge.trigger.value, ctx.attempt, ctx.restarts)
        if dst is JobState.FAILED or (src is JobState.RUNNING and dst is JobState.RESTARTING):
            ctx.attempt_failed(edge.trigger.value)  # a recovery starts here if the policy restarts
        elif src is JobState.FAILED:
            ctx.failure_classed()
            if self.metrics is not None and ctx.failure is not None:  # classed by now (OOM evidence and all)
                self.metrics.on_failure(ctx.failure.failure_class.value)
        event: dict[str, object] = {
            "event": "transition",
            "src": src.value,
            "dst": dst.value,
            "trigger": edge.trigger.value,
            "reason": step.reason,
            "attempt": ctx.attempt,
            "job": ctx.spec.name,
            "node": ctx.node,
            "time": time.time(),
        }
        if dst is JobState.SHUTDOWN:
            event["outcome"] = (ctx.outcome or Outcome.STOPPED).value
        try:
            self.sink.write(event)
        except OSError as e:
            ctx.warn("transition_write_failed", error=str(e))
        ctx.log.info("transition", **{k: v for k, v in event.items() if k not in ("event", "job", "node")})
        if dst is not JobState.SHUTDOWN:
            await ctx.publish()
