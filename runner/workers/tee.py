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

There too, a Python traceback is held back from its first line (`Traceback (most recent call last):`) until the
agent knows whose it is: the root cause's is echoed (`release`), another rank's folded (`fold`). Its rank's exit
and the agent's choice of the root cause may come after a peer's collateral traceback reached the pipe: holding
it is what makes folding independent of the order of exits. A hold ends without a decision when the rank goes on
writing after the traceback (it caught the exception), and after HOLD_S while it is incomplete or not collateral
(a traceback printed by a rank that lives on); a complete collateral one waits for the decision while its rank
lives, bounded by HOLD_LINES.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO

from runner.diagnosis.evidence import COLLATERAL
from runner.observe.live_line import DIM, LIVE, RESET
from runner.system import thread_signals
from runner.system.pipe_reader import PipeReader
from runner.system.soft_io import close_fd, describe, warn_once, write_all

TRACEBACK_START = re.compile(rb"^(?:\[(?:default)?rank\d+\]:\s?)?Traceback \(most recent call last\):\s*$")
RANK_MARK = re.compile(rb"^\[(?:default)?rank\d+\]:\s?")
# Lines that belong to a traceback being printed, or to the interpreter's end after it (torch's C++ log lines)
CHAINED = re.compile(rb"^(?:$|During handling of the above exception|The above exception was the direct cause"
                     rb"|\s|\[[WEIF]\d{4}|Exception ignored|\^)")
HOLD_S = 5.0  # a traceback not decided upon within this long is echoed (unless collateral and its rank lives)
HOLD_LINES = 2000  # at most; beyond it the traceback is echoed as it comes
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
                thread_signals.start(self._thread)
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
        self._held: list[bytes] | None = None  # a traceback held back until the agent decides whose it is
        self._held_ended = b""  # its exception line, once printed
        self._hold_timer: asyncio.TimerHandle | None = None
        self._holds = self._console is not None and self._console.tty and LIVE.on  # as `fold`: the terminal only
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
            return
        shown: list[bytes] = []
        for line in lines:
            if self._held is None and self._holds and TRACEBACK_START.match(line):
                self._echo(shown)
                shown = []
                self._hold()
            if self._held is None:
                shown.append(line)
            elif self._held_ended and not CHAINED.match(RANK_MARK.sub(b"", line)):
                self._held.append(line)  # the rank goes on after its traceback: it caught the exception
                self.release()
            else:
                self._held.append(line)
                self._note_end(line)
                if len(self._held) >= HOLD_LINES:
                    self.release()
        self._echo(shown)

    def _echo(self, lines: list[bytes]) -> None:
        if lines and self._console is not None:
            self._console.write(b"".join(self._label + line + b"\n" for line in lines))

    def _hold(self) -> None:
        self._held, self._held_ended = [], b""
        with contextlib.suppress(RuntimeError):  # no running loop (a test's tee): held until decided or closed
            self._hold_timer = asyncio.get_running_loop().call_later(HOLD_S, self._hold_expired)

    def _note_end(self, line: bytes) -> None:
        """Remember the held traceback's exception line (its first unindented line after the header)."""
        text = RANK_MARK.sub(b"", line)
        if TRACEBACK_START.match(line):
            self._held_ended = b""
        elif text and not text[:1].isspace() and not CHAINED.match(text):
            self._held_ended = text

    @property
    def holding_collateral(self) -> bool:
        """A complete traceback is held whose exception says a peer died first (gloo's closed connection, ...)."""
        return self._held is not None and bool(COLLATERAL.search(self._held_ended.decode(errors="replace")))

    def _hold_expired(self) -> None:
        self._hold_timer = None
        if self._held is not None and (self.closed or not self.holding_collateral):
            self.release()
        elif self._held is not None:  # collateral, its rank alive: the decision is near; look again later
            self._hold_timer = asyncio.get_running_loop().call_later(HOLD_S, self._hold_expired)

    def drain(self, timeout: float) -> None:
        """Wait up to `timeout` s for what was echoed to reach the console (before the agent writes its next line)."""
        if self._console is not None:
            self._console.drain(timeout)

    def release(self) -> None:
        """Echo the held traceback, if any (this rank's output is not collateral, or nobody decided in time)."""
        held, self._held = self._held, None
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        if held:
            if self._folded_after:
                self.folded += len(held)
            else:
                self._echo(held)
        if held is not None and self.closed:
            self._end_echo()

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
        if self._console is not None and self._console.tty and LIVE.on and not self._folded_after:
            self._folded_after = failed
            self.folded = 0
            if self._held is not None:
                self.release()  # counted, not echoed: folding now
            if self.closed:
                self.unfold()  # the stream ended holding a traceback: its one line now

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
        if self._partial and self._held is not None:
            self._held.append(self._partial)
            self._partial = b""
        if self._held is None:  # a traceback held at the end waits for the decision (`release` or `fold`)
            self._end_echo()
        if self._file is not None and self.lost:
            self._say_lost()  # a last try: the disk may have room again
        close_fd(self._file, "worker_log_close_failed", self._log_path)
        self._file = None
        with contextlib.suppress(OSError):
            self._pipe.close()


    def _end_echo(self) -> None:
        """The stream ended: its last partial line echoed (or counted), its folded lines summed up."""
        if self._partial and self._console is not None and self._folded_after:
            self.folded += 1
        elif self._partial and self._console is not None:
            self._console.write(self._label + self._partial + b"\n")
        self._partial = b""
        self.unfold()


def open_log(path: str) -> int | None:
    """A worker's log file opened for appending (created as `open(path, 'ab')` would).

    None, and a warning, when the disk cannot create it (read-only, out of inodes, its folder missing).
    """
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as e:
        warn_once("worker_log_unwritable", path, e)
        return None
