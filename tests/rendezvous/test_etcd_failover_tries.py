"""A failover does not wait out a silent member (runner/rendezvous/etcd/client.py: FAILOVER_TRY_S, SUSPECT_S).

A member whose host is cut off, or one in an election, accepts a connection and never answers: the kernel (or
etcd, holding a new connection's authentication until a leader is elected) keeps it open. When the connection a
session uses fails, each endpoint gets a short first try (FAILOVER_TRY_S), and one that just failed is tried after
the others. Found on a loaded machine (tests/rendezvous/test_hosted_members.py, a member host cut): the first try after the
failover went to the member in an election and waited 5 s (OP_TIMEOUT_S), a lease's whole TTL, while the other
member answered at once; the node's lease lapsed and the survivors took it for lost.

The silent endpoint here is a real TCP listener that accepts and holds every connection, counting them.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import structlog
from rdzv_helpers import run

from runner.rendezvous.etcd.client import FAILOVER_TRY_S, OP_TIMEOUT_S, Credentials, EtcdSession
from runner.testing.etcd_server import EtcdServer

pytestmark = pytest.mark.integration


class Silent:
    """A TCP endpoint that accepts every connection and never sends a byte; `accepted` counts them."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()
        self.thread.join(5)


@pytest.fixture
def silent() -> Iterator[Silent]:
    s = Silent()
    yield s
    s.close()


def test_a_failover_gives_a_silent_member_one_short_try_then_tries_it_last(etcd: EtcdServer, silent: Silent) -> None:
    """Connected to the live etcd; the connection fails over: the silent member, next in turn, costs one short try
    (not OP_TIMEOUT_S), the live one is reached; a second failover within SUSPECT_S skips the silent one."""
    async def body() -> None:
        session = EtcdSession([etcd.endpoint, f"127.0.0.1:{silent.port}"], Credentials(), connect_timeout=20,
                              probe_key=b"/probe", log=structlog.get_logger("test"))
        session.prefer(session.endpoints[0])
        await session.connect()
        assert session.current == session.endpoints[0]
        try:
            started = time.monotonic()
            await session.reconnect(session.generation)  # the connection in use failed: silent is next in turn
            took = time.monotonic() - started
            assert silent.accepted >= 1  # it was tried (else this test proves nothing)
            assert session.current == session.endpoints[0]
            assert took < OP_TIMEOUT_S - 1, took  # one short try (FAILOVER_TRY_S), not the whole operation timeout
            tried = silent.accepted
            await session.reconnect(session.generation)  # again, within SUSPECT_S: the silent one is tried last
            assert session.current == session.endpoints[0]
            assert silent.accepted == tried, "a member that just failed was tried before the live one"
        finally:
            await session.close()

    assert FAILOVER_TRY_S < OP_TIMEOUT_S - 1
    run(body)

