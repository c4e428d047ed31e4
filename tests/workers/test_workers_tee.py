"""The tee when the console goes away: a real pipe closed early (`runner job.yaml | head`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import wait_for

from runner.workers.tee import Console, Tee

pytestmark = pytest.mark.integration
LINES = 20000


def test_closed_console_pipe_keeps_the_log_and_stops_echoing(tmp_path: Path) -> None:
    """The console's reader exits after one line: the tee never raises, the log file gets every line."""
    reader = subprocess.Popen(["head", "-n", "1"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    assert reader.stdin is not None
    console = open(reader.stdin.fileno(), "w", closefd=False)  # noqa: SIM115 - closed below
    log = tmp_path / "stdout.log"
    writer = subprocess.Popen(
        [sys.executable, "-c", f"import sys\nfor i in range({LINES}): print('line', i)"], stdout=subprocess.PIPE
    )

    async def main() -> Tee:
        assert writer.stdout is not None
        tee = Tee(writer.stdout, str(log), console, "[0] ")
        while not tee.closed:
            await asyncio.sleep(0.01)
        return tee

    try:
        tee = asyncio.run(main())
        reader.wait(timeout=60)
        writer.wait(timeout=60)
        c = Console.of(console)
        assert c is not None
        wait_for(lambda: bool(c.gone), what="the console writer to see EPIPE")  # echo stopped for good
        assert tee.closed
        assert log.read_text().splitlines() == [f"line {i}" for i in range(LINES)]
    finally:
        for p in (reader, writer):
            p.kill()
            p.wait()
        console.close()
        reader.stdin.close()


def test_full_console_never_blocks_and_drops_with_a_count(tmp_path: Path) -> None:
    """A console nobody reads (a paused pager) fills its pipe: writes never block; beyond the backlog lines drop."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(w, b"x" * 4096)  # the pipe is full: nobody reads
    os.set_blocking(w, True)
    try:
        console = Console(w, backlog=4096)
        for _ in range(200):
            console.write(b"x" * 1023 + b"\n")  # returns at once; past the 4 KiB backlog lines are dropped
        assert console.dropped > 0
        assert not console.drain(0.2)  # still stuck: the drain is bounded
    finally:
        os.close(r)  # the reader goes away: the writer thread gets EPIPE and stops
    wait_for(lambda: bool(console.gone), what="the writer thread to stop")
    os.close(w)
