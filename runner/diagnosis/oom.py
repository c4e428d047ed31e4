"""Evidence that the kernel's OOM killer killed a worker: its cgroup's oom_kill count, or the kernel log.

Exit code 137 (SIGKILL) alone is a hint, not proof: anyone may send SIGKILL. Evidence is either the worker's own
cgroup counting an OOM kill (memory.events, cgroup v2 with the memory controller), or a kernel log record
(/dev/kmsg) naming the worker's pid as killed by the OOM killer after the worker started. The kernel log is read
without blocking and with a bound; where it cannot be read (no permission, no /dev/kmsg) there is no evidence.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from runner.system import procs
from runner.system.cgroup import JobCgroup

if TYPE_CHECKING:
    from runner.diagnosis.failure import Failure

KMSG = Path("/dev/kmsg")
MAX_RECORDS = 50_000  # records read from the kernel log at most (its ring buffer is bounded too)
MAX_BYTES = 8 * 1024 * 1024
RECORD_BYTES = 8192  # a kmsg read returns one record; a shorter buffer fails with EINVAL
# The kernel's words: 'Out of memory: Killed process 123 (python)' (also after 'Memory cgroup '), and the
# one-line summary 'oom-kill:constraint=...,task=python,pid=123,uid=0'.
_KILLED = re.compile(r"(?:out of memory: Killed process (\d+)\b|^oom-kill:.*\bpid=(\d+)\b)", re.IGNORECASE)


def kernel_log_kill(pid: int, since_us: int = 0, path: Path = KMSG) -> str:
    """The kernel log record saying the OOM killer killed `pid` at or after `since_us` (microseconds since boot).

    "" when there is none, or the log cannot be read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return ""
    found, seen, size = "", 0, 0
    try:
        while seen < MAX_RECORDS and size < MAX_BYTES:
            try:
                raw = os.read(fd, RECORD_BYTES)
            except OSError as e:
                if e.errno == errno.EPIPE:  # records were overwritten while we read: go on with the next
                    continue
                break  # EAGAIN: the end; anything else: no more evidence to be had
            if not raw:
                break
            seen, size = seen + 1, size + len(raw)
            record = match_record(raw.decode(errors="replace"), pid, since_us)
            if record:
                found = record  # keep the latest
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    return found


def match_record(record: str, pid: int, since_us: int) -> str:
    """The message of one kmsg record ("prio,seq,usec,flags;message") if it names `pid` as OOM-killed."""
    header, sep, body = record.partition(";")
    if not sep:
        return ""
    fields = header.split(",")
    try:
        usec = int(fields[2])
    except (IndexError, ValueError):
        return ""
    message = body.split("\n", 1)[0].strip()
    m = _KILLED.search(message)
    if m is None or usec < since_us or int(m.group(1) or m.group(2)) != pid:
        return ""
    return message


def boot_us(start_ticks: int) -> int:
    """A process start time (clock ticks after boot, /proc/<pid>/stat) in microseconds, as kmsg stamps records."""
    return start_ticks * 1_000_000 // os.sysconf("SC_CLK_TCK")


def evidence(pid: int, cgroup: Path | None, start_ticks: int | None) -> str:
    """Why we believe the OOM killer killed the worker `pid` (or one of its processes); "" when nothing says so."""
    if cgroup is not None:
        kills = JobCgroup.oom_kills(cgroup)
        if kills:
            return f"the worker's cgroup counts {kills} OOM kill(s) ({cgroup / 'memory.events'})"
    if start_ticks is None:  # without the start time an old record of a recycled pid could match: no evidence
        return ""
    record = kernel_log_kill(pid, boot_us(start_ticks))
    return f"kernel log: {record}" if record else ""


def classed(failure: Failure, pid: int, cgroup: Path | None) -> Failure:
    """`failure` of the worker `pid` (unreaped: its cgroup and /proc entry remain) classed `oom` on evidence.

    The kernel log is read only for a SIGKILL, the OOM killer's signal, and only with the worker's start time (it
    tells this worker's record from a recycled pid's); the cgroup's count also catches a killed child (a DataLoader
    worker) of a worker that then exited with an error.
    """
    stat = procs.read_stat(pid) if failure.exit_code == -signal.SIGKILL else None
    return failure.with_oom_evidence(evidence(pid, cgroup, stat.start_time if stat is not None else None))
