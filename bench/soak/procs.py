"""Processes seen through /proc: identity (pid and start time), children, signals through a pidfd after proof."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.common import argv_of


@dataclass(frozen=True)
class Proc:
    """One process for good: its pid and its start time in clock ticks (a recycled pid has a later one)."""

    pid: int
    ticks: int


def stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start ticks) of `pid`, None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[19])


def ident(pid: int) -> Proc | None:
    """The process that has `pid` now."""
    st = stat(pid)
    return Proc(pid, st[2]) if st else None


def running(p: Proc) -> bool:
    """`p` still exists and is not a zombie."""
    st = stat(p.pid)
    return st is not None and st[2] == p.ticks and st[0] != "Z"


def parent_of(p: Proc) -> Proc | None:
    """`p`'s parent now (None: `p` is gone); a parent that ended as it was read has start time 0 (never running)."""
    st = stat(p.pid)
    if st is None or st[2] != p.ticks:
        return None
    return ident(st[1]) or Proc(st[1], 0)


def gone(p: Proc, parent: Proc | None) -> bool:
    """`p` is gone for good: reaped (no longer in /proc, or its pid taken by another process), or a zombie whose
    parent, `parent` (read when the soak hit `p`), is gone too, so that whoever adopted it reaps it (this soak: the
    agents' child subreaper). A zombie whose parent still runs is not gone: a dead child stays a zombie until its
    parent waits for it, and a runner that never waits for its killed worker leaks it. `running()` is not enough: it
    is False for a zombie, whatever its parent does."""
    st = stat(p.pid)
    if st is None or st[2] != p.ticks:
        return True
    if st[0] != "Z":
        return False
    return parent is not None and (st[1] != parent.pid or not running(parent))


def environ_of(pid: int) -> list[bytes]:
    """The environment `pid` was started with, one b'KEY=VALUE' each."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def children_of(pid: int) -> list[int]:
    """Direct children of `pid` (every thread's list)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f:
                out.extend(int(p) for p in f.read().split())
    return out


def descendants_of(pid: int) -> list[int]:
    """Every descendant of `pid` now."""
    todo, seen = children_of(pid), []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo.extend(children_of(p))
    return seen


def all_pids() -> list[int]:
    """Every pid in /proc."""
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def signal_proven(p: Proc, sig: int, proof: Callable[[int], bool]) -> bool:
    """Send `sig` to `p` through a pidfd, only if, with the pidfd open, /proc still shows p's start time and
    `proof(pid)` holds: the checks are about the process the pidfd names, so a recycled pid is never signalled."""
    try:
        fd = os.pidfd_open(p.pid)
    except OSError:
        return False
    try:
        st = stat(p.pid)
        if st is None or st[2] != p.ticks or st[0] == "Z" or not proof(p.pid):
            return False
        signal.pidfd_send_signal(fd, sig)
    except OSError:
        return False
    else:
        return True
    finally:
        os.close(fd)


def describe(p: Proc) -> str:
    """pid, state, parent and command line, for a violation's evidence."""
    st = stat(p.pid)
    state = f"{st[0]}, ppid {st[1]}" if st else "gone"
    if st and st[0] == "Z":
        state += ": a zombie its parent has not waited for"
    return f"pid {p.pid} ({state}): {' '.join(argv_of(p.pid))[:160]}"


def set_subreaper() -> None:
    """Orphans of the agents (a SIGKILLed agent's guard and workers) reparent to this process: seen and reaped."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def reap_orphans(mine: set[int]) -> None:
    """Reap zombie children that are not ours to wait for (orphans reparented to this subreaper)."""
    for pid in children_of(os.getpid()):
        if pid not in mine and (st := stat(pid)) is not None and st[0] == "Z":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def port_listening(port: int) -> bool:
    """Something listens on TCP `port` on this machine (any address)."""
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            text = Path(name).read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines()[1:]:
            parts = line.split()
            if len(parts) > 3 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False
