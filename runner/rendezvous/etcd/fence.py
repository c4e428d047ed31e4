"""A node cut off from etcd and from its peers stops its workers before its lease can lapse (docs/multinode.md).

etcd decides who belongs to a round: when this node's lease expires, the other nodes find it gone and form the
next round without it, with its ranks given to others. A host cut off from the network cannot hear that; its
workers would go on holding their ranks beside their successors. So while a round runs, the fence compares how
long etcd is known to keep the lease (the last keep-alive that etcd acknowledged: its send time plus the TTL
etcd answered) with the clock. When less than a third of the TTL is left (a keep-alive is overdue: normally at
least two thirds are) and etcd has answered no call of this node for a third of the TTL either (an etcd that
answers but lost the lease with its data is the data-loss path's: runner.rendezvous.etcd.backend), it asks whether
the network still reaches a peer of the round (a TCP connection to it, answered or refused: either proves the
path). None reached: this node is the one cut off, and the fence fires
(`on_fenced`), while the lease still holds; the agent stops its workers with at most a sixth of the TTL of grace,
so they are gone before the others can replace them. A peer reached: etcd is what is away, for every node alike
(down, restarting, electing); nobody can form a round without this node, and the workers keep training (the
principle that a side failure never overturns the workers' result). A round without peers (one node) has no one
to ask and no one to conflict with: it is never fenced.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from runner.system import tcp

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

MIN_TICK_S = 0.1


@dataclass(frozen=True)
class Peer:
    """A peer of the round, as the fence reaches it: its node id, and an address resolved while etcd answered."""

    node: str
    host: str
    port: int


async def reachable(peer: Peer, timeout: float) -> bool:
    """Whether the network carries a TCP connection to `peer` within `timeout`: accepted or refused, both say yes."""
    error = await tcp.dial(peer.host, peer.port, timeout)
    return error is None or isinstance(error, ConnectionRefusedError)


Probe = Callable[[Peer, float], Awaitable[bool]]


class Fence:
    """Watches one round's lease; calls `on_fenced(reason)` at most once, when this node is the one cut off."""

    def __init__(self, ttl: float, confirmed_until: Callable[[], float], peers: Sequence[Peer],
                 on_fenced: Callable[[str], None], log: FilteringBoundLogger | None = None, *,
                 answered_at: Callable[[], float] = lambda: 0.0,
                 clock: Callable[[], float] = time.monotonic, probe: Probe = reachable) -> None:
        self.ttl = ttl
        self._confirmed_until, self._peers, self._on_fenced = confirmed_until, tuple(peers), on_fenced
        self._answered_at = answered_at  # etcd's last answer to any call of this node (monotonic)
        self._log = log or structlog.get_logger("runner.rendezvous.etcd.fence")
        self._clock, self._probe = clock, probe
        self._task: asyncio.Task[None] | None = None
        self._said_reachable = False
        self.fired: str | None = None

    @property
    def tick_s(self) -> float:
        """How often the lease's remaining time is compared with the clock."""
        return max(MIN_TICK_S, self.ttl / 12)

    @property
    def probe_timeout_s(self) -> float:
        """How long a peer's connection may take to say the path works (a sixth of the TTL)."""
        return self.ttl / 6

    def start(self) -> None:
        """Watch in the background (nothing happens for a round without peers)."""
        if self._peers and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch(), name="etcd-fence")

    async def stop(self) -> None:
        """Stop watching (the round ended)."""
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.wait({task})

    async def _watch(self) -> None:
        while self.fired is None:
            await asyncio.sleep(self.tick_s)
            await self.check()

    async def check(self) -> bool:
        """One look: True when the fence fired now (this node cut off from etcd and every peer)."""
        if self.fired is not None or not self._peers:
            return False
        now = self._clock()
        left = self._confirmed_until() - now
        if left >= self.ttl / 3:
            self._said_reachable = False
            return False
        if now - self._answered_at() < self.ttl / 3:
            return False  # etcd answers (a lease it lost with its data is the data-loss path's, not a cut)
        answers = await asyncio.gather(*(self._probe(p, self.probe_timeout_s) for p in self._peers))
        reached = [p.node for p, ok in zip(self._peers, answers, strict=True) if ok]
        if reached:
            if not self._said_reachable:
                self._log.warning("etcd_silent_peers_reachable", lease_left_s=round(left, 2), reached=reached,
                                  detail="etcd does not renew this node's lease, yet the network reaches its "
                                         "peers: etcd is away for every node; the workers keep running")
                self._said_reachable = True
            return False
        self.fired = (f"cut off: etcd has not renewed this node's lease for {self.ttl - left:.1f} s (lease_ttl "
                      f"{self.ttl:g} s) and no peer of the round answers "
                      f"({', '.join(f'{p.node} at {p.host}:{p.port}' for p in self._peers)}); the workers stop "
                      "before the lease lapses and the other nodes go on without this one")
        self._log.error("fenced", lease_left_s=round(left, 2), peers=[p.node for p in self._peers])
        self._on_fenced(self.fired)
        return True
