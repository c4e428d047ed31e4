"""WorkerGroup with real processes: exits read without reaping, leaked grandchildren killed, signals forwarded,
a worker that SIGKILL cannot end is reported after a bounded wait."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from ci_skips import need
from conftest import alive, cgroup_here, wait_for
from fixtures.workers.plans import plan

from runner.events import WorkerExited
from runner.system import procs
from runner.system.shepherd import Shepherd
from runner.workers.group import WorkerGroup, signal_number

pytestmark = pytest.mark.integration


HAS_CGROUP = cgroup_here()


@pytest.fixture(params=["cgroup", "no-cgroup"])
def shepherd(request: pytest.FixtureRequest) -> Iterator[Shepherd]:
    """A shepherd with and without a cgroup (the second is the fallback: group, session, tag)."""
    if request.param == "cgroup" and not HAS_CGROUP:
        need("no writable cgroup v2 here: the fallback is tested by the other parameter")
    s = Shepherd(agent=False, cgroup=request.param == "cgroup")
    yield s
    s.close()


def info(out: Path, rank: int = 0) -> dict[str, int]:
    path = out / f"rank{rank}.json"
    wait_for(path.exists, what=f"rank {rank} to start")
    data: dict[str, int] = json.loads(path.read_text())
    return data


def kill_left(*pids: int) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_escaped_grandchild_dies_with_the_group(tmp_path: Path, shepherd: Shepherd) -> None:
    """A worker's grandchild that called setsid() (and left its process group) is SIGKILLed by stop()."""
    async def main() -> tuple[dict[str, int], WorkerGroup]:
        group = WorkerGroup(asyncio.Queue(), shepherd, tee=False, prefix="")
        group.start(plan(tmp_path, []))
        ids = await asyncio.to_thread(info, tmp_path)
        assert procs.read_stat(ids["escapee"]).sid != ids["pid"]  # type: ignore[union-attr] - it did leave
        await group.stop("SIGTERM", 5.0)
        return ids, group

    ids, group = asyncio.run(main())
    try:
        assert not alive(ids["pid"]) and not alive(ids["escapee"])
        assert all(w.reaped for w in group.workers.values())
    finally:
        kill_left(ids["pid"], ids["escapee"])


def test_env_scrubbed_escapee_needs_the_cgroup(tmp_path: Path) -> None:
    """An escapee that also cleared its environment is found by the cgroup (where the machine has one)."""
    if not HAS_CGROUP:
        need("no writable cgroup v2 here; without one only the agent's subreaper finds such a process")
    shepherd = Shepherd(agent=False, cgroup=True)

    async def main() -> dict[str, int]:
        group = WorkerGroup(asyncio.Queue(), shepherd, tee=False, prefix="")
        group.start(plan(tmp_path, ["--scrub-env"]))
        ids = await asyncio.to_thread(info, tmp_path)
        await group.stop(signal.SIGTERM, 5.0)
        return ids

    ids = asyncio.run(main())
    try:
        assert not alive(ids["escapee"])
    finally:
        kill_left(ids["pid"], ids["escapee"])
        shepherd.close()


def test_exited_worker_stays_unreaped_until_its_group_is_gone(tmp_path: Path, shepherd: Shepherd) -> None:
    """The exit code is reported at once, but the leader stays a zombie (its ids cannot be recycled) until stop()."""
    async def main() -> tuple[dict[str, int], WorkerExited, str, WorkerGroup]:
        events: asyncio.Queue[WorkerExited] = asyncio.Queue()
        group = WorkerGroup(events, shepherd, tee=False, prefix="")
        group.start(plan(tmp_path, ["--exit", "7"]))
        event = await asyncio.wait_for(events.get(), 60)
        ids = info(tmp_path)
        st = procs.read_stat(ids["pid"])
        state = st.state if st else "gone"
        await group.stop(signal.SIGTERM, 5.0)
        return ids, event, state, group

    ids, event, state, group = asyncio.run(main())
    try:
        assert event.exit_code == 7 and event.pid == ids["pid"]
        assert state == "Z"  # exited, not reaped: pid, group id and session id still ours
        assert procs.read_stat(ids["pid"]) is None  # reaped by stop()
        assert group.workers[0].returncode == 7
        assert not alive(ids["escapee"])
    finally:
        kill_left(ids["pid"], ids["escapee"])


