"""Free disk space and free memory.

A file system that hangs (a dead NFS server) blocks `statvfs` in the kernel, so `free_space` runs in a daemon
thread (`off_loop`): the agent's loop goes on, the try's timeout reports the check as unfinished, and a thread
stuck for good never holds up the agent's exit.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from runner.config.sizes import format_size
from runner.health.report import HealthFailure
from runner.system import thread_signals

T = TypeVar("T")
MEMINFO = Path("/proc/meminfo")


async def off_loop(work: Callable[[], T]) -> T:
    """`work()` in a daemon thread of its own (never joined at exit, unlike asyncio.to_thread's pool)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(value: T | None, error: BaseException | None) -> None:
        if done.done():
            return  # the caller gave up (timeout, cancel)
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(value)  # type: ignore[arg-type]

    def target() -> None:
        try:
            value = work()
        except Exception as e:  # handed to the awaiting task, which words it
            loop.call_soon_threadsafe(settle, None, e)
        else:
            loop.call_soon_threadsafe(settle, value, None)

    thread_signals.start(threading.Thread(target=target, name="runner-health", daemon=True))
    return await done


def existing(path: str) -> Path:
    """`path`, or its nearest parent that exists (a checkpoint folder the job has not made yet)."""
    here = Path(path)
    while not here.exists() and here != here.parent:
        here = here.parent
    return here


def free_space(path: str) -> tuple[Path, int]:
    """(the folder measured, bytes an unprivileged user may still write there: statvfs f_bavail * f_frsize)."""
    where = existing(path)
    st = os.statvfs(where)
    return where, st.f_bavail * st.f_frsize


async def check_space(path: str, min_free: int) -> list[HealthFailure]:
    """A failure unless `path`'s file system has `min_free` bytes free."""
    try:
        where, free = await off_loop(lambda: free_space(path))
    except OSError as e:
        return [HealthFailure("disk", f"cannot measure its free space: {e.strerror or e}", path)]
    if free >= min_free:
        return []
    at = "" if str(where) == path else f" (at {where}, it does not exist yet)"
    return [HealthFailure("disk", f"{format_size(free)} free{at}, needs {format_size(min_free)}", path)]


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo as {field: value}: bytes for the fields in kB, plain counts for the others (HugePages_Total).

    Lines that are not `Name: number [kB]` are skipped.
    """
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        parts = rest.split()
        if not sep or not name or not parts or not parts[0].isascii() or not parts[0].isdigit() or len(parts) > 2:
            continue
        if len(parts) == 2 and parts[1] != "kB":
            continue
        out[name.strip()] = int(parts[0]) * (1024 if len(parts) == 2 else 1)
    return out


def check_memory(min_free: int, meminfo: Path = MEMINFO) -> list[HealthFailure]:
    """A failure unless MemAvailable (what can be allocated without swapping) is at least `min_free` bytes."""
    try:
        available = parse_meminfo(meminfo.read_text(encoding="ascii", errors="replace")).get("MemAvailable")
    except OSError as e:
        return [HealthFailure("memory", f"cannot read {meminfo}: {e.strerror or e}")]
    if available is None:
        return [HealthFailure("memory", f"{meminfo} has no MemAvailable (Linux 3.14 or later has it)")]
    if available >= min_free:
        return []
    return [HealthFailure("memory", f"{format_size(available)} available, needs {format_size(min_free)}")]
