"""The one non-blocking pipe reader: a pipe read on the event loop as data arrives, never blocking the agent.

Used for a worker's output (runner/workers/tee.py), a helper's log (runner/system/output_pump.py) and a health
command's output (runner/health/commands.py). Each chunk goes to `on_data`; the end of the pipe (EOF, or a read
error, which ends it the same way) goes to `on_eof`, once. A turn of the loop reads at most MAX_CHUNKS_PER_TURN
chunks, so a writer faster than the agent cannot starve everything else the loop waits for.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

CHUNK = 65536
MAX_CHUNKS_PER_TURN = 16  # 1 MiB per turn of the loop; the loop calls again while the pipe stays readable


class PipeReader:
    """Reads `fd` (a pipe's read end, set non-blocking here) on the running loop until EOF."""

    def __init__(self, fd: int, on_data: Callable[[bytes], None], on_eof: Callable[[], None]) -> None:
        self.fd, self.on_data, self.on_eof = fd, on_data, on_eof
        self.ended = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Read whenever the pipe is readable, on the running loop."""
        os.set_blocking(self.fd, False)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.fd, self.read, MAX_CHUNKS_PER_TURN)

    def read(self, chunks: int | None = None) -> None:
        """Take what the pipe holds now (at most `chunks` chunks; None: until it has nothing more); EOF ends it."""
        done = 0
        while not self.ended and (chunks is None or done < chunks):
            try:
                data = os.read(self.fd, CHUNK)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.stop()
                self.on_eof()
                return
            done += 1
            self.on_data(data)

    @property
    def reading(self) -> bool:
        """Started and not ended (only then is the pipe non-blocking and `read` safe to call)."""
        return self._loop is not None and not self.ended

    def stop(self) -> None:
        """Stop reading (idempotent); the descriptor stays its owner's to close."""
        if self.ended:
            return
        self.ended = True
        if self._loop is not None:
            self._loop.remove_reader(self.fd)
