"""This node's etcd lease: granted once, kept alive in the background, re-granted if it expired.

Keys attached to the lease are remembered (key -> value) so that, when etcd lost the lease (it was down
longer than the TTL), they are put again on the new lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Sequence
from typing import Any

import structlog
from aetcd import rpc

from runner.errors import RendezvousError
from runner.rendezvous.etcd.client import EtcdSession, cancel_task, put_op, range_op


class LeaseKeeper:
    """Owns one lease and the keys put on it."""

    def __init__(self, session: EtcdSession, ttl: float, log: Any = None) -> None:
        self._session = session
        self.ttl = max(2, math.ceil(ttl))
        self.lease_id = 0
        self._keys: dict[bytes, bytes] = {}
        self._task: asyncio.Task[None] | None = None
        self._log = log or structlog.get_logger("runner.rendezvous.etcd.backend")

    async def grant(self) -> int:
        """Grant a fresh lease and start keeping it alive."""
        lease = await self._session.call(lambda c: c.lease(self.ttl))
        self.lease_id = int(lease.id)
        self._log.info("etcd_lease_granted", lease=hex(self.lease_id), ttl=self.ttl)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._keep_alive(), name="etcd-lease-keepalive")
        return self.lease_id

    async def put(self, key: bytes, value: bytes) -> int:
        """Put `key` on the lease (remembered for re-grants); the revision of the write."""
        self._keys[key] = value
        reply = await self._session.call(lambda c: c.put(key, value, lease=self.lease_id))
        return int(reply.header.revision)

    async def put_and_read(self, items: dict[bytes, bytes],
                           reads: Sequence[rpc.RangeRequest] = ()) -> tuple[int, list[list[Any]]]:
        """Put `items` on the lease and read `reads` in ONE transaction: (revision, kvs per read)."""
        self._keys.update(items)
        _, rev, kvs = await self._session.call(lambda c: c.txn([], [
            *(put_op(k, v, self.lease_id) for k, v in items.items()), *map(range_op, reads)]))
        return rev, kvs[len(items):]

    def forget(self, key: bytes) -> None:
        """Stop re-putting `key` after a re-grant."""
        self._keys.pop(key, None)

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                reply = await self._session.call(lambda c: c.refresh_lease(self.lease_id))
            except RendezvousError as exc:
                self._log.warning("etcd_lease_keepalive_failed", error=exc.message)
                continue
            if reply is None or reply.TTL <= 0:
                await self._regrant()

    async def _regrant(self) -> None:
        old = self.lease_id
        try:
            await self.grant()
            for key, value in list(self._keys.items()):
                await self._session.call(lambda c, k=key, v=value: c.put(k, v, lease=self.lease_id))
        except RendezvousError as exc:
            self._log.warning("etcd_lease_regrant_failed", error=exc.message)
            return
        self._log.warning("etcd_lease_expired_regranted", old=hex(old), new=hex(self.lease_id), keys=len(self._keys))

    async def stop(self, *, revoke: bool) -> None:
        """Stop the keep-alive; revoke the lease (its keys vanish) when asked."""
        if self._task is not None:
            await cancel_task(self._task)
            self._task = None
        if revoke and self.lease_id:
            with contextlib.suppress(RendezvousError):
                await self._session.call(lambda c: c.revoke_lease(self.lease_id))
