"""Context: what the state handlers share while one agent runs one job on one node."""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.config.spec import JobSpec
from runner.events import StopRequested
from runner.logs import JsonLines
from runner.private_files import write_private
from runner.rendezvous.base import Rendezvous, RendezvousResult
from runner.workers.failures import Failure
from runner.workers.group import Shepherd, WorkerGroup
from runner.workers.launch_plan import LaunchPlan, build_plan


@dataclass
class Context:
    """Mutable run state. Handlers read and update it, then return a Trigger."""

    spec: JobSpec
    node: str
    run_id: str
    run_dir: Path
    rendezvous: Rendezvous
    log: Any
    transitions: JsonLines
    events: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    shepherd: Shepherd = field(default_factory=Shepherd)
    attempt: int = 0
    restarts: int = 0  # restarts charged to the budget so far
    reason: str = ""  # why the next transition happens (set by the handler that returns it)
    result: RendezvousResult | None = None
    plan: LaunchPlan | None = None
    group: WorkerGroup | None = None
    failure: Failure | None = None  # the current attempt's root cause
    failures: list[Failure] = field(default_factory=list)
    stop: StopRequested | None = None
    hurry: asyncio.Event = field(default_factory=asyncio.Event)  # a second stop signal: kill now
    outcome: str = ""  # succeeded | failed | stopped | error
    exit_code: int = 0
    timer: Any = None  # runner.watchdog.timer_server.FileTimerServer when the watchdog is on
    started: float = field(default_factory=time.monotonic)
    state_name: str = "INIT"
    deadline_armed: bool = False

    def status(self) -> dict[str, Any]:
        """This node's live state, as published for `runner status`."""
        workers = []
        if self.group is not None:
            for w in self.group.workers.values():
                code = w.exited.result() if w.exited.done() else None
                workers.append({"rank": w.plan.rank, "local_rank": w.plan.local_rank, "pid": w.pid, "exit_code": code})
        return {
            "node": self.node,
            "agent_pid": os.getpid(),
            "state": self.state_name,
            "attempt": self.attempt,
            "restarts": self.restarts,
            "run_id": self.run_id,
            "run_dir": str(self.run_dir),
            "heartbeat": time.time(),
            "workers": workers,
            "outcome": self.outcome or None,
        }

    def make_plan(self) -> LaunchPlan:
        """Plan this node's workers for the current attempt from the last rendezvous result."""
        assert self.result is not None
        return build_plan(
            self.spec,
            self.result,
            attempt=self.attempt,
            restart_count=self.attempt,
            run_id=self.spec.name,
            run_dir=str(self.run_dir),
            base_env=os.environ,
            extra_env=self.timer.worker_env() if self.timer is not None else None,
        )

    async def publish(self) -> None:
        """Publish status to the rendezvous backend and to <run dir>/status.json."""
        status = self.status()
        path = self.run_dir / "status.json"
        write_private(path, json.dumps(status, indent=2))
        await self.rendezvous.publish(status)
