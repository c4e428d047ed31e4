"""FileTimerServer against torch's real FileTimerClient in real worker processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from runner.errors import RunnerError
from runner.watchdog.stacks import find_py_spy
from runner.watchdog.timer_server import Expiry, FileTimerServer

pytestmark = pytest.mark.integration

WORKER = Path(__file__).parent / "workers" / "timer_worker.py"
WAIT_S = 60.0  # generous: workers import torch on a shared 2-core machine


class Harness:
    """A server, the workers it owns, and the expiries it reported."""

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
        """Start a worker, register it (or not), let it send its requests, wait for its first line."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(WORKER), mode, str(seconds),
            env={**os.environ, "TORCHELASTIC_TIMER_FILE": self.server.path},
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        self.procs.append(proc)
        if owned:
            self.owned[proc.pid] = len(self.owned)
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


async def wait_for_log(logs: list[dict[str, Any]], event: str, **fields: Any) -> dict[str, Any]:
    """Wait (generously) for a captured log event with these fields."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for entry in logs:
            if entry["event"] == event and all(entry.get(k) == v for k, v in fields.items()):
                return entry
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {event} {fields} in {logs}")


def write_raw(path: str, *chunks: bytes) -> None:
    """Write bytes to the FIFO the way a client does (one open, O_NONBLOCK)."""
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        for chunk in chunks:
            os.write(fd, chunk)
    finally:
        os.close(fd)


def request(pid: int, scope: str, expiration: float, sig: int = 0) -> bytes:
    return json.dumps(
        {"version": 1, "pid": pid, "scope_id": scope, "expiration_time": expiration, "signal": sig}
    ).encode()


def test_expired_scope_signals_worker_and_reports(tmp_path: Path) -> None:
    """A hung worker gets the signal it asked for, and on_expiry names its pid and scope."""

    async def body(h: Harness) -> None:
        proc = await h.spawn("hang", 1.0)
        expiry = await h.next_expiry()
        assert (expiry.pid, expiry.scope, expiry.signal) == (proc.pid, "train_step", signal.SIGTERM)
        assert expiry.reason.startswith(f"watchdog: scope 'train_step' on pid {proc.pid} expired after")
        assert expiry.signalled_at >= expiry.deadline - 0.01  # never early
        assert await asyncio.wait_for(proc.wait(), WAIT_S) == -signal.SIGTERM

    run(tmp_path, body)


def test_released_scope_does_not_kill(tmp_path: Path) -> None:
    """A scope released before its deadline is forgotten: only the later report-only probe expires."""

    async def body(h: Harness) -> None:
        proc = await h.spawn("release", 0.5)
        expiry = await h.next_expiry()
        assert (expiry.pid, expiry.scope, expiry.signal) == (proc.pid, "probe", 0)
        assert proc.returncode is None
        assert h.expiries.empty()

    run(tmp_path, body)


def test_foreign_pid_is_ignored_and_logged(tmp_path: Path) -> None:
    """A process the runner does not own cannot arm a timer: rejected, logged, never signalled."""

    async def body(h: Harness) -> None:
        with capture_logs() as logs:
            foreign = await h.spawn("hang", 0.2, owned=False)
            await wait_for_log(logs, "timer_request_rejected", pid=foreign.pid)
            barrier = await h.spawn("report", 0.5)  # expires well after the foreign deadline
            expiry = await h.next_expiry()
        assert expiry.pid == barrier.pid
        assert foreign.returncode is None
        assert h.expiries.empty()

    run(tmp_path, body)


def test_own_pid_is_never_signalled(tmp_path: Path) -> None:
    """Even an owner() that accepts everything cannot make the server signal its own process."""

    async def body(h: Harness) -> None:
        with capture_logs() as logs:
            write_raw(h.server.path, request(os.getpid(), "suicide", time.time() - 1, signal.SIGTERM) + b"\n")
            await wait_for_log(logs, "timer_request_rejected", pid=os.getpid())
        assert h.expiries.empty()

    run(tmp_path, body, owner=lambda pid: 0)


def test_malformed_lines_are_skipped_and_server_keeps_working(tmp_path: Path) -> None:
    """Junk, oversized and split lines are logged or buffered; valid requests before and after still work."""

    async def body(h: Harness) -> None:
        idle = await h.spawn("idle")
        good = {"version": 1, "pid": idle.pid, "scope_id": "s", "expiration_time": time.time(), "signal": 0}
        bad_docs = [
            {**good, "version": 2}, {**good, "pid": str(idle.pid)}, {**good, "pid": True},
            {**good, "expiration_time": float("nan")}, {**good, "signal": 999},
            {**good, "expiration_time": time.time() + 10 * 365 * 86400}, {"version": 1},
        ]  # fmt: skip
        junk = [b"not json", b"[1, 2]", b"\xff\xfe", b"x" * 5000, *(json.dumps(d).encode() for d in bad_docs)]
        valid = request(idle.pid, "split", time.time() - 1)
        with capture_logs() as logs:
            write_raw(h.server.path, b"\n".join(junk) + b"\n" + b"y" * 6000)  # ends inside an oversized line
            write_raw(h.server.path, b"still oversized\n" + valid[:20])
            await asyncio.sleep(0.2)  # let the server read the partial line
            write_raw(h.server.path, valid[20:] + b"\n")
            expiry = await h.next_expiry()
            malformed = [e for e in logs if e["event"] == "timer_request_malformed"]
        assert (expiry.pid, expiry.scope, expiry.signal) == (idle.pid, "split", 0)
        assert sum(e.get("count", 1) for e in malformed) == len(junk) + 1
        assert idle.returncode is None
        reporter = await h.spawn("report", 0.0)
        assert (await h.next_expiry()).pid == reporter.pid

    run(tmp_path, body)


def test_clear_forgets_timers_and_activity(tmp_path: Path) -> None:
    """After clear() (workers restarted) an armed scope no longer fires and last_activity is reset."""

    async def body(h: Harness) -> None:
        hung = await h.spawn("hang", 0.3)
        while h.server.last_activity(hung.pid) is None:
            await asyncio.sleep(0.02)
        h.server.clear()
        assert h.server.last_activity(hung.pid) is None
        barrier = await h.spawn("report", 0.5)
        assert h.server.last_activity(barrier.pid) is not None
        assert (await h.next_expiry()).pid == barrier.pid
        assert hung.returncode is None

    run(tmp_path, body)


def test_fifo_and_directory_modes_and_stop_removes_them(tmp_path: Path) -> None:
    """The FIFO is 0600 in a 0700 directory; stop() removes both."""

    async def body(h: Harness) -> None:
        fifo = Path(h.server.path)
        st = fifo.stat()
        assert stat.S_ISFIFO(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o600
        assert stat.S_IMODE(fifo.parent.stat().st_mode) == 0o700
        await h.server.stop()
        assert not fifo.exists()
        assert not fifo.parent.exists()

    old = os.umask(0)  # the modes must not depend on the umask
    try:
        run(tmp_path, body)
    finally:
        os.umask(old)


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


def test_stacks_are_captured_before_the_signal(tmp_path: Path) -> None:
    """With py-spy usable, Expiry.stacks shows where the worker was stuck."""
    problem = py_spy_problem()
    if problem:
        pytest.skip(problem)

    async def body(h: Harness) -> None:
        await h.spawn("hang", 1.0)
        expiry = await h.next_expiry()
        assert "stuck_in_collective" in expiry.stacks

    run(tmp_path, body, capture_stacks=True)


def test_two_workers_expiring_together_are_both_reported(tmp_path: Path) -> None:
    """Expiries of several workers in one burst are each signalled and reported once."""

    async def body(h: Harness) -> None:
        a = await h.spawn("hang", 1.0)
        b = await h.spawn("hang", 1.0)
        pids = {(await h.next_expiry()).pid, (await h.next_expiry()).pid}
        assert pids == {a.pid, b.pid}
        assert await asyncio.wait_for(a.wait(), WAIT_S) == -signal.SIGTERM
        assert await asyncio.wait_for(b.wait(), WAIT_S) == -signal.SIGTERM
        assert h.expiries.empty()

    run(tmp_path, body)


def test_stale_directory_is_reused_and_made_private(tmp_path: Path) -> None:
    """A leftover timer directory of ours (loose mode, stale FIFO) is tightened and the FIFO recreated."""
    stale = tmp_path / "run" / "timer"
    stale.mkdir(parents=True, mode=0o755)
    os.mkfifo(stale / "requests.fifo", 0o666)

    async def body(h: Harness) -> None:
        assert stat.S_IMODE(stale.stat().st_mode) == 0o700
        assert stat.S_IMODE(Path(h.server.path).stat().st_mode) == 0o600

    run(tmp_path, body)


def test_symlinked_directory_is_refused(tmp_path: Path) -> None:
    """If run_dir/timer is a symlink (someone else's directory), start() refuses with a RunnerError."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "timer").symlink_to(tmp_path / "elsewhere")
    server = FileTimerServer(tmp_path / "run", owner=lambda pid: None, on_expiry=lambda e: None)
    with pytest.raises(RunnerError, match="not a directory owned by this user"):
        asyncio.run(server.start())
    assert list((tmp_path / "elsewhere").iterdir()) == []
