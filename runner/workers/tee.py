"""Tee: copy a worker's pipe to its log file (as is) and to the console (line by line, prefixed).

The log file is the record, written with no buffer of ours: a disk that is full, failing or read-only loses bytes
(counted, and said in the file once it takes more: `[runner] N byte(s) of output lost here: ...`), never the
worker or the echo, and a log file that cannot be created leaves the echo alone.

The console is best effort: it may go away (`runner job.yaml | head`, a closed terminal: EPIPE, EIO) or stop
reading (a paused pager). Console writes happen on one thread per console with a bounded backlog, so the agent's
loop never blocks on them; the first write error ends the echo for good (the job and its log files go on), and a
backlog that overflows drops lines and says how many.

On the calm console's terminal, every write makes room for the live line (observe/live_line.py), and a tee told to
`fold` (its rank's output after a peer's crash: collateral) counts lines instead of echoing them, then says in one
line how many there were and in which log file.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO

from runner.observe.live_line import DIM, LIVE, RESET
from runner.system.pipe_reader import PipeReader
from runner.system.soft_io import close_fd, describe, warn_once, write_all

TAIL_BYTES = 16384  # output kept in memory per stream for the root cause (failures.tail reads as much of a file)
BACKLOG_BYTES = 4 << 20  # console output waiting to be written, at most; beyond it lines are dropped


class Console:
    """One output stream (a file descriptor) written from its own thread; never raises, never blocks the caller."""

    _by_fd: dict[int, Console] = {}  # noqa: RUF012 - one Console per descriptor, shared by every tee
    _lock = threading.Lock()

    def __init__(self, fd: int, backlog: int = BACKLOG_BYTES) -> None:
        self.fd = fd
        self.backlog = backlog
        self.gone: str = ""  # why echoing stopped ('' while it works)
        self.dropped = 0  # lines dropped because the backlog was full
        self._queue: deque[bytes] = deque()
        self._size = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._busy = False  # the thread holds data it has not written yet
        try:
            self.tty = os.isatty(fd)  # a terminal: it may show the live line, collateral output is folded there
        except OSError:
            self.tty = False

    @classmethod
    def of(cls, stream: IO[str]) -> Console | None:
        """The Console of `stream` (sys.stdout, sys.stderr), or None if it has no file descriptor."""
        try:
            fd = stream.fileno()
        except (OSError, ValueError, AttributeError):
            return None
        with cls._lock:
            console = cls._by_fd.get(fd)
            if console is None:  # one gone stays gone: the console does not come back
                console = cls._by_fd[fd] = cls(fd)
            return console

    def write(self, data: bytes) -> None:
        """Queue `data` (whole lines) for the console; dropped when the console is gone or the backlog is full."""
        if self.gone or not data:
            return
        with self._cond:
            if self._size + len(data) > self.backlog:
                self.dropped += data.count(b"\n")
                return
            self._queue.append(data)
            self._size += len(data)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"console-{self.fd}", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                data = self._queue.popleft()
                self._size -= len(data)
                self._busy = True
                if self.dropped:
                    note = f"[runner] {self.dropped} console line(s) dropped: the console did not keep up\n"
                    data = note.encode() + data
                    self.dropped = 0
            try:
                with LIVE.writing() if self.tty else contextlib.nullcontext():
                    view = memoryview(data)
                    while view:
                        view = view[os.write(self.fd, view) :]
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
            except OSError as e:  # EPIPE, EIO, EBADF...: the console went away; the log files go on
                with self._cond:
                    self.gone = os.strerror(e.errno) if e.errno else str(e)
                    self._queue.clear()
                    self._size = 0
                    self._busy = False
                    self._cond.notify_all()
                return

    def drain(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the backlog to be written to the console; True if it was."""
        with self._cond:
            return self._cond.wait_for(lambda: not (self._queue or self._busy) or bool(self.gone), timeout) and not (
                self._queue or self._busy
            )

    @classmethod
    def drain_all(cls, timeout: float) -> None:
        """Give every console up to `timeout` s in all to write its backlog (before the agent exits)."""
        with cls._lock:
            consoles = list(cls._by_fd.values())
        for console in consoles:
            console.drain(timeout / max(1, len(consoles)))


