"""Files and folders only their owner can read: the run dir (0700) and what the agent writes in it (0600).

The modes are set explicitly, whatever the umask, and an existing file or folder is narrowed too. Files written
whole (spec.json, status.json, report.json, failure.json) are replaced atomically: a reader sees the old content
or the new, never half of it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

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
    """Write `text` to `path` atomically with mode 0600 (a temporary file in the same folder, then a rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(3).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def open_private_append(path: Path) -> IO[str]:
    """`path` opened for appending text (created 0600; an existing file is narrowed to 0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        return os.fdopen(fd, "a", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise
