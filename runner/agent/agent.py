"""The agent: runs one job on a node (one group of workers, or replica groups under their supervisor)."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from runner.agent.assembly import assemble_run
from runner.agent.backends import make_rendezvous
from runner.agent.result import JobResult, of_group
from runner.config.spec import JobSpec
from runner.core.context import JobInputs
from runner.observe.logs import RUN_LOG
from runner.rundir.layout import LATEST, RunDir, job_dir, run_name
from runner.runs import index as runs_index
from runner.runs.control import agent_identity
from runner.system import soft_io
from runner.system.private_files import private_dir
from runner.system.thread_signals import SignalFreeExecutor
from runner.system.title import set_title

if TYPE_CHECKING:
    from runner.agent.replica_group import ReplicaJob


def default_node_id() -> str:
    """This node's id when none is given: SLURM_NODEID, a pod ordinal (JOB_COMPLETION_INDEX), else the hostname."""
    for var in ("RUNNER_NODE", "SLURM_NODEID", "JOB_COMPLETION_INDEX"):
        if os.environ.get(var):
            return f"node{os.environ[var]}" if os.environ[var].isdigit() else os.environ[var]
    return socket.gethostname()


def new_run_dir(spec: JobSpec) -> Path:
    """<logs.dir>/<job>/<UTC time>-<random>: a new folder every run, so no earlier run's logs are overwritten."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base = job_dir(spec.logs.dir, spec.name)
    run_dir = base / run_name(stamp, os.urandom(3).hex())
    try:
        private_dir(run_dir)  # 0700: the run's files are the user's own (docs/secrets.md)
    except OSError as e:  # the disk lost its last inode since the CLI chose logs.dir: every write fails soft
        soft_io.warn_once("run_dir_unwritable", run_dir, e)
    latest = RunDir.latest(spec.logs.dir, spec.name).root
    try:
        tmp = base / f".{LATEST}-{os.urandom(3).hex()}"
        tmp.symlink_to(run_dir.name)
        tmp.replace(latest)
    except OSError:
        pass  # a convenience only
    return run_dir


async def run(spec: JobSpec, node: str | None = None, advertise_addr: str | None = None) -> JobResult:
    """Run the job on this node until it ended: its outcome, exit code and summary (one group, or many).

    A job with replica groups runs each group's machine under a supervisor (runner/agent/replicas.py).
    """
    # Before any thread exists: asyncio.to_thread's threads never take a stop signal (runner/system/thread_signals.py)
    asyncio.get_running_loop().set_default_executor(SignalFreeExecutor(thread_name_prefix="runner"))
    node_named = node is not None or bool(os.environ.get("RUNNER_NODE"))
    node = node or default_node_id()
    set_title(f"runner: agent job {spec.name}")
    structlog.contextvars.bind_contextvars(job=spec.name, node=node)
    log: structlog.typing.FilteringBoundLogger = structlog.get_logger("runner")
    run_dir = new_run_dir(spec)
    RUN_LOG.open(RunDir(run_dir).agent_log)
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
    inputs = JobInputs(spec, node, run_dir, time.monotonic(), agent_identity())
    rdzv = make_rendezvous(spec, node, addr, run_dir=run_dir, node_named=node_named)
    one = assemble_run(inputs, rdzv, log, metrics=metrics,
                       observe=metrics.on_recovery if metrics is not None else None)  # runner_time_to_recover_seconds
    ctx = one.ctx
    try:
        if metrics is not None:
            metrics.ledger = ctx.recovery.figures  # runner_ettr, runner_lost_seconds
            metrics.start()
        await one.drive()
    finally:
        if metrics is not None:
            metrics.stop()
        runs_index.record_end(node, run_dir, str(ctx.outcome or "stopped"), ctx.exit_code, ctx.run.attempt + 1,
                              ctx.run.restarts, log)
        RUN_LOG.close()
    return of_group(ctx)


async def run_replica_groups(spec: JobSpec, node: str, run_dir: Path,
                             log: structlog.typing.FilteringBoundLogger, addr: str) -> JobResult:
    """The replica groups' supervisor, with the run's own bookkeeping around it (the runs index, agent.jsonl)."""
    from runner.agent.replicas import Supervisor

    job: ReplicaJob | None = None
    try:
        job = await Supervisor(spec, node, run_dir, log, agent_identity(), addr).run()
        return job.result()
    finally:
        outcome, code = (job.outcome.value, job.exit_code) if job is not None else ("error", 3)
        attempts = sum(g.ctx.run.attempt + 1 for g in job.groups) if job is not None else 0
        restarts = sum(g.ctx.run.restarts for g in job.groups) if job is not None else 0
        runs_index.record_end(node, run_dir, outcome, code, attempts, restarts, log)
        RUN_LOG.close()
