"""A resilient etcd v3 session over aetcd: endpoints, TLS, user/password auth, reconnects.

aetcd speaks plaintext gRPC only, so `_Client` adds TLS channel credentials. `EtcdSession.call` runs
one operation and, when the connection fails (etcd restarting, token lost), reconnects with backoff up
to the connect timeout and runs it again; operations passed to it must be idempotent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aetcd
import grpc
import structlog
from aetcd import rpc
from aetcd.exceptions import UnauthenticatedError

from runner.errors import RendezvousError

T = TypeVar("T")
OP_TIMEOUT_S = 5.0
BACKOFF_INITIAL_S = 0.05
BACKOFF_MAX_S = 1.0
CANCEL_TIMEOUT_S = 1.0
RETRYABLE = (aetcd.ConnectionFailedError, aetcd.ConnectionTimeoutError, UnauthenticatedError)


@dataclass(frozen=True)
class Endpoint:
    """One etcd client endpoint."""

    host: str
    port: int
    secure: bool  # https:// given explicitly

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        """`host:port`, `http://host:port` or `https://host:port`."""
        secure = text.startswith("https://")
        bare = text.split("://", 1)[-1].rstrip("/")
        host, _, port = bare.rpartition(":")
        if not host or not port.isdigit():
            msg = f"bad etcd endpoint '{text}'"
            raise RendezvousError(msg, fix="write endpoints as host:port, e.g. 10.0.0.5:2379")
        return cls(host.strip("[]"), int(port), secure)


@dataclass(frozen=True)
class Credentials:
    """How to authenticate: optional TLS files (bytes read once) and user/password."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None
    user: str | None = None
    password: str | None = None

    @classmethod
    def load(cls, ca: str | None, cert: str | None, key: str | None, user: str | None,
             password: str | None) -> Credentials:
        """Read the TLS files; a missing file is a RendezvousError naming it."""
        return cls(_read(ca, "rendezvous.tls.ca"), _read(cert, "rendezvous.tls.cert"),
                   _read(key, "rendezvous.tls.key"), user, password)

    @property
    def tls(self) -> bool:
        """Whether any TLS material was given."""
        return any((self.ca, self.cert, self.key))


def _read(path: str | None, field: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        msg = f"cannot read {field} '{path}': {exc.strerror}"
        raise RendezvousError(msg, fix=f"fix the path in {field}") from exc


class _Client(aetcd.Client):
    """aetcd.Client that can open a TLS channel (aetcd itself only dials plaintext)."""

    def __init__(self, endpoint: Endpoint, creds: Credentials, timeout: float) -> None:
        super().__init__(host=endpoint.host, port=endpoint.port, username=creds.user,
                         password=creds.password, timeout=timeout)  # type: ignore[arg-type]
        self._creds = creds
        self._secure = creds.tls or endpoint.secure

    async def connect(self) -> None:
        """Open the channel, authenticate, build the stubs (mirrors aetcd.Client.connect)."""
        if self._connected.is_set():
            return
        target = f"{self._host}:{self._port}"
        if self._secure:
            tls = grpc.ssl_channel_credentials(self._creds.ca, self._creds.key, self._creds.cert)
            self.channel = grpc.aio.secure_channel(target, tls)
        else:
            self.channel = grpc.aio.insecure_channel(target)
        try:
            if self._creds.user is not None:
                request = rpc.AuthenticateRequest(name=self._creds.user, password=self._creds.password or "")
                reply = await rpc.AuthStub(self.channel).Authenticate(request, timeout=self._timeout)
                self.metadata = (("token", reply.token),)
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            self._watcher = aetcd.Watcher(rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata)
            self._connected.set()
        except grpc.aio.AioRpcError as exc:
            await self.channel.close()
            self._init_channel_attrs()
            aetcd.exceptions._handle_exception(exc)

    async def snapshot(self, ranges: Sequence[rpc.RangeRequest]) -> tuple[int, list[list[Any]]]:
        """Read several ranges at ONE revision (a compare-less transaction): (revision, kvs per range)."""
        _, rev, kvs = await self.txn([], [range_op(r) for r in ranges])
        return rev, kvs

    async def txn(self, compare: Sequence[Any], success: Sequence[rpc.RequestOp],
                  failure: Sequence[rpc.RequestOp] = ()) -> tuple[bool, int, list[list[Any]]]:
        """One transaction of raw ops: (succeeded, revision, kvs per op: the range's kvs, [] for a put).

        `compare` holds aetcd comparisons (`client.transactions.create(key) == 0`, ...).
        """
        request = rpc.TxnRequest(compare=[c.build_message() for c in compare], success=success, failure=failure)
        try:
            reply = await self.kvstub.Txn(request, timeout=self._timeout, metadata=self.metadata)
        except grpc.aio.AioRpcError as exc:
            aetcd.exceptions._handle_exception(exc)
        kvs = [list(r.response_range.kvs) if r.HasField("response_range") else [] for r in reply.responses]
        return reply.succeeded, reply.header.revision, kvs


async def cancel_task(task: asyncio.Task[Any]) -> None:
    """Cancel `task` and wait for it to end, cancelling again if a cancel was swallowed
    (Python 3.11's asyncio.wait_for, used inside aetcd, can swallow one).
    """
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_TIMEOUT_S)
    if not task.cancelled() and task.exception() is not None:
        structlog.get_logger("runner.rendezvous.etcd.backend").warning("etcd_task_failed", task=task.get_name(),
                                                                  error=repr(task.exception()))


