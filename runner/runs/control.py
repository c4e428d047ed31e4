"""`runner status` and `runner stop`: read a job's live state and ask its agents to stop, for either backend."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from runner.config.spec import JobSpec
from runner.errors import RunnerError
from runner.rundir.layout import AGENT_FILES, RunDir, ledger_path
from runner.system import procs
from runner.system.signals import GRACEFUL_SIGNAL


def local_status_path(spec: JobSpec) -> Path:
    """status.json of the job's latest run on this machine."""
    return RunDir.latest(spec.logs.dir, spec.name).status


def read_status(spec: JobSpec) -> dict[str, Any]:
    """The job's state as a dict: job, status, and each node with its state, attempt, heartbeat and workers."""
    if spec.rendezvous.backend == "etcd":
        from runner.rendezvous.etcd.admin import read_status as etcd_status

        return asyncio.run(etcd_status(spec))
    path = local_status_path(spec)
    try:
        node = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise RunnerError(
            f"no status for job '{spec.name}' at {path}", fix="run the job first (or check logs.dir)"
        ) from e
    if not isinstance(node, dict):
        raise RunnerError(f"unreadable status at {path}", fix="the run dir was damaged")
    running = node.get("state") != "SHUTDOWN" and is_agent(node)
    status = "running" if running else (node.get("outcome") or "unknown (agent gone)")
    return {"job": spec.name, "status": status, "backend": "local", "nodes": [node], "ledger": local_ledger(spec)}


def local_ledger(spec: JobSpec | None) -> list[dict[str, object]]:
    """The node ledger of a one-node job, as `runner status` shows it (docs/hangs.md); [] without a spec."""
    from runner.rendezvous.node_ledger import LocalLedger

    if spec is None:
        return []
    return [rec.to_json() for rec in LocalLedger(ledger_path(spec.name, spec.identity())).read().values()]


def request_stop(spec: JobSpec, graceful: bool) -> str:
    """Ask every agent of the job to stop (graceful: let workers finish). Harmless when already stopped."""
    if spec.rendezvous.backend == "etcd":
        from runner.rendezvous.etcd.admin import request_stop as etcd_stop

        asyncio.run(etcd_stop(spec, graceful))
        return "stop requested for every node (etcd)"
    status = read_status(spec)
    node = status["nodes"][0]
    if status["status"] != "running":
        return f"job '{spec.name}' is not running ({status['status']}): nothing to stop"
    sig = GRACEFUL_SIGNAL if graceful else signal.SIGTERM
    if not signal_agent(node, sig):
        return f"job '{spec.name}' is not running (its agent, pid {node.get('agent_pid')}, is gone): nothing to stop"
    return f"{'graceful ' if graceful else ''}stop sent to the agent (pid {node['agent_pid']})"


def agent_identity() -> dict[str, object]:
    """What status.json may record so `runner stop` can tell this agent from a later process with the same pid."""
    st = procs.read_stat(os.getpid())
    return {"agent_pid": os.getpid(), "agent_start_time": st.start_time if st is not None else None}


def holds_run_file(pid: int, run_dir: str) -> bool:
    """True if process `pid` has one of the agent's files of `run_dir` open (only the agent of that run does)."""
    return procs.holds_open(pid, {os.path.join(run_dir, name) for name in AGENT_FILES})


def _proven(pid: int, node: Mapping[str, object]) -> bool:
    """`pid` is the agent `node` describes: same start time, or it holds that run's own files open."""
    start = node.get("agent_start_time")
    if isinstance(start, int):
        st = procs.read_stat(pid)
        return st is not None and st.start_time == start
    run_dir = node.get("run_dir")
    return isinstance(run_dir, str) and holds_run_file(pid, run_dir)


def is_agent(node: Mapping[str, object]) -> bool:
    """True if the agent a status.json describes still runs (not merely some process with its old pid)."""
    return _with_agent(node, procs.exists)


def signal_agent(node: Mapping[str, object], sig: int) -> bool:
    """Send `sig` to the agent a status.json describes, through a pidfd, only once proven to be it; False if not."""
    return _with_agent(node, lambda fd: procs.send(fd, sig))


def _with_agent(node: Mapping[str, object], act: Callable[[int], bool]) -> bool:
    """Open a pidfd on node's agent_pid, prove it is that agent, then `act` on the pidfd.

    `act` fails if the process ended meanwhile, so what was proven was about the process the pidfd names.
    """
    pid = node.get("agent_pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    fd = procs.pidfd(pid)
    if fd is None:
        return False
    try:
        return _proven(pid, node) and act(fd)
    finally:
        os.close(fd)


def reset(spec: JobSpec, force: bool) -> str:
    """Forget an etcd job's shared state (rounds, budget, closed marker) so its name can run again."""
    if spec.rendezvous.backend != "etcd":
        return f"job '{spec.name}' uses the local backend: it keeps no shared state, nothing to reset"
    from runner.rendezvous.etcd.admin import reset_job

    count = asyncio.run(reset_job(spec, force))
    return f"job '{spec.name}': {count} key(s) deleted; the name can run again"
