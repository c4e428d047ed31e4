"""This node's etcd lease: granted once, kept alive in the background, re-granted if it expired.

Keys attached to the lease are remembered (key -> value) so that, when etcd forgot the lease (it was down
longer than the TTL), they are put again on the new lease. A lease etcd does not know may also mean that etcd
lost the job's data: before re-granting, the keeper asks `job_intact` (the backend compares the job's epoch key);
when the job is gone it tells `on_data_lost` and stops, and the backend re-admits the node with a fresh lease.

A listener given to `watch()` (the agent's guard, runner.system.shepherd) is told how to revoke the lease each time
it is granted or replaced (a runner.rendezvous.etcd.lease_revoke.RevokeTicket), and None once the keeper stopped: if the
agent dies holding the lease, its guard revokes it, and the peers see the node gone at once instead of one TTL later.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, TypeVar

import structlog

from runner.config.spec import JobSpec
from runner.errors import RendezvousError
from runner.rendezvous.etcd.client import (
    Connection,
    Endpoint,
    EtcdSession,
    KeyValue,
    LeaseNotFound,
    RangeRequest,
    cancel_task,
    put_op,
    range_op,
)
from runner.rendezvous.etcd.connect import read_password
from runner.rendezvous.etcd.job_secret import ROOT_USER, job_trust
from runner.rendezvous.etcd.lease_revoke import GatewayEndpoint, LeaseListener, RevokeTicket

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

T = TypeVar("T")

async def _always_intact() -> bool:
    return True


def revoke_ticket(spec: JobSpec, lease: int = 0, *, final: bytes | None = None,
                  endpoints: Sequence[Endpoint] = ()) -> RevokeTicket:
    """What another process needs to revoke `lease` on the spec's etcd: endpoints, TLS, user, password.

    The password is read as the session reads it (rendezvous.auth.password_env or password_file), only when a
    user is set; TLS paths are made absolute (the guard may not share our working directory forever); a hosted
    job's secret gives the CA (its PEM text travels, not a path) and root's password instead; our sys.path goes
    with them, so that the guard can import the gRPC client where the JSON gateway will not do. `final`: the node's
    final-state key, where the guard marks the node dead after the revoke. `endpoints`: where etcd is, when the
    session knows more than the spec (a hosted etcd's members: runner.rendezvous.etcd.members).
    """
    def path(p: str | None) -> str | None:
        return os.path.abspath(p) if p else None

    rdzv = spec.rendezvous
    known = endpoints or tuple(map(Endpoint.parse, rdzv.endpoints))
    gateways = tuple(GatewayEndpoint(e.host, e.port, e.secure) for e in known)
    sys_path = tuple(os.path.abspath(p) for p in sys.path if p)
    trust = job_trust(rdzv, spec.name)
    final_key = base64.b64encode(final).decode() if final is not None else None
    if trust is not None:
        return RevokeTicket(lease, gateways, user=ROOT_USER, password=trust.password, path=sys_path,
                            ca_pem=trust.ca_pem.decode(), final_key=final_key)
    user = rdzv.auth.user
    return RevokeTicket(lease, gateways, path(rdzv.tls.ca), path(rdzv.tls.cert), path(rdzv.tls.key), user,
                        read_password(rdzv.auth) if user else None, sys_path, final_key=final_key)


class LeaseKeeper:
    """Owns one lease and the keys put on it."""

    def __init__(self, session: EtcdSession, ttl: float, log: FilteringBoundLogger | None = None, *,
                 job_intact: Callable[[], Awaitable[bool]] = _always_intact,
                 on_data_lost: Callable[[str], None] | None = None) -> None:
        self._session = session
        self.ttl = max(2, math.ceil(ttl))
        self.lease_id = 0
        self._keys: dict[bytes, bytes] = {}
        self._task: asyncio.Task[None] | None = None
        self._job_intact = job_intact
        self._on_data_lost = on_data_lost
        self._log = log or structlog.get_logger("runner.rendezvous.etcd")
        self._listener: LeaseListener | None = None
        self._ticket: RevokeTicket | None = None
        # until when etcd is known to keep the lease (monotonic): the send time of the last grant or keep-alive etcd
        # acknowledged, plus the TTL it answered (runner.rendezvous.etcd.fence reads it)
        self.confirmed_until = 0.0

    def watch(self, listener: LeaseListener, ticket: RevokeTicket) -> None:
        """Tell `listener` how to revoke the lease (`ticket` with the lease id) now and at every grant; None at stop."""
        self._listener, self._ticket = listener, ticket
        if self.lease_id:
            listener(dataclasses.replace(ticket, lease=self.lease_id))

    @property
    def keepalive_timeout(self) -> float:
        """How long one keep-alive may wait on a member before the session tries another.

        A sixth of the TTL (at least 0.5 s): a member cut off from the job costs one failover, not the lease.
        """
        return max(0.5, self.ttl / 6)

    async def grant(self) -> int:
        """Grant a fresh lease and start keeping it alive."""
        sent = time.monotonic()
        self.lease_id = await self._session.call(lambda c: c.lease_grant(self.ttl))
        self.confirmed_until = sent + self.ttl
        self._log.info("etcd_lease_granted", lease=hex(self.lease_id), ttl=self.ttl)
        if self._listener is not None and self._ticket is not None:
            self._listener(dataclasses.replace(self._ticket, lease=self.lease_id))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._keep_alive(), name="etcd-lease-keepalive")
        return self.lease_id

    async def put(self, key: bytes, value: bytes) -> int:
        """Put `key` on the lease (remembered for re-grants); the revision of the write.

        A lease etcd forgot is handled like a failed keep-alive (re-granted, or the data loss reported), then the
        put is tried once more on the new lease.
        """
        self._keys[key] = value
        return await self._on_lease(lambda: self._session.call(lambda c: c.put(key, value, lease=self.lease_id)))

    async def put_and_read(self, items: dict[bytes, bytes],
                           reads: Sequence[RangeRequest] = ()) -> tuple[int, list[list[KeyValue]]]:
        """Put `items` on the lease and read `reads` (rpc.RangeRequest) in ONE transaction: (revision, kvs per read).

        A lease etcd forgot is handled as in put().
        """
        self._keys.update(items)

        async def txn() -> tuple[int, list[list[KeyValue]]]:
            ops = [*(put_op(k, v, self.lease_id) for k, v in items.items()), *map(range_op, reads)]
            result = await self._session.call(lambda c: c.txn([], ops))
            return result.revision, result.kvs[len(items):]
        return await self._on_lease(txn)

    async def _on_lease(self, write: Callable[[], Awaitable[T]]) -> T:
        """Run `write` (which uses self.lease_id); if etcd forgot the lease, replace it and run it once more.

        LeaseNotFound again when etcd lost the job (the loss has then been reported).
        """
        try:
            return await write()
        except LeaseNotFound:
            if not await self._replace_lost_lease():
                raise
            return await write()

    def forget(self, key: bytes) -> None:
        """Stop re-putting `key` after a re-grant."""
        self._keys.pop(key, None)

    def forget_all(self) -> None:
        """Stop re-putting every key (the job's data is gone: they belong to an attempt that no longer exists)."""
        self._keys.clear()

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                sent = time.monotonic()
                ttl = await self._session.call(lambda c: c.lease_keepalive(self.lease_id, self.keepalive_timeout))
                if ttl > 0:
                    self.confirmed_until = sent + ttl
                else:
                    await self._replace_lost_lease()
            except RendezvousError as exc:
                self._log.warning("etcd_lease_keepalive_failed", error=exc.message)

    async def _replace_lost_lease(self) -> bool:
        """Replace the lease etcd forgot: True when re-granted (keys put again), False when the job is gone.

        The job is gone when its epoch key is missing or changed: the data loss is then reported.
        """
        if not await self._job_intact():
            if self._on_data_lost is not None:
                self._on_data_lost("the job's epoch key is gone or changed (etcd lost or replaced its data)")
            return False
        old = self.lease_id
        await self.grant()
        for key, value in list(self._keys.items()):
            await self._session.call(partial(Connection.put, key=key, value=value, lease=self.lease_id))
        self._log.warning("etcd_lease_expired_regranted", old=hex(old), new=hex(self.lease_id), keys=len(self._keys))
        return True

    async def stop(self, *, revoke: bool) -> None:
        """Stop the keep-alive; revoke the lease (its keys vanish) when asked (best effort, bounded).

        The listener is told the lease is given up either way: this is a decision of the agent's, not its death.
        """
        if self._task is not None:
            await cancel_task(self._task)
            self._task = None
        if revoke and self.lease_id:
            with contextlib.suppress(RendezvousError):
                await self._session.call(lambda c: c.lease_revoke(self.lease_id))
        if self._listener is not None:
            self._listener(None)
