"""Files and folders only their owner can read: the run dir (0700) and what the agent writes in it (0600).

The modes are set explicitly, whatever the umask, and an existing file or folder is narrowed too. Files written
whole (spec.json, status.json, report.json, failure.json) are replaced atomically: a reader sees the old content
or the new, never half of it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import IO

from runner.system.soft_io import write_whole

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Create `path` (and missing parents) and make `path` itself 0700; returns `path`.

    Parents are created with the usual mode: the 0700 leaf is what keeps everything below it private.
    """
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    os.chmod(path, DIR_MODE)
    return path


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` atomically with mode 0600 (a temporary file in the same folder, then a rename).

    Raises OSError when the disk cannot take it (full, read-only, failing): the caller warns and goes on. Nothing is
    left behind then: no temporary file, no open descriptor, no buffered data a later flush would retry.
    """
    data = text.encode("utf-8")  # before anything is created: text that cannot be encoded leaves nothing
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(3).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    try:
        try:
            write_whole(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def open_private_fd(path: Path) -> int:
    """`path` opened for appending (O_APPEND, created 0600; an existing file is narrowed to 0600): a descriptor.

    Only a regular file is narrowed: a device or FIFO met there (/dev/full in a test) keeps its mode.
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_private_append(path: Path) -> IO[str]:
    """`path` opened for appending text (created 0600; an existing file is narrowed to 0600)."""
    fd = open_private_fd(path)
    try:
        return os.fdopen(fd, "a", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise
