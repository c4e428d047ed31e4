"""Refused timer requests are logged per pid, rate-limited, in bounded memory (runner/watchdog/refusals.py):
on an injected clock, and with real floods through a worker's FIFO (an autojump clock: intervals without sleeps).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import structlog
from structlog.testing import capture_logs

from runner.watchdog.clock import AutojumpClock
from runner.watchdog.refusals import MAX_PIDS, RefusalLog, who
from runner.watchdog.timer_server import FileTimerServer

EVENT = "timer_request_refused"


class Clock:
    """An injected clock: time moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        """The test's time."""
        return self.now

    def wall(self) -> float:
        """Unused by the refusal log."""
        return 1_700_000_000.0 + self.now


def refusals(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The refusal lines among captured events."""
    return [e for e in logs if e["event"] == EVENT]


def accounted(lines: list[dict[str, Any]]) -> int:
    """The refusals the lines stand for: each line is one, plus those it says were suppressed."""
    return sum(1 + e["suppressed"] for e in lines)


def test_the_first_refusal_is_logged_at_once_then_one_line_per_interval_with_the_count() -> None:
    clock = Clock()
    with capture_logs() as logs:
        refused = RefusalLog(structlog.get_logger(), clock, interval=10.0)
        refused.refused(1, 0, "pid 1 (init)")
        for _ in range(999):
            clock.now += 0.001
            refused.refused(1, 0, "pid 1 (init)")
        assert len(refusals(logs)) == 1  # 999 more within the interval: none logged yet
        clock.now = 10.0
        refused.refused(1, 0, "pid 1 (init)")
        clock.now = 10.5
        refused.refused(1, 0, "pid 1 (init)")
        refused.flush()
    lines = refusals(logs)
    assert [(e["pid"], e["reason"], e["local_rank"], e["suppressed"]) for e in lines] == [
        (1, "pid 1 (init)", 0, 0), (1, "pid 1 (init)", 0, 999), (1, "pid 1 (init)", 0, 0),
    ]
    assert accounted(lines) == 1002 and lines[0]["log_level"] == "warning"


def test_each_pid_has_its_own_limit_and_the_reason_is_worded_only_when_a_line_is_due() -> None:
    clock = Clock()
    worded: Counter[int] = Counter()

    def reason(pid: int) -> Any:
        def word() -> str:
            worded[pid] += 1
            return f"reason {pid}"
        return word

    with capture_logs() as logs:
        refused = RefusalLog(structlog.get_logger(), clock, interval=10.0)
        for _ in range(500):
            refused.refused(7, 1, reason(7))
            refused.refused(8, 2, reason(8))
    assert [(e["pid"], e["local_rank"]) for e in refusals(logs)] == [(7, 1), (8, 2)]
    assert worded == {7: 2, 8: 2}  # its line, and once for the suppressed ones: never per request


def test_memory_is_capped_and_a_flood_of_new_pids_shares_one_line() -> None:
    """A writer naming a new pid on every line: max_pids are named, the rest share one line per interval."""
    clock = Clock()
    with capture_logs() as logs:
        refused = RefusalLog(structlog.get_logger(), clock, interval=10.0, max_pids=4)
        for pid in range(100, 10100):
            refused.refused(pid, 0, "not a process of this job")
        assert len(refused._pids) == 4
        assert [e["pid"] for e in refusals(logs)] == [100, 101, 102, 103, None]
        clock.now = 10.0
        for pid in range(20000, 20010):  # the interval is over: the old entries make room for new pids
            refused.refused(pid, 0, "not a process of this job")
        assert len(refused._pids) == 4
        refused.flush()
    lines = refusals(logs)
    assert accounted(lines) == 10010
    assert len(lines) <= 2 * (4 + 1) * 2  # two intervals, at most 2 lines per entry in each


def test_lines_stay_bounded_and_every_refusal_is_accounted_for_under_a_random_flood() -> None:
    """Random pids (a few loud ones, many one-off ones) over 100 s: per 10 s window at most 2 lines per entry."""
    rng = random.Random(19)
    clock = Clock()
    total = 0
    with capture_logs() as logs:
        refused = RefusalLog(structlog.get_logger(), clock, interval=10.0, max_pids=8)
        for _ in range(50000):
            clock.now += rng.random() * 0.004
            pid = rng.choice([1, os.getpid(), 42]) if rng.random() < 0.7 else rng.randrange(1000, 100000)
            refused.refused(pid, rng.randrange(4), "x")
            total += 1
            assert len(refused._pids) <= 8
        refused.flush()
    lines = refusals(logs)
    assert accounted(lines) == total
    assert len(lines) <= 2 * (8 + 1) * (int(clock.now // 10) + 2)
    assert len(lines) < total / 100


def test_who_names_init_the_agent_its_guard_and_strangers() -> None:
    guard = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "runner.system.shepherd_main"])
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        assert who(1) == "pid 1 (init)"
        assert who(os.getpid()) == "the agent itself"
        assert who(guard.pid) == "the agent's guard"
        assert who(stranger.pid) == "not a process of this job"
    finally:
        for proc in (guard, stranger):
            proc.kill()
            proc.wait()


# -- through the FIFO ----------------------------------------------------------------------------------------


def request(pid: int, expiration: float) -> bytes:
    """One wire line naming `pid`, with its newline."""
    doc = {"version": 1, "pid": pid, "scope_id": "s", "expiration_time": expiration, "signal": 9}
    return json.dumps(doc).encode() + b"\n"


async def pour(path: str, lines: list[bytes]) -> None:
    """Write `lines` into the FIFO as fast as it takes them (the server reads between our writes)."""
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        data = b"".join(lines)
        while data:
            try:
                data = data[os.write(fd, data[:4096]) :]  # <= PIPE_BUF: whole lines only
            except BlockingIOError:
                await asyncio.sleep(0.001)
    finally:
        os.close(fd)


def test_a_real_flood_through_the_fifo_logs_a_bounded_number_of_lines(tmp_path: Path) -> None:
    """60 virtual seconds of requests naming pid 1, the agent, another rank's worker and 3000 made-up pids."""
    clock = AutojumpClock()
    sleeper = subprocess.Popen(["sleep", "600"])  # a real worker of local rank 1
    owned = {sleeper.pid: 1}
    server = FileTimerServer(tmp_path / "run", owner=owned.get, on_expiry=lambda e: None, clock=clock,
                             capture_stacks=False, log=structlog.get_logger())
    sent = 0
    rejected: dict[str, int] = {}

    async def main() -> None:
        nonlocal sent
        await server.start()
        try:
            path = server.channel(0)
            made_up = iter(range(100000, 103000))
            for _ in range(60):
                at = clock.wall() + 30
                batch = [request(1, at), request(os.getpid(), at), request(sleeper.pid, at)] * 300
                batch += [request(next(made_up), at) for _ in range(50)]
                await pour(path, batch)
                sent += len(batch)
                await asyncio.sleep(1.0)
            rejected.update(server.stats().rejected)
        finally:
            await server.stop()

    try:
        with capture_logs() as logs:
            clock.run(main())
    finally:
        sleeper.kill()
        sleeper.wait()
    lines = refusals(logs)
    assert sent == 60 * 950
    assert accounted(lines) == sent  # every refused request is counted in some line, none lost
    assert rejected == {"foreign_pid": 60 * 650, "other_rank": 60 * 300}
    by_pid = Counter(e["pid"] for e in lines)
    assert by_pid[1] <= 8 and by_pid[os.getpid()] <= 8 and by_pid[sleeper.pid] <= 8  # ~1 per 10 s each
    assert len(lines) <= 2 * (MAX_PIDS + 1) * 8  # the bound: 2 lines per entry per interval, over 7 intervals
    reasons = {e["pid"]: e["reason"] for e in lines}
    assert reasons[1] == "pid 1 (init)" and reasons[os.getpid()] == "the agent itself"
    assert reasons[sleeper.pid] == "a worker of local rank 1, not of this channel's"