@pytest.fixture
def sigint_handled() -> Iterator[None]:
    """SIGINT handled in this process for the test (as the agent does), whatever it was; restored after."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_stop_forwards_the_signal_number(tmp_path: Path, sigint_handled: None) -> None:
    """stop(SIGINT) gives the worker SIGINT (KeyboardInterrupt in Python), as torchrun forwards what it got.

    The agent handles SIGINT itself, so its workers start with SIGINT at its default (exec resets a handler, and
    Python then installs KeyboardInterrupt's). This test process stands in for it with a handler of its own: a test
    process that ignores SIGINT (CI's xdist workers did, late in two runs) would give the worker an ignored SIGINT,
    which exec keeps, and Python raises no KeyboardInterrupt then (seen: the worker ran out its 30 s grace).
    """
    shepherd = Shepherd(agent=False, cgroup=False)

    async def main() -> tuple[dict[str, int], int]:
        group = WorkerGroup(asyncio.Queue(), shepherd, tee=False, prefix="")
        group.start(plan(tmp_path, ["--signals"]))
        ids = await asyncio.to_thread(info, tmp_path)
        await group.stop(signal.SIGINT, 30.0)
        return ids, group.workers[0].exited.result()

    ids, code = asyncio.run(main())
    try:
        assert (tmp_path / "rank0.signals").read_text() == "KeyboardInterrupt\n"
        assert code == 130  # it exited on its own within the grace: no SIGKILL
    finally:
        kill_left(ids["pid"], ids["escapee"])
        shepherd.close()


def test_signal_number_accepts_names_and_numbers() -> None:
    """'SIGTERM', 'term' and 15 are the same signal; nonsense is refused."""
    assert signal_number("SIGTERM") is signal_number("term") is signal_number(15) is signal.SIGTERM
    with pytest.raises(KeyError):
        signal_number("SIGNOPE")


FREEZER = Path("/sys/fs/cgroup/freezer")


def test_unkillable_worker_is_reported_after_a_bounded_wait(tmp_path: Path) -> None:
    """A worker SIGKILL cannot end (frozen by the cgroup v1 freezer: state D) does not hang stop(): it returns after
    kill_timeout and reports pid, state and wchan. Thawed, it dies and collect() reaps it."""
    if not os.access(FREEZER, os.W_OK):
        need("needs a writable cgroup v1 freezer to make a process that SIGKILL does not end")
    frozen = FREEZER / f"runner-test-{os.getpid()}"
    frozen.mkdir()
    shepherd = Shepherd(agent=False, cgroup=False)
    ids: dict[str, int] = {}

    async def main() -> WorkerGroup:
        group = WorkerGroup(asyncio.Queue(), shepherd, tee=False, prefix="", kill_timeout=1.0)
        group.start(plan(tmp_path, []))
        ids.update(await asyncio.to_thread(info, tmp_path))
        (frozen / "tasks").write_text(str(ids["pid"]))
        (frozen / "freezer.state").write_text("FROZEN")
        await asyncio.to_thread(wait_for, lambda: "FROZEN" in (frozen / "freezer.state").read_text())
        await group.stop(signal.SIGTERM, 0.5)  # returns: the wait after SIGKILL is bounded
        (frozen / "freezer.state").write_text("THAWED")
        await asyncio.to_thread(wait_for, lambda: procs.exited(group.workers[0].pidfd), 60.0, "the thawed worker")
        assert group.collect() == 1
        return group

    try:
        group = asyncio.run(main())
        report = group.unkillable
        assert [r["pid"] for r in report] == [ids["pid"]]
        assert report[0]["state"] == "D" and report[0]["wchan"]
        assert group.workers[0].reaped and not group.stuck
    finally:
        if (frozen / "freezer.state").exists():
            (frozen / "freezer.state").write_text("THAWED")
        kill_left(*ids.values())
        shepherd.close()
        wait_for(lambda: not (frozen / "tasks").read_text().strip(), what="frozen cgroup to empty")
        frozen.rmdir()
