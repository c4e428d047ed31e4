"""HeartbeatMonitor with real files on an autojump clock: silence is timed on the monotonic clock, never
by comparing a file's mtime with the wall clock."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from runner.watchdog.clock import AutojumpClock
from runner.watchdog.heartbeat import ENV_VAR, HeartbeatMonitor, beat, signature

DAY_NS = 86400 * 10**9


def test_beat_touches_the_file_named_in_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """beat() creates/touches $RUNNER_HEARTBEAT_FILE and is a no-op without it."""
    target = tmp_path / "hb"
    monkeypatch.delenv(ENV_VAR, raising=False)
    beat()
    assert not target.exists()
    monkeypatch.setenv(ENV_VAR, str(target))
    beat()
    assert target.exists()


def test_signature_changes_on_touch_rewrite_and_replace(tmp_path: Path) -> None:
    """A touch (new mtime), a write (new size) and an atomic replace (new inode) are all changes."""
    path = tmp_path / "hb"
    assert signature(path) is None
    path.write_text("a")
    first = signature(path)
    os.utime(path, ns=(1, 1))
    second = signature(path)
    path.write_text("ab")
    third = signature(path)
    (tmp_path / "new").write_text("ab")
    os.utime(tmp_path / "new", ns=(1, 1))
    os.replace(tmp_path / "new", path)
    assert len({first, second, third, signature(path)}) == 4


class Beater:
    """Stands for a worker: changes its file every `every` virtual seconds, each time with a distinct mtime.

    The mtime is set explicitly (a touch within the same file-system tick would not change it, and virtual
    time runs far faster than real time); `skew_ns` makes the mtimes look hours in the past or future.
    """

    def __init__(self, path: Path, every: float, skew_ns: int = 0) -> None:
        self.path, self.every, self.skew_ns, self.beats = path, every, skew_ns, 0

    async def run(self, count: int) -> None:
        for _ in range(count):
            self.path.touch()
            self.beats += 1
            stamp = 1_700_000_000 * 10**9 + self.beats * 10**6 + self.skew_ns
            os.utime(self.path, ns=(stamp, stamp))
            await asyncio.sleep(self.every)


def test_a_silent_worker_is_reported_after_the_timeout_and_a_beating_one_never(tmp_path: Path) -> None:
    """Of two watched workers, only the one whose file stops changing is reported, once, not before 10 s."""
    clock = AutojumpClock()
    silent: list[tuple[int, float, float]] = []

    async def main() -> None:
        monitor = HeartbeatMonitor(10.0, lambda r, s: silent.append((r, s, clock.monotonic())), clock=clock)
        alive, quiet = tmp_path / "alive", tmp_path / "quiet"
        monitor.watch(0, alive)
        monitor.watch(1, quiet)
        beater = asyncio.create_task(Beater(alive, 1.0).run(1000))
        await Beater(quiet, 1.0).run(3)  # beats at 0, 1, 2, then silence
        await asyncio.sleep(9.9 - 3)
        assert silent == []
        await asyncio.sleep(600)
        beater.cancel()
        monitor.clear()

    clock.run(main())
    ((rank, silent_s, at),) = silent
    assert rank == 1
    assert 10.0 <= silent_s <= 10.0 + 2.5 + 1e-6  # never early; at most one check interval (timeout/4) late
    assert 12.0 <= at <= 2 + 10 + 2.5 + 1e-6


@pytest.mark.parametrize("skew_ns", [-DAY_NS, DAY_NS])
def test_wall_clock_steps_in_mtimes_neither_hide_a_hang_nor_fake_one(tmp_path: Path, skew_ns: int) -> None:
    """mtimes a day in the past (clock stepped back) or future (stepped forward): a live worker stays alive,
    a hung one is still reported after the timeout. Comparing mtime with time.time() gets one of them wrong."""
    clock = AutojumpClock()
    silent: list[int] = []

    async def main() -> None:
        monitor = HeartbeatMonitor(5.0, lambda r, s: silent.append(r), clock=clock)
        live, hung = tmp_path / "live", tmp_path / "hung"
        monitor.watch(0, live)
        monitor.watch(1, hung)
        hung_beat = asyncio.create_task(Beater(hung, 1.0, skew_ns).run(1))
        await Beater(live, 1.0, skew_ns).run(60)
        await hung_beat
        monitor.clear()

    clock.run(main())
    assert silent == [1]


def test_a_file_that_appears_late_counts_and_a_missing_one_is_silent(tmp_path: Path) -> None:
    """No file yet: silence counts from watch(); its creation is a sign of life."""
    clock = AutojumpClock()
    silent: list[tuple[int, float]] = []

    async def main() -> None:
        monitor = HeartbeatMonitor(4.0, lambda r, s: silent.append((r, clock.monotonic())), clock=clock)
        monitor.watch(0, tmp_path / "late")
        monitor.watch(1, tmp_path / "never")
        await asyncio.sleep(3)
        (tmp_path / "late").touch()
        await asyncio.sleep(30)

    clock.run(main())
    assert [r for r, _ in silent] == [1, 0]
    assert 4.0 <= silent[0][1] <= 5.0 + 1e-6
    assert 7.0 <= silent[1][1] <= 3 + 1 + 4 + 1 + 1e-6


def test_other_activity_counts_as_a_beat(tmp_path: Path) -> None:
    """activity(rank) (the timer server's last request from that rank) postpones the report like a beat does."""
    clock = AutojumpClock()
    silent: list[float] = []
    last: dict[int, float] = {}

    async def main() -> None:
        monitor = HeartbeatMonitor(4.0, lambda r, s: silent.append(clock.monotonic()), clock=clock, activity=last.get)
        monitor.watch(0, tmp_path / "never")
        await asyncio.sleep(3)
        last[0] = clock.monotonic()
        await asyncio.sleep(30)

    clock.run(main())
    assert len(silent) == 1
    assert 7.0 <= silent[0] <= 8.0 + 1e-6


def test_clear_stops_reporting(tmp_path: Path) -> None:
    """After clear() a worker that was watched is never reported, and nothing stays scheduled."""
    clock = AutojumpClock()
    silent: list[int] = []

    async def main() -> None:
        monitor = HeartbeatMonitor(0.2, lambda rank, s: silent.append(rank), clock=clock)
        monitor.watch(0, tmp_path / "never")
        monitor.clear()
        await asyncio.sleep(60)

    clock.run(main())
    assert silent == []


def test_a_progress_monitor_times_only_workers_that_reported_a_step(tmp_path: Path) -> None:
    """progress_timeout: touches are no progress, a new step is; a worker that never reported a step is not timed."""
    from runner.watchdog.steps import reported_step

    clock = AutojumpClock()
    stalled: list[tuple[int, float]] = []

    async def main() -> None:
        monitor = HeartbeatMonitor(5.0, lambda r, s: stalled.append((r, clock.monotonic())), clock=clock,
                                   sign=reported_step, first_sign=True, event="progress_stalled")
        for rank in (0, 1, 2):
            (tmp_path / f"hb{rank}").touch()
            monitor.watch(rank, tmp_path / f"hb{rank}")
        (tmp_path / "hb0").write_text('{"step": 1}')  # rank 0: one step, then only touches
        for step in range(2, 8):  # rank 1: a new step every 2 s
            await asyncio.sleep(2)
            (tmp_path / "hb1").write_text(f'{{"step": {step}}}')
            os.utime(tmp_path / "hb0")
            os.utime(tmp_path / "hb2")  # rank 2: touches only, never a step: not timed
        await asyncio.sleep(60)

    clock.run(main())
    assert [r for r, _ in stalled] == [0, 1]
    assert 5.0 <= stalled[0][1] <= 5.0 + 1.25 + 1e-6  # one check interval late at most
    assert stalled[1][1] >= 12 + 5.0


def test_a_worker_that_never_beat_is_not_timed_and_is_told_once(tmp_path: Path) -> None:
    """first_sign (heartbeat_timeout): a worker is timed from its first beat. Two workers that never touch their
    file are never reported, and on_unsent hears once, for the first of them, `timeout` after its start; timer
    activity before a first beat times nobody. A worker that beat once and then went silent is still reported."""
    clock = AutojumpClock()
    silent: list[tuple[int, float]] = []
    unsent: list[tuple[int, float]] = []
    last: dict[int, float] = {}

    async def main() -> None:
        monitor = HeartbeatMonitor(4.0, lambda r, s: silent.append((r, clock.monotonic())), clock=clock,
                                   activity=last.get, first_sign=True,
                                   on_unsent=lambda r, s: unsent.append((r, s)))
        for rank, name in enumerate(("never0", "never1", "once")):
            monitor.watch(rank, tmp_path / name)
        await asyncio.sleep(2)
        last[0] = clock.monotonic()  # a timer request from rank 0 at 2 s: no heartbeat, so it neither times nor hides
        await asyncio.sleep(1)
        (tmp_path / "once").touch()  # rank 2's only beat, at 3 s
        await asyncio.sleep(600)

    clock.run(main())
    assert [r for r, _ in silent] == [2]
    assert 3.0 + 4.0 <= silent[0][1] <= 3.0 + 1.0 + 4.0 + 1.0 + 1e-6  # seen at a check (<= 1 s late), then timed
    assert len(unsent) == 1
    assert unsent[0][0] == 0 and 4.0 <= unsent[0][1] <= 4.0 + 1.0 + 1e-6  # rank 0: its timer request did not count
