"""Every stop signal lands on the agent's main thread: no other thread of the agent can take one.

Why it matters (runner/system/thread_signals.py): a signal the kernel gives to a helper thread is recorded only once
that thread ran Python's C handler; meanwhile the main thread may see the workers' exits the same signal caused and
take a stopped job for a finished or failed one (CI saw it: tests/system/test_signals.py, replica groups, whose placement
leaves an idle to_thread thread behind).
"""

from __future__ import annotations

import asyncio
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from runner.system import thread_signals
from runner.testing.etcd_server import etcd_server
from tests.conftest import wait_for

STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR2)


def blocked_here() -> set[int]:
    return set(signal.pthread_sigmask(signal.SIG_BLOCK, []))


def test_a_thread_started_through_start_blocks_the_stop_signals_and_its_creator_keeps_its_mask() -> None:
    before = blocked_here()
    seen: list[set[int]] = []
    thread = threading.Thread(target=lambda: seen.append(blocked_here()))
    thread_signals.start(thread)
    thread.join()
    assert set(STOPS) <= seen[0]
    assert blocked_here() == before


def test_the_executors_threads_block_the_stop_signals() -> None:
    async def main() -> set[int]:
        asyncio.get_running_loop().set_default_executor(thread_signals.SignalFreeExecutor())
        return await asyncio.to_thread(blocked_here)

    assert set(STOPS) <= asyncio.run(main())
    assert not set(STOPS) & blocked_here()


def test_the_mask_is_given_back_when_the_block_raises() -> None:
    before = blocked_here()
    with pytest.raises(RuntimeError), thread_signals.kept_from_new_threads():
        raise RuntimeError("boom")
    assert blocked_here() == before


def test_a_fault_stays_deliverable_to_the_thread_that_causes_it() -> None:
    assert not {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT} & thread_signals.ASYNC_SIGNALS


def masks(pid: int) -> dict[str, set[int]]:
    """Thread id and name -> the signals it blocks (/proc/PID/task/TID/status, SigBlk: bit n-1 is signal n)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        status = (task / "status").read_text()
        bits = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:")), 16)
        name = (task / "comm").read_text().strip()
        out[f"{task.name} {name}"] = {n + 1 for n in range(64) if bits >> n & 1}
    return out


WORKER = """
import os, sys, time
print("started", flush=True)
open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}-{os.environ.get('REPLICA_GROUP_ID', '')}"), "w").close()
time.sleep(120)
"""


@pytest.mark.integration
@pytest.mark.parametrize("shape", ["replica_groups", "etcd"])
def test_while_the_agent_runs_only_its_main_thread_takes_a_stop_signal(job: Any, tmp_path: Path, shape: str) -> None:
    """A replica-group job (its placement ran in the to_thread pool) and an etcd job (grpc's threads, the console
    tee's): the agent has other threads, and each blocks every stop signal; SIGTERM then stops the job."""
    with etcd_server(tmp_path / "etcd") as etcd:
        layout = ("replica_groups: {count: 2, nproc_per_node: 1}" if shape == "replica_groups" else
                  f'nproc_per_node: 2\n            nodes: 1\n'
                  f'            rendezvous: {{backend: etcd, endpoints: ["{etcd.endpoint}"]}}')
        j = job(f"""
            version: 1
            name: threadsig
            entrypoint: {{script: worker.py, args: ["${{OUT}}"]}}
            {layout}
            """)
        (j.tmp / "worker.py").write_text(WORKER)
        proc = j.start()
        try:
            wait_for(lambda: len(list(j.out.iterdir())) == 2, what="both workers to start")
            threads = masks(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=120)
    main = f"{proc.pid} "
    others = {name: blocked for name, blocked in threads.items() if not name.startswith(main)}
    assert others, f"the agent ran no thread but its main one: this test proves nothing ({threads})"
    takers = {name: sorted(set(STOPS) - blocked) for name, blocked in others.items() if set(STOPS) - blocked}
    assert not takers, f"threads that may take a stop signal: {takers}"
    assert not set(STOPS) & next(b for n, b in threads.items() if n.startswith(main)), "the main thread must take them"
    assert proc.returncode == 128 + signal.SIGTERM, err

