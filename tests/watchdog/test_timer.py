"""FileTimerServer: per-worker FIFOs, against torch's real FileTimerClient in real workers (real time) and
against raw writes on an autojump clock (deadlines without real sleeps)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from ci_skips import need
from structlog.testing import capture_logs

from runner.errors import RunnerError
from runner.watchdog.clock import AutojumpClock
from runner.watchdog.stacks import find_py_spy
from runner.watchdog.timer_server import Expiry, FileTimerServer

WORKER = Path(__file__).parents[1] / "fixtures" / "workers" / "timer_worker.py"
WAIT_S = 60.0  # generous: workers import torch on a shared 2-core machine


def write_raw(path: str, *chunks: bytes) -> None:
    """Write bytes to a FIFO the way a client does (one open, O_NONBLOCK, one write per chunk)."""
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        for chunk in chunks:
            os.write(fd, chunk)
    finally:
        os.close(fd)


def request(pid: int, scope: str, expiration: float, sig: int = 0) -> bytes:
    """One wire line, with its newline."""
    doc = {"version": 1, "pid": pid, "scope_id": scope, "expiration_time": expiration, "signal": sig}
    return json.dumps(doc).encode() + b"\n"


# -- real time, real workers, torch's own client -----------------------------------------------------------


class Harness:
    """A server on the real clock, the workers it owns (worker i is local rank i), and the expiries it reported."""

    def __init__(
        self, tmp_path: Path, *, capture_stacks: bool = False, owner: Callable[[int], int | None] | None = None
    ) -> None:
        self.owned: dict[int, int] = {}
        self.expiries: asyncio.Queue[Expiry] = asyncio.Queue()
        self.server = FileTimerServer(
            tmp_path / "run",
            owner=owner or self.owned.get,
            on_expiry=self.expiries.put_nowait,
            capture_stacks=capture_stacks,
            log=structlog.get_logger(),
        )
        self.procs: list[asyncio.subprocess.Process] = []

    async def spawn(self, mode: str, seconds: float = 1.0, *, owned: bool = True) -> asyncio.subprocess.Process:
        """Start a worker on its own channel, register it (or not), let it send its requests, wait for its line."""
        rank = len(self.procs)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(WORKER), mode, str(seconds),
            env={**os.environ, "TORCHELASTIC_TIMER_FILE": self.server.channel(rank)},
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        self.procs.append(proc)
        if owned:
            self.owned[proc.pid] = rank
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
        line = await asyncio.wait_for(proc.stdout.readline(), WAIT_S)
        assert line, f"worker {mode} exited early with {await proc.wait()}"
        return proc

    async def next_expiry(self) -> Expiry:
        return await asyncio.wait_for(self.expiries.get(), WAIT_S)

    async def close(self) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
        await self.server.stop()


def run(tmp_path: Path, body: Callable[[Harness], Awaitable[None]], **kwargs: Any) -> None:
    """Run body(harness) in a fresh loop with a started server; always reap workers and stop the server."""

    async def main() -> None:
        harness = Harness(tmp_path, **kwargs)
        await harness.server.start()
        try:
            await body(harness)
        finally:
            await harness.close()

    asyncio.run(main())


async def wait_until(cond: Callable[[], bool], what: str) -> None:
    """Wait (generously, real time) until cond() holds."""
    deadline = time.monotonic() + WAIT_S
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.mark.integration
def test_expired_scope_signals_worker_and_reports(tmp_path: Path) -> None:
    """A hung worker (torch's client on its own FIFO) gets the signal it asked for; on_expiry names rank and scope."""

    async def body(h: Harness) -> None:
        proc = await h.spawn("hang", 1.0)
        expiry = await h.next_expiry()
        assert (expiry.local_rank, expiry.pid, expiry.scope, expiry.signal) == (0, proc.pid, "train_step", 15)
        assert expiry.reason.startswith(f"watchdog: scope 'train_step' on pid {proc.pid} expired after")
        assert expiry.signalled_at >= expiry.deadline - 0.01  # never early
        assert await asyncio.wait_for(proc.wait(), WAIT_S) == -signal.SIGTERM

    run(tmp_path, body)


@pytest.mark.integration
def test_released_scope_does_not_kill_and_foreign_pid_is_refused(tmp_path: Path) -> None:
    """torch's release works; a process the runner does not own cannot arm a timer (counted, never signalled)."""

    async def body(h: Harness) -> None:
        foreign = await h.spawn("hang", 0.2, owned=False)
        await wait_until(lambda: h.server.stats().rejected.get("foreign_pid") == 1, "the foreign request")
        releaser = await h.spawn("release", 0.5)
        expiry = await h.next_expiry()
        assert (expiry.pid, expiry.scope, expiry.signal) == (releaser.pid, "probe", 0)
        assert releaser.returncode is None
        assert foreign.returncode is None
        assert h.expiries.empty()

    run(tmp_path, body)


def py_spy_problem() -> str | None:
    """Why py-spy cannot dump a child here (not installed, no ptrace permission), or None."""
    exe = find_py_spy()
    if exe is None:
        return "py-spy is not installed (pip install py-spy)"
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as child:
        try:
            time.sleep(0.3)
            done = subprocess.run(
                [exe, "dump", "--pid", str(child.pid)], capture_output=True, text=True, timeout=30, check=False
            )
        finally:
            child.kill()
    return None if done.returncode == 0 else f"py-spy cannot dump here (ptrace?): {done.stderr.strip()[-200:]}"


@pytest.mark.integration
def test_stacks_are_captured_before_the_signal(tmp_path: Path) -> None:
    """With py-spy usable, Expiry.stacks shows where the worker was stuck."""
    problem = py_spy_problem()
    if problem:
        need(problem)

    async def body(h: Harness) -> None:
        await h.spawn("hang", 1.0)
        expiry = await h.next_expiry()
        assert "stuck_in_collective" in expiry.stacks

    run(tmp_path, body, capture_stacks=True)


def test_fifo_and_directory_modes_and_stop_removes_them(tmp_path: Path) -> None:
    """Each channel is a 0600 FIFO in a 0700 directory, whatever the umask; stop() removes them all."""

    async def main() -> None:
        server = FileTimerServer(tmp_path / "run", owner=lambda pid: None, on_expiry=lambda e: None)
        await server.start()
        fifos = [Path(server.channel(r)) for r in range(3)]
        assert server.channel(1) == str(fifos[1])  # the same channel again
        for fifo in fifos:
            st = fifo.stat()
            assert stat.S_ISFIFO(st.st_mode)
            assert stat.S_IMODE(st.st_mode) == 0o600
        assert stat.S_IMODE(server.directory.stat().st_mode) == 0o700
        await server.stop()
        assert not server.directory.exists()

    old = os.umask(0)
    try:
        asyncio.run(main())
    finally:
        os.umask(old)


def test_stale_directory_is_reused_and_made_private(tmp_path: Path) -> None:
    """A leftover timer directory of ours (loose mode, stale FIFO) is tightened and the FIFO recreated."""
    stale = tmp_path / "run" / "timer"
    stale.mkdir(parents=True, mode=0o755)
    os.mkfifo(stale / "rank_0.fifo", 0o666)

    async def main() -> None:
        server = FileTimerServer(tmp_path / "run", owner=lambda pid: None, on_expiry=lambda e: None)
        await server.start()
        try:
            assert stat.S_IMODE(stale.stat().st_mode) == 0o700
            assert stat.S_IMODE(Path(server.channel(0)).stat().st_mode) == 0o600
        finally:
            await server.stop()

    asyncio.run(main())


def test_symlinked_directory_is_refused(tmp_path: Path) -> None:
    """If run_dir/timer is a symlink (someone else's directory), start() refuses with a RunnerError."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "timer").symlink_to(tmp_path / "elsewhere")
    server = FileTimerServer(tmp_path / "run", owner=lambda pid: None, on_expiry=lambda e: None)
    with pytest.raises(RunnerError, match="not a directory owned by this user"):
        asyncio.run(server.start())
    assert list((tmp_path / "elsewhere").iterdir()) == []


# -- autojump clock: deadlines without real sleeps --------------------------------------------------------


@pytest.fixture
def sleepers() -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """Start real `sleep` processes to stand for workers (a signal must reach a real process of ours); reaped."""
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        procs.append(subprocess.Popen(["sleep", "600"]))
        return procs[-1]

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


class Fake:
    """A server on an autojump clock; `owned` maps pid -> local rank."""

    def __init__(self, tmp_path: Path, **kwargs: Any) -> None:
        self.clock = AutojumpClock()
        self.owned: dict[int, int] = {}
        self.expiries: list[Expiry] = []
        self.server = FileTimerServer(
            tmp_path / "run", owner=self.owned.get, on_expiry=self.expiries.append, clock=self.clock,
            capture_stacks=False, log=structlog.get_logger(), **kwargs,
        )  # fmt: skip

    def run(self, body: Callable[[], Awaitable[None]]) -> None:
        async def main() -> None:
            await self.server.start()
            try:
                await body()
            finally:
                await self.server.stop()

        self.clock.run(main())

    def send(self, rank: int, *lines: bytes) -> None:
        write_raw(self.server.channel(rank), *lines)

    def at(self, seconds: float) -> float:
        """The wall-clock time `seconds` from now (what a client puts in expiration_time)."""
        return self.clock.wall() + seconds


async def settle() -> None:
    """Let the server read what was written (virtual time: a millisecond, no real wait)."""
    await asyncio.sleep(0.001)


def test_nothing_happens_before_the_deadline_and_the_expiry_comes_after_it(tmp_path: Path, sleepers) -> None:
    """A 30 s scope: silent at 29.9 s, signalled and reported just after 30 s; the clock jumped, nobody slept."""
    fake = Fake(tmp_path)
    worker = sleepers()
    fake.owned[worker.pid] = 0

    async def body() -> None:
        start = fake.clock.monotonic()
        fake.send(0, request(worker.pid, "step", fake.at(30), signal.SIGTERM))
        await asyncio.sleep(29.9)
        assert fake.expiries == []
        assert worker.poll() is None
        await asyncio.sleep(0.2)
        (expiry,) = fake.expiries
        assert (expiry.local_rank, expiry.pid, expiry.scope, expiry.signal) == (0, worker.pid, "step", 15)
        assert fake.clock.monotonic() - start >= 30
        assert 0 <= expiry.signalled_at - expiry.deadline <= 0.1 + 1e-6
        assert expiry.timeout_s == pytest.approx(30, abs=0.01)

    fake.run(body)
    assert worker.wait(WAIT_S) == -signal.SIGTERM
    assert fake.clock.jumps > 0  # idle time was skipped, not slept


def test_released_and_rearmed_scopes(tmp_path: Path, sleepers) -> None:
    """A release cancels the scope; re-arming moves its deadline; a report-only scope expires without a signal."""
    fake = Fake(tmp_path)
    worker = sleepers()
    fake.owned[worker.pid] = 0

    async def body() -> None:
        fake.send(0, request(worker.pid, "a", fake.at(5), signal.SIGKILL), request(worker.pid, "a", -1))
        fake.send(0, request(worker.pid, "b", fake.at(5), 0), request(worker.pid, "b", fake.at(50), 0))
        await asyncio.sleep(49)
        assert fake.expiries == []
        await asyncio.sleep(2)
        assert [(e.scope, e.signal) for e in fake.expiries] == [("b", 0)]
        assert fake.server.stats().timers == 0

    fake.run(body)
    assert worker.poll() is None


def test_a_wall_clock_step_does_not_move_a_received_deadline(tmp_path: Path, sleepers) -> None:
    """Deadlines are converted to the monotonic clock on receipt: the wall clock jumping an hour changes nothing."""
    fake = Fake(tmp_path)
    worker = sleepers()
    fake.owned[worker.pid] = 0

    async def body() -> None:
        fake.send(0, request(worker.pid, "fwd", fake.at(10), 0))
        await settle()
        fake.clock.step_wall(3600)
        await asyncio.sleep(9)
        assert fake.expiries == []
        fake.clock.step_wall(-7200)
        await asyncio.sleep(1.2)
        assert [e.scope for e in fake.expiries] == ["fwd"]

    fake.run(body)


def test_expiries_of_two_workers_together_are_each_reported_once(tmp_path: Path, sleepers) -> None:
    """A burst of expiries on two channels: each worker signalled and reported once, in one coalesced wake-up."""
    fake = Fake(tmp_path)
    a, b = sleepers(), sleepers()
    fake.owned.update({a.pid: 0, b.pid: 1})

    async def body() -> None:
        fake.send(0, request(a.pid, "x", fake.at(1), signal.SIGTERM), request(a.pid, "y", fake.at(1.05), 0))
        fake.send(1, request(b.pid, "x", fake.at(1.02), signal.SIGTERM))
        await asyncio.sleep(5)
        assert sorted((e.local_rank, e.pid, e.scope) for e in fake.expiries) == [(0, a.pid, "x"), (1, b.pid, "x")]

    fake.run(body)
    assert (a.wait(WAIT_S), b.wait(WAIT_S)) == (-signal.SIGTERM, -signal.SIGTERM)


def test_requests_are_attributed_by_channel(tmp_path: Path, sleepers) -> None:
    """A pid of rank 1 written on rank 0's channel, a foreign pid, the agent's own pid: refused and counted."""
    fake = Fake(tmp_path)
    a, b = sleepers(), sleepers()
    fake.owned.update({a.pid: 0, b.pid: 1, os.getpid(): 0})
    stranger = sleepers()

    async def body() -> None:
        fake.send(0, request(b.pid, "spoof", fake.at(1), signal.SIGKILL))
        fake.send(0, request(stranger.pid, "foreign", fake.at(1), signal.SIGKILL))
        fake.send(0, request(os.getpid(), "suicide", fake.at(1), signal.SIGKILL))
        await asyncio.sleep(10)
        assert fake.expiries == []
        assert fake.server.stats().rejected == {"foreign_pid": 2, "other_rank": 1}
        assert fake.server.last_activity(0) is None

    fake.run(body)
    assert (b.poll(), stranger.poll()) == (None, None)


def test_a_broken_writer_costs_its_own_channel_nothing_and_others_nothing(tmp_path: Path, sleepers) -> None:
    """Bytes left without a newline on a channel: the next request there is still accepted, the fragment counted."""
    fake = Fake(tmp_path)
    a, b = sleepers(), sleepers()
    fake.owned.update({a.pid: 0, b.pid: 1})

    async def body() -> None:
        fake.send(0, b'{"version": 1, "pid": ')  # a writer dies mid-line
        fake.send(1, request(b.pid, "other", fake.at(2), 0))
        await settle()
        fake.send(0, request(a.pid, "mine", fake.at(1), 0))
        await asyncio.sleep(3)
        assert sorted((e.local_rank, e.scope) for e in fake.expiries) == [(0, "mine"), (1, "other")]
        assert fake.server.stats().rejected == {"fragment": 1}

    fake.run(body)


def test_rejections_are_summarised_not_logged_one_by_one(tmp_path: Path) -> None:
    """Thousands of bad lines make one summary line at once and one per interval after, with exact counts."""
    fake = Fake(tmp_path, summary_interval=10.0)

    async def body() -> None:
        with capture_logs() as logs:
            fake.send(0, b"junk\n" * 3000)
            await asyncio.sleep(1)
            fake.send(0, b"[1]\n" * 2000, b"x" * 5000 + b"\n")
            await asyncio.sleep(1)
            summaries = [e for e in logs if e["event"] == "timer_requests_rejected"]
            assert len(summaries) == 1  # the second batch waits for the interval
            await asyncio.sleep(10)
        summaries = [e for e in logs if e["event"] == "timer_requests_rejected"]
        assert [s["kinds"] for s in summaries] == [{"not_json": 3000}, {"not_object": 2000, "too_long": 1}]
        assert summaries[-1]["total"] == 5001
        assert all(e["event"] != "timer_request_malformed" for e in logs)

    fake.run(body)


def test_scopes_per_worker_are_capped_and_the_overflow_counted(tmp_path: Path, sleepers) -> None:
    """Past max_scopes new scopes are refused (counted); re-arming a held scope or releasing one still works."""
    fake = Fake(tmp_path, max_scopes=8)
    worker = sleepers()
    fake.owned[worker.pid] = 0

    async def body() -> None:
        fake.send(0, *(request(worker.pid, f"s{i}", fake.at(100), 0) for i in range(20)))
        await settle()
        assert fake.server.stats().timers == 8
        assert fake.server.stats().rejected == {"scope_cap": 12}
        fake.send(0, request(worker.pid, "s0", fake.at(200), 0), request(worker.pid, "s1", -1))
        fake.send(0, request(worker.pid, "new", fake.at(100), 0))
        await settle()
        assert fake.server.stats().timers == 8
        assert fake.server.stats().rejected == {"scope_cap": 12}

    fake.run(body)


def test_a_flood_of_rearms_keeps_memory_bounded(tmp_path: Path, sleepers) -> None:
    """20 000 re-arms of one scope: one live timer, a heap compacted to a bound, no buffered bytes."""
    fake = Fake(tmp_path)
    worker = sleepers()
    fake.owned[worker.pid] = 0

    async def body() -> None:
        for batch in range(40):
            fake.send(0, b"".join(request(worker.pid, "step", fake.at(60 + batch), 0) for _ in range(500)))
            await settle()
        stats = fake.server.stats()
        assert stats.accepted == 20_000
        assert stats.timers == 1
        assert stats.heap <= 2 * stats.timers + 64
        assert stats.buffered == 0

    fake.run(body)


def test_clear_and_forget_drop_timers_activity_and_partial_lines(tmp_path: Path, sleepers) -> None:
    """clear() forgets everything; forget(rank) only that rank's timers and activity."""
    fake = Fake(tmp_path)
    a, b = sleepers(), sleepers()
    fake.owned.update({a.pid: 0, b.pid: 1})

    async def body() -> None:
        fake.send(0, request(a.pid, "a", fake.at(5), signal.SIGKILL))
        fake.send(1, request(b.pid, "b", fake.at(5), 0), b'{"partial')
        await settle()
        assert fake.server.last_activity(0) is not None
        fake.server.forget(0)
        assert fake.server.last_activity(0) is None
        assert fake.server.last_activity(1) is not None
        await asyncio.sleep(6)
        assert [e.scope for e in fake.expiries] == ["b"]
        fake.send(1, request(b.pid, "c", fake.at(5), 0))
        await settle()
        fake.server.clear()
        assert fake.server.stats().timers == fake.server.stats().buffered == 0
        await asyncio.sleep(6)
        assert [e.scope for e in fake.expiries] == ["b"]

    fake.run(body)
    assert a.poll() is None
