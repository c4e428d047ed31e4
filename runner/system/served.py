"""What the agent needs of a helper server it runs itself (the hosted etcd, the TorchFT lighthouse).

Waiting for its exit through its pidfd (no polling, never reaped here), the end of its log for error messages, and
a listening check that proves the socket is the process's own, not merely someone's on this machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from pathlib import Path

from runner.system import procs

LOG_TAIL_BYTES = 2000
TCP_LISTEN = "0A"  # the state column of a listening socket in /proc/net/tcp


async def exited(pidfd: int) -> None:
    """Wait until the process of `pidfd` exits (the pidfd turns readable); it is not reaped."""
    loop, done = asyncio.get_running_loop(), asyncio.Event()
    loop.add_reader(pidfd, done.set)
    try:
        await done.wait()
    finally:
        loop.remove_reader(pidfd)


def log_tail(path: Path, limit: int = LOG_TAIL_BYTES) -> str:
    """The last `limit` bytes of a log file, decoded ('' when it cannot be read)."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def last_line(text: str) -> str:
    """The last non-empty line of `text` ('' when none), at most 500 characters."""
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][-500:] if lines else ""


def describe_exit(code: int) -> str:
    """'exit code N' or 'signal NAME'."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


def tcp_listeners(table: str) -> list[tuple[str, int, int]]:
    """(address, port, socket inode) of each listening socket in the text of /proc/net/tcp or tcp6.

    Lines that are not well formed are skipped: the parser never fails, whatever the text.
    """
    found: list[tuple[str, int, int]] = []
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != TCP_LISTEN:
            continue
        hex_ip, _, hex_port = fields[1].partition(":")
        try:
            found.append((hex_address(hex_ip), int(hex_port, 16), int(fields[9])))
        except ValueError:
            continue
    return found


def hex_address(text: str) -> str:
    """An address as /proc/net/tcp{,6} writes it (32-bit words in host order, here little-endian) in text form."""
    if len(text) not in (8, 32):
        msg = f"not an address: {text!r}"
        raise ValueError(msg)
    raw = b"".join(bytes.fromhex(text[i:i + 8])[::-1] for i in range(0, len(text), 8))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)


def listens(pid: int, port: int) -> bool:
    """Whether process `pid` itself holds a socket listening on TCP `port` (not merely someone on this machine)."""
    inodes: set[int] = set()
    for name in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            inodes |= {i for _, p, i in tcp_listeners(Path(f"/proc/{pid}/net/{name}").read_text()) if p == port}
    return bool(inodes) and procs.holds_open(pid, {f"socket:[{i}]" for i in inodes})
