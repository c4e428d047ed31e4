"""HeartbeatMonitor with real files and a real event loop (generous timeouts, no tight timing)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from runner.watchdog.heartbeat import ENV_VAR, HeartbeatMonitor, beat


def test_beat_touches_the_file_named_in_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """beat() creates/touches $RUNNER_HEARTBEAT_FILE and is a no-op without it."""
    target = tmp_path / "hb"
    monkeypatch.delenv(ENV_VAR, raising=False)
    beat()
    assert not target.exists()
    monkeypatch.setenv(ENV_VAR, str(target))
    beat()
    assert target.exists()


def test_silent_worker_is_reported_and_beating_worker_is_not(tmp_path: Path) -> None:
    """Of two watched workers, only the one that stops touching its file is reported, once."""
    silent: list[tuple[int, float]] = []

    async def main() -> None:
        reported = asyncio.Event()
        monitor = HeartbeatMonitor(1.0, lambda rank, s: (silent.append((rank, s)), reported.set()))
        alive, quiet = tmp_path / "alive", tmp_path / "quiet"
        monitor.watch(0, alive)
        monitor.watch(1, quiet)
        quiet.touch()

        async def keep_beating() -> None:
            while True:
                beat(str(alive))
                await asyncio.sleep(0.05)

        beater = asyncio.create_task(keep_beating())
        try:
            await asyncio.wait_for(reported.wait(), 30)
            await asyncio.sleep(1.5)  # past rank 0's deadline too, had it been silent
        finally:
            beater.cancel()
            monitor.clear()

    asyncio.run(main())
    assert [rank for rank, _ in silent] == [1]
    assert silent[0][1] >= 1.0


def test_clear_stops_reporting(tmp_path: Path) -> None:
    """After clear() a worker that was watched is never reported."""
    silent: list[int] = []

    async def main() -> None:
        monitor = HeartbeatMonitor(0.2, lambda rank, s: silent.append(rank))
        monitor.watch(0, tmp_path / "never")
        monitor.clear()
        await asyncio.sleep(0.5)

    asyncio.run(main())
    assert silent == []
