"""Watching key ranges: events of several ranges in one queue, resumed from the last revision after reconnects.

One Watch = one gRPC Watch stream carrying one watcher per range, read by one background task; `add()` puts one more
range on the same stream (no new stream, no wait). Each range keeps its own next revision (the one after the last of
its events delivered), so a range added with an older start revision replays its history without making the others
repeat theirs. When the stream breaks (etcd restarting) the next `next()` reconnects the session and registers every
range again from its next revision, so nothing is missed or repeated. A compacted start revision restarts the watch
from the oldest revision etcd still has (logged: changes in between are lost).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc  # type: ignore[import-untyped]  # grpcio ships no type stubs
import structlog
from aetcd import rpc

from runner.rendezvous.etcd.client import (
    CANCEL_TIMEOUT_S,
    CLOSED_UNDER_US,
    Connection,
    EtcdSession,
    Unavailable,
    cancel_task,
    channel_closed_under_us,
    translate,
)

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

PUT, DELETE = "PUT", "DELETE"


@dataclass(frozen=True)
class Event:
    """One change of a watched key."""

    kind: str  # PUT or DELETE
    key: bytes
    value: bytes  # b"" for a DELETE
    mod_revision: int
    lease: int = 0  # the lease a PUT put the key on (0: none, or a DELETE)


class Compacted(Exception):
    """The start revision was compacted; etcd still has history from `revision`."""

    def __init__(self, revision: int) -> None:
        super().__init__(f"revision compacted below {revision}")
        self.revision = revision


class Watch:
    """Events of several key ranges (key, range_end or None for one key), each range in revision order."""

    def __init__(self, session: EtcdSession, ranges: Sequence[tuple[bytes, bytes | None]], start_revision: int,
                 log: FilteringBoundLogger | None = None) -> None:
        self._session = session
        self._ranges = list(ranges)
        self._next = [max(1, start_revision)] * len(self._ranges)  # per range: the revision to resume from
        self._queue: asyncio.Queue[tuple[int, int, Event | None]] = asyncio.Queue()
        self._reg = 0  # registration number; items of an older stream are ignored
        self._reg_gen = -1
        self._call: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._creating: deque[int] = deque()  # ranges whose watcher etcd has not confirmed yet, in request order
        self._ids: dict[int, int] = {}  # etcd's watch id -> range index, for the current stream
        self._log = log or structlog.get_logger("runner.rendezvous.etcd")

    async def start(self) -> Watch:
        """Register every range from its start revision (RendezvousError past the connect timeout)."""
        while True:
            try:
                await self._session.call(self._register)
            except Compacted as exc:
                self._log.warning("etcd_watch_compacted", revision=min(self._next), oldest=exc.revision)
                self._next = [max(n, exc.revision) for n in self._next]
                continue
            self._reg_gen = self._session.generation  # the connection the stream runs on
            return self

    async def add(self, key: bytes, end: bytes | None, start_revision: int) -> None:
        """Watch one more range on this stream, from `start_revision` (its history since is replayed).

        Only written, not waited for: its events come with the others'. If the stream is down, the range is
        registered with the others when next() reconnects.
        """
        self._ranges.append((key, end))
        self._next.append(max(1, start_revision))
        call, index = self._call, len(self._ranges) - 1
        if call is None:
            return
        self._creating.append(index)
        try:
            await call.write(rpc.WatchRequest(create_request=self._create(index)))
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
            pass  # the stream broke: next() reconnects and registers every range, this one too

    def _create(self, index: int) -> Any:
        key, end = self._ranges[index]
        return rpc.WatchCreateRequest(key=key, range_end=end or b"", start_revision=self._next[index])

    async def _register(self, conn: Connection) -> None:
        await self._drop_stream()
        self._reg += 1
        reg, call = self._reg, conn.watch_stream()
        self._creating, self._ids = deque(range(len(self._ranges))), {}
        try:
            # the writes too: a write waits for the stream's connection, which a connection etcd's restart broke may
            # never give (a leader's resumed watch held its rendezvous for the whole connect timeout) and a busy etcd
            # may not accept for long (4096 agents reconnecting at once: docs/scale.md); no task per read
            async with asyncio.timeout(conn.timeout):
                for index in range(len(self._ranges)):
                    await call.write(rpc.WatchRequest(create_request=self._create(index)))
                while self._creating:
                    reply = await call.read()
                    _check_created(reply)
                    self._session.identity.check(reply.header, None)
                    self._deliver(reg, reply)
        except grpc.aio.AioRpcError as exc:
            call.cancel()
            raise translate(exc) from exc
        except TimeoutError as exc:
            call.cancel()
            msg = "watch not created in time"
            raise Unavailable(msg) from exc
        except (grpc.aio.UsageError, asyncio.InvalidStateError) as exc:  # the stream ended before a write (etcd
            call.cancel()  # busy at thousands of nodes: seen at 4096, docs/scale.md): reconnect, as for a break
            msg = f"watch stream ended before its watchers were created: {exc}"
            raise Unavailable(msg) from exc
        except asyncio.CancelledError:
            call.cancel()
            if not channel_closed_under_us():
                raise
            raise Unavailable(CLOSED_UNDER_US) from None
        except BaseException:
            call.cancel()
            raise
        self._call = call
        self._reader = asyncio.get_running_loop().create_task(self._read(reg, call), name="etcd-watch-reader")

    def _deliver(self, reg: int, reply: Any) -> None:
        """Queue the events of one WatchResponse for registration `reg` (a confirmation names its range)."""
        if reply.created and self._creating:
            self._ids[int(reply.watch_id)] = self._creating.popleft()
        index = self._ids.get(int(reply.watch_id))
        if index is None:
            return
        for ev in reply.events:
            kind = PUT if ev.type == rpc.Event.PUT else DELETE
            event = Event(kind, bytes(ev.kv.key), bytes(ev.kv.value), int(ev.kv.mod_revision), int(ev.kv.lease))
            self._queue.put_nowait((reg, index, event))

    async def _read(self, reg: int, call: Any) -> None:
        try:
            while True:
                reply = await call.read()
                if reply is grpc.aio.EOF or reply.canceled or reply.compact_revision:
                    break
                self._session.identity.check(reply.header, None)
                self._deliver(reg, reply)
        except grpc.aio.AioRpcError:
            pass  # the stream broke: reported below
        except asyncio.CancelledError:
            if not channel_closed_under_us():
                raise
            # another task closed the channel (a reconnect): the stream broke, reported below
        self._queue.put_nowait((reg, -1, None))

    async def next(self) -> Event:
        """The next event (PUT/DELETE) of any range."""
        while True:
            reg, index, item = await self._queue.get()
            if reg != self._reg:
                continue
            if item is not None:
                self._next[index] = max(self._next[index], item.mod_revision + 1)
                return item
            self._log.warning("etcd_watch_lost", resume_from=min(self._next))
            await self._session.reconnect(self._reg_gen)
            await self.start()

    async def _drop_stream(self) -> None:
        call, reader, self._call, self._reader = self._call, self._reader, None, None
        if call is not None:
            call.cancel()
        if reader is not None:
            await cancel_task(reader)

    async def cancel(self) -> None:
        """Stop receiving events (bounded: never waits on etcd)."""
        self._reg += 1
        await asyncio.wait_for(self._drop_stream(), CANCEL_TIMEOUT_S * 2)


def _check_created(reply: Any) -> None:
    """Raise for a WatchResponse that ends a watch being created: stream closed, or start revision compacted."""
    if reply is grpc.aio.EOF:
        msg = "watch stream ended"
        raise Unavailable(msg)
    if reply.compact_revision:
        raise Compacted(int(reply.compact_revision))
