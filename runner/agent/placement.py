"""Where a job of replica groups runs on this node: its groups, its seat, the lighthouse.

Placement apart from the supervisor's machine (runner/agent/replicas.py) and its books (replica_books.py).

One node runs every group and hosts the lighthouse (or uses the spec's address). Several nodes (etcd): the seat the
rendezvous gives this node (runner/rendezvous/etcd/seats.py) names its one group; seat (0, 0) hosts the lighthouse
and publishes its address, the others read it and follow it. When its host is lost (its address gone with its
lease), the first follower to claim the address hosts a new one and the others follow that. At the end the
lighthouse's host lingers until no other node holds a seat, so the groups still finishing keep their quorum.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from runner.agent.lighthouse import START_TIMEOUT_S as START_S
from runner.agent.lighthouse import HostedLighthouse, LighthouseError
from runner.config.torchft_version import matching_lighthouse
from runner.errors import RunnerError
from runner.system import tcp
from runner.system.shepherd import Shepherd

if TYPE_CHECKING:
    import structlog

    from runner.agent.replica_group import Group
    from runner.config.spec import JobSpec
    from runner.rendezvous.etcd.seats import GroupSeat

LIGHTHOUSE_POLL_S = 1.0  # several nodes: how often the published lighthouse address is read
PROBE_S = 1.0  # a group's next attempt: how long the lighthouse it would use has to accept a connection
SETTLE_POLL_S = 0.2  # then, how often it looks whether another was published
LINGER_S = 60.0  # the lighthouse's host waits at most this long for the other nodes to end
LINGER_POLL_S = 0.5


class Placement:
    """This node's part of the job: its seat (several nodes) and the lighthouse it hosts, if any."""

    def __init__(self, spec: JobSpec, node: str, addr: str, run_dir: Path, log: structlog.typing.FilteringBoundLogger,
                 reaper: Shepherd, on_lighthouse_gone: Callable[[str], None]) -> None:
        """Nothing started yet; `take()` places the node.

        `addr`: where the other nodes reach this one; `on_lighthouse_gone`: the hosted lighthouse could not be
        restarted (why).
        """
        assert spec.replica_groups is not None
        self.spec, self.node, self.addr, self.run_dir, self.log = spec, node, addr, run_dir, log
        self.groups_spec = spec.replica_groups
        self.reaper, self.on_lighthouse_gone = reaper, on_lighthouse_gone
        self.seat: GroupSeat | None = None  # several nodes (etcd): which group this node runs
        self.lighthouse: HostedLighthouse | None = None  # the one this node hosts
        self.address: str | None = None  # the lighthouse's address the groups use now

    @property
    def follows(self) -> bool:
        """Several nodes with a hosted lighthouse on another node: its address is followed (and taken over)."""
        return self.seat is not None and self.lighthouse is None and self.groups_spec.lighthouse.hosted

    async def take(self) -> tuple[list[int], str]:
        """The groups this node runs and the lighthouse's address.

        One node: every group, and the lighthouse is hosted here. Several (etcd): the seat the rendezvous gives this
        node names its one group; seat (0, 0) hosts the lighthouse and publishes its address, the others read it.
        """
        light = self.groups_spec.lighthouse
        if self.spec.rendezvous.backend == "local":
            return list(range(self.groups_spec.count)), await self.lighthouse_address()
        from runner.rendezvous.etcd.seats import GroupSeat  # etcd's client only where used

        self.seat = GroupSeat(self.spec, self.node, self.log)
        await self.seat.open(self.reaper)
        k, _ = await self.seat.take()
        if not light.hosted:
            return [k], await self.lighthouse_address()
        if self.seat.hosts_lighthouse_first and (address := await self.host_lighthouse()) is not None:
            return [k], address
        return [k], await self.seat.wait_lighthouse()

    async def host_lighthouse(self) -> str | None:
        """Start a lighthouse here and publish its address if no other is: its address (this node hosts it).

        None when another node's is published (the one started here is stopped again).
        """
        assert self.seat is not None
        address = await self.lighthouse_address(advertise=self.addr)
        lighthouse = self.lighthouse
        assert lighthouse is not None
        try:
            if await self.seat.claim_lighthouse(address):
                return address
        except BaseException:
            self.lighthouse = None
            await lighthouse.stop()
            raise
        self.lighthouse = None
        await lighthouse.stop()
        return None

    async def lighthouse_address(self, advertise: str | None = None) -> str:
        """The hosted lighthouse's address once it listens (reached at `advertise` by other nodes), or the spec's."""
        light = self.groups_spec.lighthouse
        if not light.hosted:
            assert light.address is not None  # the spec's checks require one
            return light.address.rstrip("/")
        program, unchecked = await asyncio.to_thread(matching_lighthouse, self.spec, os.environ)  # the workers' TorchFT
        for why in unchecked:
            self.log.warning("torchft_version_unchecked", detail=why)
        if program is None:
            raise LighthouseError("a hosted lighthouse needs `torchft_lighthouse`, not found",
                                  fix="pip install 'runner[ft]'")
        self.lighthouse = HostedLighthouse(program, light, self.groups_spec.min_active, self.run_dir, self.log,
                                           advertise=advertise)
        self.lighthouse.on_gone = self.on_lighthouse_gone
        await self.lighthouse.start()
        return self.lighthouse.address

    async def settled(self) -> None:
        """Before a group's next attempt: wait until the groups' lighthouse answers or another is published.

        Either it accepts a connection, or another was published (the follow loop then gave it to every group), or
        the time its host's address takes to go and a new one to come passed (lease_ttl + 2 polls + the start): the
        attempt then runs with what there is.

        So a group whose quorum timed out because the lighthouse's host was lost restarts once, on the new one,
        not once on the old address and again on the new.
        """
        address = self.address
        if address is None or await answers(address, PROBE_S):
            return
        self.log.info("lighthouse_unreachable", address=address, detail="the group's next attempt waits for its "
                      "lighthouse to answer or move")
        deadline = time.monotonic() + self.spec.rendezvous.lease_ttl + 2 * LIGHTHOUSE_POLL_S + START_S
        while self.address == address and time.monotonic() < deadline:
            await asyncio.sleep(SETTLE_POLL_S)
            if await answers(address, PROBE_S):
                return

    async def follow_lighthouse(self, address: str, groups: Callable[[], Sequence[Group]]) -> None:
        """Several nodes: when the lighthouse moved, the group's next attempt uses the new address.

        When its host is lost (no address published), this node tries to host the next one; the first to claim does.
        """
        assert self.seat is not None
        self.address = address
        while True:
            await asyncio.sleep(LIGHTHOUSE_POLL_S)
            try:
                latest = await self.seat.read_lighthouse()
                if latest is None:
                    latest = await self.host_lighthouse()
                    if latest is not None:
                        self.log.warning("lighthouse_taken_over", address=latest, lost=address,
                                         detail="the lighthouse's host was lost: this node hosts the next one")
            except RunnerError as e:  # etcd away for a while: the groups run on; the next poll tries again
                self.log.warning("lighthouse_address_unread", error=e.message)
                continue
            if latest is None or latest == address:
                continue
            address = latest
            self.log.warning("lighthouse_moved", address=address, detail="the next attempt of each group uses it")
            for g in groups():
                replica = g.ctx.inputs.replica
                assert replica is not None
                g.ctx.inputs = dataclasses.replace(g.ctx.inputs, replica=dataclasses.replace(replica,
                                                                                             lighthouse=address))
            self.address = address  # after every group has it: a group's settled() may go on now
            if self.lighthouse is not None:  # hosted here now: nothing more to follow
                return

    async def leave(self, hurried: Callable[[], bool]) -> None:
        """Stop the hosted lighthouse (its host first waits for the other nodes to end) and free the seat."""
        if self.lighthouse is not None:
            if self.seat is not None:
                await self.linger(hurried)
            await self.lighthouse.stop()
        if self.seat is not None:
            await self.seat.close()

    async def linger(self, hurried: Callable[[], bool]) -> None:
        """The lighthouse's host: wait until no other node holds a seat (LINGER_S at most; not once hurried).

        The groups still finishing their last steps keep their quorum.
        """
        assert self.seat is not None
        deadline = time.monotonic() + LINGER_S
        while time.monotonic() < deadline and not hurried():
            try:
                others = await self.seat.others_seated()
            except RunnerError:
                return
            if not others:
                return
            self.log.info("lighthouse_waiting_for_nodes", nodes=others, at_most_s=round(deadline - time.monotonic()))
            await asyncio.sleep(LINGER_POLL_S)


async def answers(address: str, timeout: float) -> bool:
    """Whether `address` (http://host:port) accepts a TCP connection within `timeout` seconds."""
    where = urlsplit(address)
    if where.hostname is None or where.port is None:
        return False
    return await tcp.dial(where.hostname, where.port, timeout) is None