def prefix_end(prefix: bytes) -> bytes:
    """range_end covering every key that starts with `prefix`."""
    return bytes(aetcd.utils.prefix_range_end(prefix))


def range_op(request: rpc.RangeRequest) -> rpc.RequestOp:
    """A read as a transaction op."""
    return rpc.RequestOp(request_range=request)


def put_op(key: bytes, value: bytes, lease: int = 0) -> rpc.RequestOp:
    """A put (on `lease` when non-zero) as a transaction op."""
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))


def key_range(key: bytes) -> rpc.RangeRequest:
    """Range request for one key."""
    return rpc.RangeRequest(key=key)


def prefix_range(prefix: bytes, *, first_created: bool = False) -> rpc.RangeRequest:
    """Range request for a prefix; with first_created, only the key created first."""
    if first_created:
        return rpc.RangeRequest(key=prefix, range_end=prefix_end(prefix), limit=1,
                                sort_order=rpc.RangeRequest.ASCEND, sort_target=rpc.RangeRequest.CREATE)
    return rpc.RangeRequest(key=prefix, range_end=prefix_end(prefix))


class EtcdSession:
    """One logical connection to an etcd cluster that survives server restarts."""

    def __init__(self, endpoints: Sequence[str], creds: Credentials, *, connect_timeout: float,
                 probe_key: bytes, log: Any = None) -> None:
        self._endpoints = [Endpoint.parse(e) for e in endpoints]
        self._creds = creds
        self._connect_timeout = connect_timeout
        self._probe_key = probe_key
        self._log = log or structlog.get_logger("runner.rendezvous.etcd.backend")
        self._client: _Client | None = None
        self._gen = 0
        self._next_endpoint = 0
        self._lock = asyncio.Lock()

    @property
    def generation(self) -> int:
        """Bumped on every reconnect."""
        return self._gen

    @property
    def client(self) -> _Client:
        """The current client (connect first)."""
        if self._client is None:
            msg = "etcd session is not connected"
            raise RendezvousError(msg)
        return self._client

    async def connect(self) -> None:
        """Connect to the first endpoint that answers, retrying with backoff up to connect_timeout."""
        async with self._lock:
            await self._dial()

    async def _dial(self) -> None:
        deadline = time.monotonic() + self._connect_timeout
        delay, last = BACKOFF_INITIAL_S, "no attempt"
        while True:
            endpoint = self._endpoints[self._next_endpoint % len(self._endpoints)]
            self._next_endpoint += 1
            timeout = max(0.5, min(OP_TIMEOUT_S, deadline - time.monotonic()))
            client = _Client(endpoint, self._creds, timeout)
            try:
                await client.connect()
                await client.get(self._probe_key)
            except RETRYABLE as exc:
                last = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                await client.close()
            except aetcd.ClientError as exc:
                await client.close()
                raise self._refused(exc) from exc
            else:
                client._timeout = OP_TIMEOUT_S
                self._client, self._gen = client, self._gen + 1
                self._log.info("etcd_connected", endpoint=f"{endpoint.host}:{endpoint.port}", generation=self._gen)
                return
            if time.monotonic() + delay > deadline:
                raise self._unreachable(last)
            self._log.warning("etcd_connect_retry", endpoint=f"{endpoint.host}:{endpoint.port}", error=last)
            await asyncio.sleep(delay)
            delay = min(BACKOFF_MAX_S, delay * 2)

    def _unreachable(self, last: str) -> RendezvousError:
        names = ", ".join(f"{e.host}:{e.port}" for e in self._endpoints)
        msg = f"cannot reach etcd at {names} within {self._connect_timeout:g} s (last error: {last})"
        return RendezvousError(msg, fix="start etcd there, or fix rendezvous.endpoints / rendezvous.tls "
                               "(raise rendezvous.connect_timeout if etcd starts slowly)")

    def _refused(self, exc: Exception) -> RendezvousError:
        msg = f"etcd refused the connection: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        return RendezvousError(msg, fix="check rendezvous.auth (user, password_env/password_file) and the "
                               "user's permissions on rendezvous.prefix")

    async def reconnect(self, failed_generation: int) -> None:
        """Replace the client unless someone already did since `failed_generation`."""
        async with self._lock:
            if self._gen != failed_generation:
                return
            old, self._client = self._client, None
            if old is not None:
                await old.close()
            await self._dial()

    async def call(self, op: Callable[[_Client], Awaitable[T]]) -> T:
        """Run `op(client)`; on a lost connection reconnect and run it again (op must be idempotent)."""
        while True:
            gen = self._gen
            try:
                return await op(self.client)
            except aetcd.ClientError as exc:
                if not isinstance(exc, RETRYABLE) and gen == self._gen and "cancel" not in str(exc).lower():
                    raise self._refused(exc) from exc
                self._log.warning("etcd_call_retry", error=type(exc).__name__)
                await self.reconnect(gen)

    async def close(self) -> None:
        """Close the client."""
        async with self._lock:
            old, self._client = self._client, None
            self._gen += 1
        if old is not None:
            await old.close()


