"""The agent: wires a Context, the state machine and the state handlers, and runs one job on this node."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import structlog

from runner import runs_index
from runner.config.spec import JobSpec
from runner.context import Context
from runner.logs import RUN_LOG, JsonLines
from runner.machine import JobState, Trigger, build_machine, drive
from runner.private_files import private_dir
from runner.rendezvous import make_rendezvous
from runner.states import HANDLERS


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
    log = structlog.get_logger("runner")
    run_dir = new_run_dir(spec)
    RUN_LOG.open(run_dir / "agent.jsonl")
    runs_index.announce(spec, node, run_dir, log)  # the console's header; this run in `runner runs`
    addr = advertise_addr or spec.rendezvous.master_addr
    if addr is None:
        addr = "127.0.0.1" if spec.rendezvous.backend == "local" else socket.getfqdn()
    ctx = Context(
        spec=spec,
        node=node,
        run_id=spec.name,
        run_dir=run_dir,
        rendezvous=make_rendezvous(spec, node, addr),
        log=log,
        transitions=JsonLines(run_dir / "transitions.jsonl"),
    )

    metrics = None
    if spec.metrics.enabled:
        from runner.metrics import AgentMetrics

        metrics = AgentMetrics(spec, node)

    def on_transition(src: JobState, dst: JobState, trigger: Trigger) -> None:
        ctx.state_name = dst.value
        if metrics is not None:
            metrics.on_transition(src.value, dst.value, trigger.value, ctx.attempt, ctx.restarts)
        event = {
            "event": "transition",
            "src": src.value,
            "dst": dst.value,
            "trigger": trigger.value,
            "reason": ctx.reason,
            "attempt": ctx.attempt,
            "job": spec.name,
            "node": node,
            "time": time.time(),
        }
        if dst is JobState.SHUTDOWN:
            event["outcome"] = ctx.outcome or "stopped"
        ctx.transitions.write(event)
        fields = {k: v for k, v in event.items() if k not in ("event", "job", "node")}
        log.info("transition", **fields)
        ctx.reason = ""

    async def entered(state: JobState) -> None:
        if state is not JobState.SHUTDOWN:  # SHUTDOWN publishes once its work is done
            await ctx.publish()

    model, _ = build_machine(on_transition)
    try:
        if metrics is not None:
            metrics.start()
        await drive(model, HANDLERS, ctx, entered)
    finally:
        if metrics is not None:
            metrics.stop()
        ctx.transitions.close()
        runs_index.record_end(ctx)
        RUN_LOG.close()
        if ctx.group is not None:
            ctx.group.kill_all()  # normally a no-op: SHUTDOWN stopped them; not so if the agent itself failed
        ctx.shepherd.close()
    return ctx
