"""This node's seat among the replica groups of a multi-node job (docs/replica_groups.md#several-nodes), in etcd.

With etcd, each node runs one group's share. The rendezvous assigns it: seats `{job}/seats/<k>/<i>` (group k's
i-th node) are taken in order, group 0 first, each with one transaction that puts the seat on this node's lease
only if it is free. A node that dies frees its seat when its lease ends (at once when its guard revokes it), and
a node started in its place takes that seat: the group it joins is the one that lost a node.

The lighthouse's address is published on its host's lease, by a transaction that puts it only where none is: one
host at a time. The node in seat (0, 0) hosts it first; the other nodes read it. If its host is lost, the address
goes with its lease, and the first surviving node to claim the key hosts a new lighthouse (a replacement in seat
(0, 0) finds it published and follows it); each group's next attempt reads the new address (docs/replica_groups.md,
the failure modes).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from runner.errors import RendezvousError
from runner.rendezvous.etcd.client import absent, key_range, prefix_range, put_op
from runner.rendezvous.etcd.connect import new_session
from runner.rendezvous.etcd.keys import JobKeys
from runner.rendezvous.etcd.lease import LeaseKeeper, revoke_ticket

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

    from runner.config.spec import JobSpec
    from runner.rendezvous.etcd.client import EtcdSession
    from runner.system.shepherd import Shepherd

POLL_S = 0.2  # while every seat is taken, or the lighthouse's address is not published yet
MAX_ADDRESS_BYTES = 1024  # a lighthouse value longer than this is no address


class GroupSeat:
    """Takes a seat (which group this node runs), publishes or reads the lighthouse's address, frees the seat."""

    def __init__(self, spec: JobSpec, node: str, log: FilteringBoundLogger) -> None:
        assert spec.replica_groups is not None
        self.spec, self.node, self.log = spec, node, log
        self.keys = JobKeys(spec.rendezvous.prefix, spec.name)
        self.count = spec.replica_groups.count
        self.per_group = spec.replica_groups.nodes_per_group
        self.taken: tuple[int, int] | None = None
        self._session: EtcdSession | None = None
        self._lease: LeaseKeeper | None = None

    @property
    def hosts_lighthouse_first(self) -> bool:
        """Whether this node is the one that hosts the lighthouse when the job starts (seat 0 of group 0)."""
        return self.taken == (0, 0)

    async def open(self, guard: Shepherd) -> None:
        """Connect and take a lease; `guard` revokes it if this agent dies (so the seat is free at once)."""
        self._session = new_session(self.spec, self.log)
        await self._session.connect()
        self._lease = LeaseKeeper(self._session, self.spec.rendezvous.lease_ttl, self.log)
        self._lease.watch(guard.revoke_at_death, revoke_ticket(self.spec))
        await self._lease.grant()

    @property
    def session(self) -> EtcdSession:
        """The open session."""
        if self._session is None:
            msg = "GroupSeat.open() was not called"
            raise RendezvousError(msg)
        return self._session

    async def take(self) -> tuple[int, int]:
        """The first free seat, in order (group, index); waits while every seat is taken (rendezvous.join_timeout).

        A job that was stopped or ended is not joined (JobClosed).
        """
        assert self._lease is not None
        deadline = time.monotonic() + self.spec.rendezvous.join_timeout
        order = [(k, i) for k in range(self.count) for i in range(self.per_group)]
        while True:
            _, (control, held) = await self.session.call(lambda c: c.snapshot(
                [key_range(self.keys.control), prefix_range(self.keys.seats)]))
            self.keys.check_open(control[0].value if control else None)
            taken = {bytes(kv.key) for kv in held}
            mine = [kv for kv in held if int(kv.lease) == self._lease.lease_id]  # a retried txn that had succeeded
            for k, i in order:
                if mine and self.keys.seat(k, i) == bytes(mine[0].key):
                    self.taken = (k, i)
                    return k, i
                key = self.keys.seat(k, i)
                if key in taken:
                    continue
                if await self._claim(key):
                    self.taken = (k, i)
                    self.log.info("replica_seat_taken", group=k, seat=i, of=self.per_group)
                    return k, i
                break  # another node took it first: read the seats again
            else:
                if time.monotonic() > deadline:
                    msg = (f"every seat of the {self.count} replica group(s) x {self.per_group} node(s) is taken "
                           f"after {self.spec.rendezvous.join_timeout:g} s")
                    raise RendezvousError(msg, fix="start no more than nodes = count x nodes_per_group agents")
                await asyncio.sleep(POLL_S)

    async def _claim(self, key: bytes, value: bytes | None = None) -> bool:
        """Put `key` (`value`, else this node's name) on this node's lease if it is free; whether it was."""
        assert self._lease is not None
        put = put_op(key, value if value is not None else self.node.encode("utf-8", "surrogatepass"),
                     self._lease.lease_id)
        done = await self.session.call(lambda c: c.txn([absent(key)], [put]))
        return bool(done.succeeded)

    async def claim_lighthouse(self, address: str) -> bool:
        """Publish this node's lighthouse `address` on its lease if no other is: whether this node now hosts it.

        The address goes with the lease, i.e. with this node.
        """
        assert self._lease is not None
        if not await self._claim(self.keys.lighthouse, address.encode()):
            return False
        await self._lease.put(self.keys.lighthouse, address.encode())  # remembered: put again after a re-grant
        return True

    async def read_lighthouse(self) -> str | None:
        """The published lighthouse address, or None while there is none (or its value is not an address)."""
        kv = await self.session.call(lambda c: c.get(self.keys.lighthouse))
        if kv is None or len(kv.value) > MAX_ADDRESS_BYTES:
            return None
        text = bytes(kv.value).decode("utf-8", "replace")
        return text if text.startswith(("http://", "https://")) and text.isprintable() else None

    async def wait_lighthouse(self) -> str:
        """The lighthouse's address once its host published it (rendezvous.join_timeout)."""
        deadline = time.monotonic() + self.spec.rendezvous.join_timeout
        while True:
            address = await self.read_lighthouse()
            if address is not None:
                return address
            if time.monotonic() > deadline:
                msg = (f"no lighthouse address was published within {self.spec.rendezvous.join_timeout:g} s "
                       "(the node in seat 0 of group 0 hosts it first)")
                raise RendezvousError(msg, fix="start that node too, or run the lighthouse yourself and set "
                                      "replica_groups.lighthouse.address")
            await asyncio.sleep(POLL_S)

    async def others_seated(self) -> int:
        """How many seats other nodes hold now (the lighthouse's host waits for them to end before it stops it)."""
        _, (held,) = await self.session.call(lambda c: c.snapshot([prefix_range(self.keys.seats)]))
        mine = self.keys.seat(*self.taken) if self.taken is not None else b""
        return sum(1 for kv in held if bytes(kv.key) != mine)

    async def close(self) -> None:
        """Free the seat (revoke the lease) and close the session; a failure here is only logged."""
        if self._lease is not None:
            try:
                await self._lease.stop(revoke=True)
            except (RendezvousError, OSError) as e:
                self.log.warning("replica_seat_release_failed", error=str(e))
        if self._session is not None:
            await self._session.close()


def group_keys(spec: JobSpec, k: int) -> JobKeys:
    """Where replica group `k`'s own rendezvous keeps its keys (under the job's: `runner reset` removes them)."""
    return JobKeys(spec.rendezvous.prefix, spec.name).group(k)