class Watch:
    """Events of several key ranges in one queue, resumed from the last revision after reconnects."""

    def __init__(self, session: EtcdSession, ranges: Sequence[tuple[bytes, bytes | None]], start_revision: int,
                 log: Any = None) -> None:
        self._session = session
        self._ranges = list(ranges)
        self._next_revision = start_revision
        self._queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self._reg = 0  # registration number; stale callbacks are ignored
        self._reg_gen = -1
        self._ids: list[int] = []
        self._log = log or structlog.get_logger("runner.rendezvous.etcd.backend")

    async def start(self) -> Watch:
        """Register every range (from the start revision)."""
        await self._register()
        return self

    async def _register(self) -> None:
        while True:
            self._reg += 1
            reg, gen = self._reg, self._session.generation
            try:
                self._ids = [await self._add(reg, key, end) for key, end in self._ranges]
            except aetcd.RevisionCompactedError as exc:
                self._log.warning("etcd_watch_compacted", revision=self._next_revision)
                self._next_revision = exc.compacted_revision
            except (TimeoutError, aetcd.ClientError, grpc.aio.AioRpcError):
                await self._session.reconnect(gen)
            else:
                self._reg_gen = gen
                return

    async def _add(self, reg: int, key: bytes, end: bytes | None) -> int:
        async def deliver(item: Any) -> None:
            await self._queue.put((reg, item))

        watcher = self._session.client._watcher
        callback = await watcher.add_callback(key, deliver, range_end=end, start_revision=self._next_revision)
        return int(callback.watch_id)

    async def next(self) -> aetcd.Event:
        """The next event (PUT/DELETE) of any range."""
        while True:
            reg, item = await self._queue.get()
            if reg != self._reg:
                continue
            if isinstance(item, aetcd.Event):
                self._next_revision = max(self._next_revision, item.kv.mod_revision + 1)
                return item
            self._log.warning("etcd_watch_lost", error=type(item).__name__ if item else "stream_closed")
            await self._session.reconnect(self._reg_gen)
            await self._register()

    async def cancel(self) -> None:
        """Stop receiving events."""
        self._reg += 1
        client = self._session._client
        if client is not None and client._watcher is not None:
            for watch_id in self._ids:
                try:  # aetcd's cancel can block behind its request queue: bounded, best effort
                    await asyncio.wait_for(client._watcher.cancel(watch_id), CANCEL_TIMEOUT_S)
                except (aetcd.ClientError, grpc.aio.AioRpcError, TimeoutError):
                    break
