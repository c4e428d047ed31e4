"""Process identity on Linux: /proc/<pid>/stat, pidfds, and signals that reach only processes proven to be ours.

A pid names a process only while that process (or its zombie) exists; once reaped, the number can go to anyone.
A pidfd names one process for good. So every signal sent from here goes through a pidfd, and whatever identifies a
process as ours (its process group, its session, a tag in its environment) is read *after* the pidfd is open and
confirmed by the process still existing *after* the read: the read was about the process the pidfd names.

Standard library only: the shepherd imports this module with site-packages disabled (`python -S -I`).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
TAG_VAR = "RUNNER_WORKER_TAG"  # every worker's environment carries its tag; its descendants inherit it


@dataclass(frozen=True)
class Stat:
    """The fields of /proc/<pid>/stat that identify a process and where it belongs."""

    pid: int
    comm: str
    state: str  # R, S, D (uninterruptible), Z (zombie), T (stopped)...
    ppid: int
    pgid: int
    sid: int
    start_time: int  # clock ticks after boot: with the pid, an identity no later process can have


def parse_stat(text: str) -> Stat:
    """Parse one /proc/<pid>/stat line; comm may hold spaces and parentheses, so split at the last ')'."""
    head, sep, tail = text.rpartition(")")
    pid_text, paren, comm = head.partition(" (")
    fields = tail.split()
    if not sep or not paren or len(fields) < 20:
        msg = f"not a /proc/<pid>/stat line: {text[:80]!r}"
        raise ValueError(msg)
    return Stat(
        pid=int(pid_text),
        comm=comm,
        state=fields[0],
        ppid=int(fields[1]),
        pgid=int(fields[2]),
        sid=int(fields[3]),
        start_time=int(fields[19]),
    )


def read_stat(pid: int) -> Stat | None:
    """The process's stat, or None once it is gone (reaped)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return parse_stat(f.read())
    except (OSError, ValueError):
        return None


def wchan(pid: int) -> str:
    """The kernel function the process sleeps in ('' when running or unknown)."""
    try:
        with open(f"/proc/{pid}/wchan", encoding="utf-8", errors="replace") as f:
            text = f.read().strip()
    except OSError:
        return ""
    return "" if text == "0" else text


def cmdline(pid: int, limit: int = 200) -> str:
    """The process's command line, NULs as spaces, at most `limit` characters."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(limit + 1)
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:limit]


def environ_has(pid: int, entry: bytes) -> bool:
    """True if `entry` (b'NAME=value', or a prefix of one) starts one of the process's environment strings."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return False
    return any(item.startswith(entry) for item in data.split(b"\0"))


def holds_open(pid: int, targets: set[str]) -> bool:
    """True if process `pid` has an open descriptor whose /proc link is one of `targets` (a path, `socket:[inode]`)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in targets:
                return True
        except OSError:
            continue
    return False


def pids() -> Iterator[int]:
    """Every pid in /proc (this pid namespace)."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def exit_code(result: os.waitid_result) -> int:
    """Exit code as Popen reports it: negative -N when killed by signal N."""
    return result.si_status if result.si_code == os.CLD_EXITED else -result.si_status


def describe(pid: int) -> dict[str, object]:
    """What a report says about a process: pid, state, wchan and command line."""
    st = read_stat(pid)
    return {"pid": pid, "state": st.state if st else "gone", "wchan": wchan(pid), "cmd": cmdline(pid)}


def pidfd(pid: int) -> int | None:
    """A pidfd for `pid`, or None if no such process."""
    try:
        return os.pidfd_open(pid)
    except (OSError, OverflowError, ValueError):  # no such process; not a pid at all
        return None


def exists(fd: int) -> bool:
    """True while the process the pidfd names exists (running, stopped, or a zombie not yet reaped)."""
    try:
        signal.pidfd_send_signal(fd, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def send(fd: int, sig: int) -> bool:
    """Signal the process the pidfd names; False if it is gone (or not ours to signal)."""
    try:
        signal.pidfd_send_signal(fd, sig)
    except OSError:
        return False
    return True


def exited(fd: int) -> bool:
    """True once the process the pidfd names has exited (the pidfd is readable), without waiting."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def wait_exited(fds: list[int], timeout: float, clock: Callable[[], float] = time.monotonic) -> list[int]:
    """Block until every pidfd in `fds` shows an exit or `timeout` s pass; the pidfds whose process still runs."""
    deadline = clock() + timeout
    left = [fd for fd in fds if not exited(fd)]
    while left and clock() < deadline:
        poller = select.poll()
        for fd in left:
            poller.register(fd, select.POLLIN)
        poller.poll(max(1, min(100, int((deadline - clock()) * 1000))))
        left = [fd for fd in left if not exited(fd)]
    return left


def signal_matching(match: Callable[[int], bool], sig: int, skip: frozenset[int] = frozenset()) -> dict[int, int]:
    """Send `sig` to every process for which `match(pid)` holds, proven so through a pidfd; {pid: pidfd} signalled.

    `match` reads /proc/<pid>/... ; it runs after the pidfd is open, and the process must still exist after it,
    so what it read was the process the pidfd names, not a later one that got the same pid. The caller closes the
    returned pidfds (see close_all).
    """
    me = os.getpid()
    hit: dict[int, int] = {}
    for pid in pids():
        if pid == me or pid in skip:
            continue
        fd = pidfd(pid)
        if fd is None:
            continue
        if match(pid) and exists(fd) and send(fd, sig):
            hit[pid] = fd
        else:
            os.close(fd)
    return hit


def close_all(fds: dict[int, int]) -> None:
    """Close the pidfds of a signal_matching result."""
    for fd in fds.values():
        with contextlib.suppress(OSError):
            os.close(fd)


def in_session(leader: int, leader_fd: int) -> Callable[[int], bool]:
    """Match processes of the process group or session that `leader` (a worker: leader of both) started.

    The leader must still exist (alive, or a zombie not yet reaped) *after* the member's stat is read: until it is
    reaped no other process can get its id, so a group or session of that id is still the leader's.
    """

    def match(pid: int) -> bool:
        st = read_stat(pid)
        return st is not None and leader in (st.pgid, st.sid) and exists(leader_fd)

    return match


def tag_entry(tag: str) -> bytes:
    """The environment entry (or entry prefix, for a job-wide tag) a tagged process carries."""
    return f"{TAG_VAR}={tag}".encode()


def tagged(tag: str) -> Callable[[int], bool]:
    """Match processes whose environment carries `tag` (a worker's, or the job-wide prefix of all of them)."""
    entry = tag_entry(tag)
    return lambda pid: environ_has(pid, entry)


def set_child_subreaper() -> bool:
    """Make this process the child subreaper: orphaned descendants reparent to it, not to init. True if set."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def is_child_subreaper() -> bool:
    """True if this process is the child subreaper (orphaned descendants reparent to it)."""
    import ctypes

    flag = ctypes.c_int(0)
    return _prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag)) and flag.value != 0


def _prctl(option: int, arg: object) -> bool:
    """prctl(option, arg, 0, 0, 0); True when it succeeded (False too when libc has no prctl)."""
    import ctypes  # here: only the agent calls this, the guard imports this module too

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, arg, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def pidfd_pid(fd: int) -> int | None:
    """The pid of the process a pidfd names (its /proc/self/fdinfo `Pid:` line); None when gone or not a pidfd."""
    try:
        with open(f"/proc/self/fdinfo/{fd}", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Pid:"):
                    pid = int(line.split()[1])
                    return pid if pid > 0 else None
    except (OSError, ValueError, IndexError):
        return None
    return None
