"""Writes that never take the agent down: a full, failing or read-only disk is a warning, never a crash.

What the agent, its guard and the tee write (agent.jsonl, transitions.jsonl, status.json, report.json, failure
files, spec.json, the workers' log files, the runs index, standby logs, the hosted etcd's log) is a record of the
job, never the job itself. ENOSPC, EDQUOT, EIO, EROFS, EACCES... at open, write, flush or close end (or pause) that
one record: the failure is logged once per kind as a structlog warning and kept in `failures()` for the summary,
and the job's result stands.

The failures are kept per scope (`WarnOnce`, the one warn-once facility): the process's, and, inside `scoped()` (a
replica group's run, and every task and callback it starts), the scope's own too. `failures()` answers for the scope
it is asked in: a replica group's report lists its own write failures, the job's report every one of the process.

Appends go through `write_all` on an O_APPEND descriptor, never a userspace buffer: a write that failed leaves
nothing behind that a later flush or close would try (and fail) again.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

class WarnOnce:
    """The warnings of one scope (the process, a run, a replica group): each kind logged the first time, kept in order.

    The one warn-once facility: a run's side failures (a status write, etcd, a report) through `warn`, and the
    writes the disk refused (`warn_once` below) through `note`, which also keeps the first failure's detail.
    Bounded: one entry per kind, and the kinds are the code's own event names.
    """

    def __init__(self, log: FilteringBoundLogger | None = None) -> None:
        """`log`: where its warnings go (None: the `runner` logger, looked up when one is given)."""
        self.log = log
        self.seen: list[str] = []  # every kind warned of, in order
        self.details: dict[str, str] = {}  # the writes refused: kind -> "path: error" of its first failure

    def warn(self, kind: str, **fields: object) -> None:
        """Log `kind` the first time it happens here and keep it for the report."""
        with _lock:
            if kind in self.seen:
                return
            self.seen.append(kind)
        (self.log or structlog.get_logger("runner")).warning(kind, **fields)

    def note(self, kind: str, detail: str) -> bool:
        """Keep a refused write of kind `kind` without logging it; True the first time here."""
        with _lock:
            if kind in self.details:
                return False
            self.details[kind] = detail
            if kind not in self.seen:
                self.seen.append(kind)
            return True


_lock = threading.Lock()  # the tee's console threads never write files, but a warning may come from any thread
_process = WarnOnce()  # every scope's failures, and those of code in none
_scope: contextvars.ContextVar[WarnOnce | None] = contextvars.ContextVar("soft_io_scope", default=None)


def describe(error: OSError | str) -> str:
    """`No space left on device` (the errno's text), or the error's own words when it has none."""
    if isinstance(error, str):
        return error
    if error.errno is not None and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__


def note(kind: str, path: object, error: OSError | str) -> bool:
    """Keep the failure for the summary without logging it (for the log's own sink); True the first time.

    The first time in the process: the current scope keeps its own first failure of each kind as well.
    """
    detail = f"{path}: {describe(error)}"
    scope = _scope.get()
    if scope is not None:
        scope.note(kind, detail)
    return _process.note(kind, detail)


def warn_once(kind: str, path: object, error: OSError, **fields: object) -> None:
    """A write of kind `kind` (`worker_log_write_failed`...) failed: a warning the first time, kept for the summary."""
    if note(kind, path, error):
        structlog.get_logger("runner").warning(kind, path=str(path), error=describe(error), **fields)


def failures() -> dict[str, str]:
    """Every kind of write that failed in this scope (the process's outside any), with its first failure."""
    scope = _scope.get()
    with _lock:
        return dict((scope or _process).details)


def forget() -> None:
    """Start counting afresh (tests; one process running several agents)."""
    with _lock:
        _process.details.clear()
        _process.seen.clear()


@contextlib.contextmanager
def scoped(scope: WarnOnce) -> Iterator[None]:
    """Keep the write failures of the code run inside (and of the tasks and callbacks it starts) in `scope` too."""
    token = _scope.set(scope)
    try:
        yield
    finally:
        _scope.reset(token)


def write_all(fd: int, data: bytes) -> tuple[int, OSError | None]:
    """Write all of `data` to `fd`: (bytes written, None), or (bytes written before it, the error) when one failed."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        try:
            n = os.write(fd, view[done:])
        except InterruptedError:
            continue
        except OSError as e:
            return done, e
        if n == 0:  # never for a regular file; a device that takes nothing is a full one
            return done, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        done += n
    return done, None


def write_whole(fd: int, data: bytes) -> None:
    """Write all of `data` to `fd`, or raise the OSError that stopped it (some bytes may be written by then)."""
    _, error = write_all(fd, data)
    if error is not None:
        raise error


def close_fd(fd: int | None, kind: str, path: object) -> None:
    """Close `fd` (None: nothing); a failure (EIO, ENOSPC on NFS) is a warning: the descriptor is gone anyway."""
    if fd is None:
        return
    try:
        os.close(fd)
    except OSError as e:
        warn_once(kind, path, e)
