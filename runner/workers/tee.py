"""Tee: copy a worker's pipe to its log file (as is) and to the console (line by line, prefixed)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import IO

_CHUNK = 65536


class Tee:
    """Reads `pipe` whenever it is readable; never blocks the agent's loop."""

    def __init__(self, pipe: IO[bytes], log_path: str, console: IO[str], label: str) -> None:
        self.fd = pipe.fileno()
        self._pipe = pipe
        os.set_blocking(self.fd, False)
        self._file = open(log_path, "ab")  # noqa: SIM115 - closed at EOF
        self._console = console.buffer if hasattr(console, "buffer") else None
        self._label = label.encode()
        self._partial = b""
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.fd, self._read)
        self.closed = False

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.fd, _CHUNK)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self.close()
                return
            self._write(data)
        self._file.flush()

    def _write(self, data: bytes) -> None:
        self._file.write(data)
        if self._console is None:
            return
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if lines:
            out = b"".join(self._label + line + b"\n" for line in lines)
            with contextlib.suppress(OSError):
                self._console.write(out)
                self._console.flush()

    def finish(self) -> None:
        """Read what the pipe holds now (the worker has exited; descendants may still write until EOF)."""
        if not self.closed:
            self._read()

    def close(self) -> None:
        """Flush the last partial line and release everything (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self.fd)
        if self._partial and self._console is not None:
            with contextlib.suppress(OSError):
                self._console.write(self._label + self._partial + b"\n")
                self._console.flush()
        self._file.close()
        self._pipe.close()
