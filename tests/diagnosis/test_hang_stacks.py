"""A hung job's culprit stacks (runner/watchdog/flight.py `take_stacks`): py-spy for a rank that runs, the records'
reason for one they found stopped. Real processes and the real py-spy."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import structlog
from ci_skips import needs

from runner.hangs import Answer, RankRecord
from runner.watchdog.flight import take_stacks
from runner.watchdog.stacks import find_py_spy
from runner.workers.group import Worker
from runner.workers.launch_plan import WorkerPlan

pytestmark = needs(None if find_py_spy() else "py-spy is not installed (pip install py-spy)")


def stacks_of(answer: Answer) -> tuple[dict[int, str], dict[int, str]]:
    """take_stacks for rank 1 of node n, a real sleeping Python, whose record answered `answer`."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        async def body() -> tuple[dict[int, str], dict[int, str]]:
            plan = WorkerPlan(local_rank=1, rank=1, argv=(), env=(), contract=(), cwd="/", log_dir="/nonexistent")
            worker = Worker(plan, 0, proc.pid, os.pidfd_open(proc.pid), asyncio.get_running_loop().create_future(), "t")
            try:
                record = RankRecord(1, "n", answer, detail="process state T" if answer is Answer.STOPPED else "")
                return await take_stacks([worker], [record], "n", structlog.get_logger())
            finally:
                os.close(worker.pidfd)
        return asyncio.run(body())
    finally:
        proc.kill()
        proc.wait()


def test_a_rank_found_stopped_is_not_read_though_it_runs_again_by_then() -> None:
    """The records found rank 1 stopped; the stop that follows a hang (SIGTERM, then SIGCONT) resumed it before its
    stack was taken (CI, under load: the report then said "py-spy could not read it"). Its reason is the records':
    stopped, and py-spy is never run on it."""
    stacks, unread = stacks_of(Answer.STOPPED)
    assert stacks == {}
    assert unread == {1: "its process is stopped (state T): py-spy cannot read a stopped process"}


def test_a_rank_that_runs_has_its_stack_read() -> None:
    """The same process, found silent (not stopped): py-spy reads its stack (so the test above would read it too,
    were the records' finding ignored)."""
    stacks, unread = stacks_of(Answer.SILENT)
    assert unread == {} and "<module>" in stacks[1], (stacks, unread)
