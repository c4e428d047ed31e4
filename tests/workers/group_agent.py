"""A stand-in agent for fault tests: a real WorkerGroup and Shepherd (agent mode: subreaper) in their own process.

Usage: group_agent.py OUT N [--no-cgroup] -- WORKER ARGS...   Starts N escape_worker.py workers, writes
OUT/agent.json ({"pid", "shepherd"}) once every worker wrote its rank file, then waits. SIGTERM: stop the group
(SIGTERM, grace 5 s), close the shepherd, exit 0. Meant to be SIGKILLed by the test (or its shepherd killed).
"""

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from plans import plan

from runner.system.shepherd import Shepherd
from runner.workers.group import WorkerGroup


async def main() -> None:
    out, n = Path(sys.argv[1]), int(sys.argv[2])
    rest = sys.argv[3:]
    split = rest.index("--")
    opts, worker_args = rest[:split], rest[split + 1 :]
    shepherd = Shepherd(agent=True, cgroup="--no-cgroup" not in opts)
    events: asyncio.Queue[object] = asyncio.Queue()
    group = WorkerGroup(events, shepherd, tee=False, prefix="", kill_timeout=10)
    group.start(plan(out, worker_args, n))
    while not all((out / f"rank{r}.json").exists() for r in range(n)):
        await asyncio.sleep(0.02)
    info = {"pid": os.getpid(), "shepherd": shepherd.pid, "cgroup": str(shepherd.cgroup.path) if shepherd.cgroup else None}

    def note(name: str, text: str) -> None:  # whole or not at all: a test polls these files while they change
        (out / f"{name}.tmp").write_text(text)
        (out / f"{name}.tmp").replace(out / name)
    note("shepherds.txt", f"{shepherd.pid} {shepherd.restarts}\n")  # there before agent.json says ready
    note("agent.json", json.dumps(info))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    while not stop.is_set():  # note every guard pid (a test kills one and expects another)
        note("shepherds.txt", f"{shepherd.pid} {shepherd.restarts}\n")
        try:
            await asyncio.wait_for(stop.wait(), 0.05)
        except TimeoutError:
            pass
    await group.stop(signal.SIGTERM, 5.0)
    shepherd.close()


if __name__ == "__main__":
    asyncio.run(main())
