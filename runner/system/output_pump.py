"""A helper process's output, copied by the agent into a log file that may refuse writes.

A helper (the hosted lighthouse) that writes its log itself dies when the logs disk is full: its own write fails
(torchft_lighthouse exits 120). Given a pipe instead, it never sees the disk; the agent drains the pipe on its event
loop and appends to the file, fail soft (one warning per kind, docs/faults.md): a full disk loses log lines, never
the helper.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from runner.system import soft_io
from runner.system.pipe_reader import PipeReader


class OutputPump:
    """The read end of a helper's stdout/stderr pipe, copied into `path` until EOF; `write_fd` goes to the helper."""

    def __init__(self, path: Path, warning: str) -> None:
        """`warning`: the kind of the one warning given when the file refuses a write."""
        self.path, self.warning = path, warning
        self._read, self.write_fd = os.pipe2(os.O_CLOEXEC)
        self._file: int | None = None
        self._reader = PipeReader(self._read, self._append, self.close)
        self._writer_open = True

    def start(self) -> None:
        """Once the helper holds the write end: close ours and copy what arrives, on the running loop."""
        self._close_writer()
        self._reader.start()

    def _append(self, data: bytes) -> None:
        try:
            if self._file is None:
                self._file = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            os.write(self._file, data)
        except OSError as e:  # a full or read-only disk: these lines are lost, the helper goes on
            soft_io.warn_once(self.warning, self.path, e)

    def _close_writer(self) -> None:
        if self._writer_open:
            os.close(self.write_fd)
            self._writer_open = False

    def close(self) -> None:
        """Stop copying (idempotent); what is still in the pipe is read first."""
        self._close_writer()  # the helper never started: nobody else holds it
        if self._read < 0:
            return
        if self._reader.reading:
            self._reader.read()  # what the helper wrote last; at EOF this calls close() itself
            if self._read < 0:
                return
        self._reader.stop()
        os.close(self._read)
        self._read = -1
        if self._file is not None:
            with contextlib.suppress(OSError):
                os.close(self._file)
            self._file = None
