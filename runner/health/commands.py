"""Run one check command: its own process group, killed whole at its timeout, its output bounded in memory.

The command runs in a new session (so a new process group, led by it). Its exit is seen on a pidfd without reaping
it, so while the group is signalled its leader is at least a zombie of ours and the group id cannot name anyone
else's processes. Once the command has exited, or its time is up, or the try is cancelled, the whole group gets
SIGKILL: a check leaves nothing running behind it (a process that left the group with setsid is beyond reach; the
pipes it holds are given up after DRAIN_WAIT_S). Only the last `tail_bytes` of stdout and of stderr are kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Protocol

from runner.system import thread_signals
from runner.system.pipe_reader import PipeReader

MAX_TAIL_BYTES = 8192  # of stdout and of stderr, each
KILL_WAIT_S = 2.0  # for the killed leader to be gone (one in uninterruptible sleep may take longer: left to a thread)
DRAIN_WAIT_S = 0.5  # for the pipes to close once the group is killed


class ProcessGuard(Protocol):
    """What kills our processes if the agent dies (runner.system.shepherd.Shepherd has this shape)."""

    def watch(self, pid: int) -> None:
        """Kill `pid` (and its group) if the agent dies; called while it is not reaped."""
        ...

    def forget(self, pid: int) -> None:
        """`pid` is about to be reaped."""
        ...


@dataclass(frozen=True)
class CommandResult:
    """How a command ended. `exit_code` is None when it could not start or was killed at its timeout."""

    exit_code: int | None
    stdout: bytes = b""  # the last bytes only
    stderr: bytes = b""
    duration_s: float = 0.0
    timed_out: bool = False
    error: str = ""  # why it could not start

    def output(self) -> str:
        """Its stderr as text, else its stdout (what a reason quotes)."""
        return (self.stderr or self.stdout).decode("utf-8", errors="replace")


class Tail:
    """The last `limit` bytes read from a pipe, read as they come (non-blocking, on the loop)."""

    def __init__(self, pipe: IO[bytes], limit: int) -> None:
        self.fd = pipe.fileno()
        self.pipe = pipe
        self.limit = limit
        self.data = bytearray()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.reader = PipeReader(self.fd, self.keep, self.close)
        self.reader.start()

    def keep(self, chunk: bytes) -> None:
        """Keep the chunk (only the last `limit` bytes are kept, bounded at twice that meanwhile)."""
        self.data += chunk
        if len(self.data) > 2 * self.limit:
            del self.data[: -self.limit]

    def close(self) -> None:
        """Stop reading and close our end."""
        if not self.closed.done():
            self.reader.stop()
            self.pipe.close()
            self.closed.set_result(None)

    def bytes(self) -> bytes:
        """What was kept."""
        return bytes(self.data[-self.limit :])


async def run_command(
    argv: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str],
    cwd: str | None = None,
    tail_bytes: int = MAX_TAIL_BYTES,
    guard: ProcessGuard | None = None,
) -> CommandResult:
    """Run `argv` in a process group of its own, at most `timeout` seconds; cancelling kills it too."""
    started = time.monotonic()
    try:
        proc = _spawn(argv, env, cwd)
    except OSError as e:
        return CommandResult(None, error=f"cannot start {argv[0]}: {e.strerror or e}")
    pidfd = os.pidfd_open(proc.pid)  # ours until reaped: nobody else reaps it
    if guard is not None:
        guard.watch(proc.pid)
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()

    def on_exit() -> None:
        loop.remove_reader(pidfd)  # readable for good from now on
        if not ended.done():
            ended.set_result(None)

    loop.add_reader(pidfd, on_exit)
    assert proc.stdout is not None
    assert proc.stderr is not None
    tails = (Tail(proc.stdout, tail_bytes), Tail(proc.stderr, tail_bytes))
    timed_out = False
    try:
        done, _ = await asyncio.wait({ended}, timeout=timeout)
        timed_out = not done
    finally:
        code = await _end(proc, pidfd, ended, tails, guard)
    return CommandResult(
        None if timed_out else code,
        stdout=tails[0].bytes(),
        stderr=tails[1].bytes(),
        duration_s=time.monotonic() - started,
        timed_out=timed_out,
    )


def _spawn(argv: Sequence[str], env: Mapping[str, str], cwd: str | None) -> subprocess.Popen[bytes]:
    """Start `argv` in a new session, stdout and stderr piped (a fork and exec: no wait on the loop)."""
    return subprocess.Popen(
        list(argv), cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip


async def _end(
    proc: subprocess.Popen[bytes], pidfd: int, ended: asyncio.Future[None], tails: tuple[Tail, Tail],
    guard: ProcessGuard | None,
) -> int | None:
    """Kill the group (the leader is not reaped yet), wait a little for the leader and the pipes, reap, tidy up.

    A cancel during the waits still tidies up (and is then passed on).
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        await asyncio.wait({ended}, timeout=KILL_WAIT_S)
        await asyncio.wait([t.closed for t in tails], timeout=DRAIN_WAIT_S)
    finally:
        asyncio.get_running_loop().remove_reader(pidfd)
        for tail in tails:
            tail.close()
        if ended.done():
            if guard is not None:
                guard.forget(proc.pid)
            proc.wait()  # a zombie by now: at once
            os.close(pidfd)
        else:  # stuck in the kernel even after SIGKILL (uninterruptible sleep): reap it whenever it goes
            thread_signals.start(threading.Thread(target=_reap_later, args=(proc, pidfd), daemon=True))
    return proc.returncode


def _reap_later(proc: subprocess.Popen[bytes], pidfd: int) -> None:
    # The guard is not told (it is not thread-safe); it proves a pid is still ours (start time) before signalling.
    proc.wait()
    os.close(pidfd)
