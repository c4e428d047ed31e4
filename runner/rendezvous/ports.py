"""The one free-port lookup of the project: a TCP port the kernel says is free right now.

Import it from here (`from runner.rendezvous.ports import free_port`): the local and etcd backends use it
for each round's MASTER_PORT candidate, and runner/testing/etcd_server.py for etcd's own ports.
"""

from __future__ import annotations

import socket
from collections.abc import Container

# A handful of draws is plenty: the kernel hands out ports from a large ephemeral range.
MAX_DRAWS = 16


def free_port(host: str = "", avoid: Container[int] = ()) -> int:
    """A TCP port free on `host` ("" = every interface) right now, not in `avoid` when the kernel allows.

    `avoid` holds ports that must not be reused (the previous round's MASTER_PORT, so that nothing of the
    previous attempt's store is reachable in the next one).
    """
    port = 0
    for _ in range(MAX_DRAWS):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in avoid:
            return port
    return port