class Tee:
    """Reads `pipe` whenever it is readable; never blocks the agent's loop, never fails because of the console."""

    def __init__(self, pipe: IO[bytes], log_path: str, console: IO[str] | None, label: str,
                 on_lost: Callable[[int], None] | None = None) -> None:
        self.fd = pipe.fileno()
        self._on_lost = on_lost  # told how many bytes the log file refused (the run's count of lost output)
        self._pipe = pipe
        self._log_path = log_path
        self._file = open_log(log_path)  # None when the disk cannot create it: the console still gets the output
        self.lost = 0  # bytes the log file refused since it last took some (a full disk): said in the file later
        self._lost_why = ""
        self._console = Console.of(console) if console is not None else None  # None: the log file only
        self._recent = b""  # the last TAIL_BYTES of output, in memory: the root cause survives a full disk
        self._label = label.encode()
        self._partial = b""
        self._folded_after = ""  # who failed first, while this tee folds its output ('' while it echoes)
        self.folded = 0  # lines folded so far, not yet summed up on the console
        self.closed = False
        self._reader = PipeReader(self.fd, self._write, self.close)
        self._reader.start()

    def _write(self, data: bytes) -> None:
        self._recent = (self._recent + data)[-TAIL_BYTES:]
        self._to_file(data)
        if self._console is None or self._console.gone:
            return
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if lines and self._folded_after:
            self.folded += len(lines)
        elif lines:
            self._console.write(b"".join(self._label + line + b"\n" for line in lines))

    def _to_file(self, data: bytes) -> None:
        """Append `data` to the log file; what a full or failing disk refuses is counted, and said once it takes more.

        Never raises: the worker, its pipe and the console go on whatever the disk does (a warning once per run).
        """
        if self._file is None:
            self._count_lost(len(data))
            return
        if self.lost and not self._say_lost():
            self.lost += len(data)
            self._count_lost(len(data))
            return
        written, error = write_all(self._file, data)
        if error is not None:
            self.lost += len(data) - written
            self._count_lost(len(data) - written)
            self._lost_why = describe(error)
            warn_once("worker_log_write_failed", self._log_path, error)

    def _count_lost(self, size: int) -> None:
        if self._on_lost is not None and size > 0:
            self._on_lost(size)

    def _say_lost(self) -> bool:
        """Write where output went missing (the disk takes bytes again); True when the note was written."""
        assert self._file is not None
        note = f"\n[runner] {self.lost} byte(s) of output lost here: {self._lost_why}\n".encode()
        _, error = write_all(self._file, note)
        if error is not None:
            return False
        self.lost = 0
        return True

    def tail(self, lines: int | None = None) -> str:
        """The last `lines` lines of output (all that is kept when None), from memory, whatever the file took."""
        text = self._recent.decode(errors="replace")
        return text if lines is None else "\n".join(text.splitlines()[-lines:])

    def fold(self, failed: str) -> None:
        """From now on count lines instead of echoing them: collateral output after `failed` (e.g. 'rank 0') failed.

        Only on the calm console's terminal; elsewhere (JSON lines, a pipe, a file) the output is echoed as ever.
        The log file always gets everything.
        """
        if not self.closed and self._console is not None and self._console.tty and LIVE.on:
            self._folded_after = failed
            self.folded = 0

    def unfold(self) -> None:
        """Echo again; the lines folded so far become one line on the console."""
        if not self._folded_after:
            return
        if self._console is not None and self.folded:
            path = "/".join(Path(self._log_path).parts[-3:])  # attempt_<k>/rank_<r>/stderr.log
            note = f"{self.folded} line(s) of collateral output (after {self._folded_after} failed), in {path}"
            if LIVE.colors:
                note = f"{DIM}{note}{RESET}"
            self._console.write(self._label + note.encode(errors="replace") + b"\n")
        self._folded_after, self.folded = "", 0

    def finish(self) -> None:
        """Read what the pipe holds now (the worker has exited; descendants may still write until EOF)."""
        if not self.closed:
            self._reader.read()

    def close(self) -> None:
        """Echo the last partial line and release everything (idempotent; never raises)."""
        if self.closed:
            return
        self.closed = True
        self._reader.stop()
        if self._partial and self._console is not None and self._folded_after:
            self.folded += 1
        elif self._partial and self._console is not None:
            self._console.write(self._label + self._partial + b"\n")
        self.unfold()
        if self._file is not None and self.lost:
            self._say_lost()  # a last try: the disk may have room again
        close_fd(self._file, "worker_log_close_failed", self._log_path)
        self._file = None
        with contextlib.suppress(OSError):
            self._pipe.close()


def open_log(path: str) -> int | None:
    """A worker's log file opened for appending (created as `open(path, 'ab')` would).

    None, and a warning, when the disk cannot create it (read-only, out of inodes, its folder missing).
    """
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as e:
        warn_once("worker_log_unwritable", path, e)
        return None
