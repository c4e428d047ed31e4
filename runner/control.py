"""`runner status` and `runner stop`: read a job's live state and ask its agents to stop, for either backend."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

from runner.config.spec import JobSpec
from runner.errors import RunnerError


def local_status_path(spec: JobSpec) -> Path:
    """status.json of the job's latest run on this machine."""
    return Path(spec.logs.dir).expanduser().absolute() / spec.name / "latest" / "status.json"


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
    running = node.get("state") != "SHUTDOWN" and _alive(node.get("agent_pid"))
    status = "running" if running else (node.get("outcome") or "unknown (agent gone)")
    return {"job": spec.name, "status": status, "backend": "local", "nodes": [node]}


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
    os.kill(int(node["agent_pid"]), signal.SIGUSR2 if graceful else signal.SIGTERM)
    return f"{'graceful ' if graceful else ''}stop sent to the agent (pid {node['agent_pid']})"


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reset(spec: JobSpec, force: bool) -> str:
    """Forget an etcd job's shared state (rounds, budget, closed marker) so its name can run again."""
    if spec.rendezvous.backend != "etcd":
        return f"job '{spec.name}' uses the local backend: it keeps no shared state, nothing to reset"
    from runner.rendezvous.etcd.admin import reset_job

    count = asyncio.run(reset_job(spec, force))
    return f"job '{spec.name}': {count} key(s) deleted; the name can run again"
