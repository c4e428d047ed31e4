"""The live line: one line at the bottom of the terminal, redrawn in place while the agent waits.

Only the calm console on a terminal has one (runner/observe/console.py attaches it). Every writer of that terminal (the
agent's events, the workers' tee threads) writes inside `LIVE.writing()`: the line is erased first, the output
goes above it, and the line is drawn again below. So the line never mixes with other output, and a closed terminal
(EPIPE, EIO) turns it off for good, like the rest of the console.

Drawing is cheap and never blocks the agent's loop: an update that finds a writer busy (a terminal that does not
read) is skipped, the next one draws; text that did not change is not written again.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping

ERASE = b"\r\x1b[K"  # back to column 0, clear to the end of the line
RESET, DIM = "\x1b[0m", "\x1b[2m"
CLEAR_WAIT_S = 1.0  # at most, for a busy writer before the line is erased (a wait ended)


class LiveLine:
    """The terminal's one in-place line, shared by every thread that writes to the terminal."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._render: Callable[[Mapping[str, object]], str] | None = None
        self.colors = False  # ANSI styles allowed (a terminal, NO_COLOR unset)
        self.waits = False  # show waits (the console's level lets INFO through)
        self._wanted = ""  # the text the line should show ('' for none)
        self._shown = ""  # the text on the terminal now

    @property
    def on(self) -> bool:
        """True while the calm console writes to a terminal (the line may be drawn, output may be folded)."""
        return self._fd is not None

    def attach(self, fd: int, render: Callable[[Mapping[str, object]], str], *, colors: bool, waits: bool) -> None:
        """Draw on terminal `fd` from now on; `render` turns a wait's fields into the line's text."""
        with self._lock:
            self._fd, self._render, self.colors, self.waits = fd, render, colors, waits

    def detach(self) -> None:
        """No live line (a console that is not the calm one, or a terminal that went away)."""
        with self._lock:
            self._fd, self._render, self._wanted, self._shown = None, None, "", ""

    def update(self, fields: Mapping[str, object]) -> None:
        """Show `fields` (a wait's) rendered; skipped, not waited for, while a writer holds the terminal."""
        render = self._render
        if render is None or not self.waits:
            return
        self._wanted = render(fields)
        if self._lock.acquire(blocking=False):
            try:
                self._sync()
            finally:
                self._lock.release()

    def clear(self) -> None:
        """Erase the line (its wait ended)."""
        self._wanted = ""
        if self._lock.acquire(timeout=CLEAR_WAIT_S):  # else the writer holding it erases it after its write
            try:
                self._sync()
            finally:
                self._lock.release()

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Hold the terminal for one write: the line is erased before, drawn again after."""
        with self._lock:
            if self._shown:
                self._put(ERASE)
                self._shown = ""
            try:
                yield
            finally:
                self._sync()

    def _sync(self) -> None:
        """Make the terminal show `_wanted` (lock held)."""
        wanted = self._wanted
        if wanted == self._shown or self._fd is None:
            return
        if not wanted:
            self._put(ERASE)
        else:
            self._put(ERASE + self._fit(wanted).encode(errors="replace"))
        self._shown = wanted

    def _fit(self, text: str) -> str:
        """`text` cut to the terminal's width (a wrapped line could not be erased), dimmed when colours are on."""
        try:
            width = os.get_terminal_size(self._fd or 0).columns or 80  # 0: a terminal that never said its size
        except OSError:
            width = 80
        if len(text) >= width:
            text = text[: max(1, width - 2)] + "…"
        return f"{DIM}{text}{RESET}" if self.colors else text

    def _put(self, data: bytes) -> None:
        """Write `data` to the terminal; the first error turns the line off for good (lock held)."""
        if self._fd is None:
            return
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError:  # EPIPE, EIO: the terminal went away; the job goes on
            self._fd, self._render, self._wanted = None, None, ""


LIVE = LiveLine()
