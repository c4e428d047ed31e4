"""A resilient etcd v3 session: endpoints, TLS, user/password auth, reconnects, bounded calls.

Only public API of aetcd is used: its `aetcd.rpc` module, which ships etcd's generated protobuf messages and gRPC
stubs (KV, Lease, Watch, Auth); the calls themselves are made here, on a grpc.aio channel we open (TLS or not).
tests/rendezvous/test_rdzv_aetcd_contract.py checks every name listed in RPC_SURFACE, so an aetcd upgrade that drops one
fails there with a clear message. Nothing in this package touches a private name of aetcd or grpc.

`EtcdSession.call` runs one operation and, when the connection fails (etcd restarting, token lost), reconnects
with backoff and runs it again, all within the connect timeout; operations passed to it must be idempotent. Every
reply's header goes through a ClusterIdentity, which notices an etcd that lost its data. The etcd messages built
and read are typed here too (RangeRequest, RequestOp, Compare, KeyValue).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NewType, Protocol, TypeVar

import grpc  # type: ignore[import-untyped]  # grpcio ships no type stubs
import structlog
from aetcd import rpc

from runner.errors import RendezvousError
from runner.system import thread_signals

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

# Types for the etcd protobuf messages this package builds and reads (aetcd's `rpc` module ships no types). The
# messages built (range requests, transaction ops, comparisons) are opaque: distinct types, so that a comparison
# cannot be passed where an op goes, made only by the helpers below. The messages read (a KeyValue) are Protocols
# naming the fields read.

RangeRequest = NewType("RangeRequest", object)
"""An rpc.RangeRequest: one key, or a range of keys."""

RequestOp = NewType("RequestOp", object)
"""An rpc.RequestOp: one read, put or delete of a transaction."""

Compare = NewType("Compare", object)
"""An rpc.Compare: one condition of a transaction."""


class KeyValue(Protocol):
    """An rpc.KeyValue: one key as read, with its revisions and lease."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


# Is this still the etcd that holds our job? Every reply's header says which cluster answered and at what revision.
#
# A cluster that lost its data (data dir wiped, cluster replaced, restored from an old snapshot) shows it in one of two
# ways: the cluster id in the header changes, or a reply's revision is lower than one this client already saw before
# it sent the request (etcd's revision never goes back: every KV reply is linearizable). Pure logic, no I/O: the
# client feeds it each header with the floor it captured before sending.


class Header(Protocol):
    """The fields of etcd's ResponseHeader this check reads."""

    cluster_id: int
    revision: int


class ClusterIdentity:
    """The cluster id and highest revision seen; calls every listener once per detected loss."""

    def __init__(self) -> None:
        self.cluster_id: int | None = None
        self.revision = 0
        self._listeners: list[Callable[[str], None]] = []

    def on_loss(self, listener: Callable[[str], None]) -> None:
        """Call `listener(reason)` whenever a reply shows the data was lost."""
        self._listeners.append(listener)

    def check(self, header: Header, floor: int | None) -> str | None:
        """Record `header`; the reason when it shows data loss (listeners are told), else None.

        `floor`: self.revision captured before the request was sent (None for replies whose revision is
        not linearizable, e.g. lease replies: only their cluster id is checked).
        """
        cluster, rev = int(header.cluster_id), int(header.revision)
        reason = None
        if self.cluster_id is not None and cluster and cluster != self.cluster_id:
            reason = f"the cluster id changed from {self.cluster_id:x} to {cluster:x} (another etcd cluster)"
        elif floor is not None and 0 < rev < floor:
            reason = f"the revision went back from {floor} to {rev} (etcd restarted without its data)"
        if reason is not None:  # a new baseline: the new cluster's history starts here
            self.cluster_id, self.revision = cluster, rev
            for listener in list(self._listeners):
                listener(reason)
            return reason
        if cluster:
            self.cluster_id = cluster
        self.revision = max(self.revision, rev)
        return None


T = TypeVar("T")
OP_TIMEOUT_S = 5.0
# A failover's first try of each endpoint: a member in an election (its leader lost) holds a new connection's
# authentication until the election ends, and 5 s on it cost a 5 s lease while the other member answered at once
# (tests/rendezvous/test_hosted_members.py, a member host cut under load). Doubled after every round of the
# endpoints, up to OP_TIMEOUT_S, so that a slow but live etcd is still reached.
FAILOVER_TRY_S = 1.0
SESSION_NUMBERS = itertools.count(1)  # this process's etcd sessions, numbered in their log lines
SUSPECT_S = 10.0  # an endpoint that failed this recently is tried after the others
BACKOFF_INITIAL_S = 0.05
BACKOFF_MAX_S = 1.0
CANCEL_TIMEOUT_S = 1.0

# The part of aetcd's public `aetcd.rpc` module this package relies on: name -> protobuf fields used
# (empty for stubs and functions). Checked by tests/rendezvous/test_rdzv_aetcd_contract.py.
RPC_SURFACE: dict[str, tuple[str, ...]] = {
    "KVStub": (), "LeaseStub": (), "WatchStub": (), "AuthStub": (),
    "insecure_channel": (), "secure_channel": (),
    "AuthenticateRequest": ("name", "password"), "AuthenticateResponse": ("token",),
    "ResponseHeader": ("cluster_id", "revision"),
    "KeyValue": ("key", "value", "create_revision", "mod_revision", "version", "lease"),
    "RangeRequest": ("key", "range_end", "limit", "sort_order", "sort_target", "count_only"),
    "RangeResponse": ("header", "kvs", "count"),
    "PutRequest": ("key", "value", "lease"), "PutResponse": ("header",),
    "DeleteRangeRequest": ("key", "range_end"), "DeleteRangeResponse": ("header", "deleted"),
    "Compare": ("result", "target", "key", "range_end", "create_revision", "mod_revision", "value"),
    "RequestOp": ("request_range", "request_put", "request_delete_range"),
    "ResponseOp": ("response_range",),
    "TxnRequest": ("compare", "success", "failure"), "TxnResponse": ("header", "succeeded", "responses"),
    "LeaseGrantRequest": ("TTL",), "LeaseGrantResponse": ("header", "ID", "TTL", "error"),
    "LeaseKeepAliveRequest": ("ID",), "LeaseKeepAliveResponse": ("header", "TTL"),
    "LeaseRevokeRequest": ("ID",),
    "WatchRequest": ("create_request",), "WatchCreateRequest": ("key", "range_end", "start_revision"),
    "WatchResponse": ("header", "watch_id", "created", "canceled", "compact_revision", "cancel_reason", "events"),
    "Event": ("type", "kv"),
    # hosted_auth: etcd's users and auth in a hosted etcd with the job's secret
    "AuthUserAddRequest": ("name", "password"), "AuthRoleAddRequest": ("name",),
    "AuthUserGrantRoleRequest": ("user", "role"), "AuthEnableRequest": (),
    "AuthUserListRequest": (), "AuthUserListResponse": ("users",),
    "AuthRoleListRequest": (), "AuthRoleListResponse": ("roles",),
    "LeaseLeasesRequest": (), "LeaseLeasesResponse": ("leases",),
    # members: a hosted rendezvous grows to rendezvous.hosted_members members (runner.rendezvous.etcd.members)
    "ClusterStub": (), "Member": ("ID", "name", "peerURLs", "clientURLs", "isLearner"),
    "MemberListRequest": ("linearizable",), "MemberListResponse": ("header", "members"),
    "MemberAddRequest": ("peerURLs", "isLearner"), "MemberAddResponse": ("header", "member", "members"),
    "MemberPromoteRequest": ("ID",), "MemberRemoveRequest": ("ID",),
    # founder: the founding member's own leader, read without a quorum (runner.rendezvous.etcd.founder)
    "MaintenanceStub": (), "StatusRequest": (), "StatusResponse": ("header", "leader"),
}

# The largest reply a node accepts. gRPC's default (4 MiB) is less than what a round's leader reads at scale: every
# node's live state (about 1 KiB each: 4 MiB at 4096 nodes) and join record in one reply (docs/scale.md). etcd
# sends replies of any size; what it holds is bounded by its own quota (--quota-backend-bytes, 2 GiB by default).
MAX_REPLY_BYTES = 256 << 20

# Per channel: no gRPC-level retries (EtcdSession.call retries, reconnecting) and no proxy lookup (etcd endpoints
# are reached directly); both cost per call or per channel, and a node opens one channel.
CHANNEL_OPTIONS = (("grpc.enable_retries", 0), ("grpc.enable_http_proxy", 0),
                   ("grpc.max_receive_message_length", MAX_REPLY_BYTES))

# gRPC status codes after which a reconnect may help (etcd restarting, leader change, token expired). INTERNAL is
# never an answer of etcd's (its refusals are INVALID_ARGUMENT, FAILED_PRECONDITION, PERMISSION_DENIED, NOT_FOUND, ...):
# gRPC's own transport gives it when a connection breaks under a call ("Internal error from Core": a member host lost
# during a rendezvous, CI 2026-12-01, read as a refused request it ended a survivor with exit 3).
RETRY_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
                         grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED,
                         grpc.StatusCode.INTERNAL})


# What etcd 3.5 answers, with code UNKNOWN, while it applies its log behind what it committed (more than 5000
# entries): thousands of nodes writing at once (8192 agents joining here, docs/scale.md). A busy etcd, not a refusal:
# retried with backoff as a lost connection is.
# And what etcd answers, with code UNKNOWN, when the call's own deadline (or cancel) ended its work server-side: a
# member in an election holding a new connection's authentication past a failover's short try does (CI, 2026-11-28:
# read as a refused login, it ended a survivor with exit 3). The call timed out; it was never refused.
# And what gRPC's transport says, with whatever code, when the connection under a call broke: never etcd's answer.
# And what a member says while it stops (its raft node stopped: it left the cluster, or its host's agent is ending):
# another member answers. Read as a refusal, it cost a node's final state ("raft: stopped", code UNKNOWN: the member
# the node was connected to had just left), and a slower node then read that node's success as its loss (README's
# fresh-clone run, 2026-12-02, tests/rendezvous/test_hosted_members.py).
BUSY_SIGNS = ("etcdserver: too many requests", "context deadline exceeded", "context canceled",
              "Stream removed", "Socket closed", "Connection reset", "Broken pipe", "Internal error from Core",
              "failed to connect to all addresses", "No status received", "raft: stopped",
              "etcdserver: server stopped")


class Unavailable(Exception):
    """The connection failed in a way a reconnect may cure (internal to the retry loop)."""


class MembersBusy(RendezvousError):
    """etcd refused a membership change for now; it may be asked again later.

    A member joined moments ago, or one is not connected (etcd's strict reconfiguration check).
    """


# What etcd 3.5 answers to a membership change it refuses for now (runner.rendezvous.etcd.members retries them).
MEMBERS_BUSY_SIGNS = ("unhealthy cluster", "not enough started members", "too many learner members")


class EtcdUnreachable(RendezvousError):
    """No endpoint answered within the time a call had (the connect timeout, or its budget)."""


class LeaseNotFound(RendezvousError):
    """A write named a lease etcd does not know (it expired, or etcd lost its data)."""


@contextlib.contextmanager
def rpc_errors() -> Iterator[None]:
    """Turn gRPC errors into RendezvousErrors, and a cancel caused by our own reconnect into Unavailable."""
    try:
        yield
    except grpc.aio.AioRpcError as exc:
        raise translate(exc) from exc
    except asyncio.CancelledError:
        if not channel_closed_under_us():
            raise
        raise Unavailable(CLOSED_UNDER_US) from None


def channel_closed_under_us() -> bool:
    """Whether a CancelledError just caught came from grpc, not from a cancel of the current task.

    grpc.aio ends a call with asyncio.CancelledError when another task closes its channel (a reconnect replacing
    the connection). The current task is then not being cancelled: the call failed like a lost connection.
    """
    task = asyncio.current_task()
    return task is not None and task.cancelling() == 0


CLOSED_UNDER_US = "the connection was closed by a reconnect while the call ran"

# What gRPC says when the server's certificate fails verification, or the server speaks no TLS.
UNTRUSTED_SIGNS = ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed", "WRONG_VERSION_NUMBER",
                   "Ssl handshake failed", "SSL_ERROR_SSL")


def untrusted_server(error: str) -> bool:
    """Whether a failed connection's error says the server was reached but failed the TLS handshake."""
    return any(sign in error for sign in UNTRUSTED_SIGNS)


def translate(exc: grpc.aio.AioRpcError) -> Exception:
    """The exception to raise for a failed RPC: Unavailable (retry), LeaseNotFound, or a RendezvousError."""
    code, details = exc.code(), exc.details() or ""
    if any(sign in details for sign in MEMBERS_BUSY_SIGNS):
        return MembersBusy(f"etcd: {details}")
    if code in RETRY_CODES or any(sign in details for sign in BUSY_SIGNS):
        return Unavailable(f"{code.name}: {details}".rstrip(": "))
    if code == grpc.StatusCode.NOT_FOUND and "lease" in details:
        return LeaseNotFound(f"etcd: {details}")
    return RendezvousError(f"etcd refused the request: {details or code.name}",
                           fix="check rendezvous.auth (user, password_env/password_file) and the "
                           "user's permissions on rendezvous.prefix")


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
        if not host or not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):  # "²" is a digit too
            msg = f"bad etcd endpoint '{text}'"
            raise RendezvousError(msg, fix="write endpoints as host:port, e.g. 10.0.0.5:2379")
        return cls(host.strip("[]"), int(port), secure)

    def __str__(self) -> str:
        """host:port."""
        return f"{self.host}:{self.port}"

    @property
    def target(self) -> str:
        """The gRPC target: an IP address skips the DNS resolver (ipv4:/ipv6: scheme), a name goes through it."""
        try:
            address = ipaddress.ip_address(self.host)
        except ValueError:
            return str(self)
        return f"ipv4:{address}:{self.port}" if address.version == 4 else f"ipv6:[{address}]:{self.port}"


@dataclass(frozen=True)
class Credentials:
    """How to authenticate: optional TLS files (bytes read once) and user/password."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None
    user: str | None = None
    password: str | None = None
    trust_from: str | None = None  # the CA is the job's, derived from this secret (rendezvous.secret_file or env)

    @classmethod
    def load(cls, ca: str | None, cert: str | None, key: str | None, user: str | None,
             password: str | None) -> Credentials:
        """Read the TLS files; a missing file is a RendezvousError naming it."""
        return cls(read_tls_file(ca, "rendezvous.tls.ca"), read_tls_file(cert, "rendezvous.tls.cert"),
                   read_tls_file(key, "rendezvous.tls.key"), user, password)

    @property
    def tls(self) -> bool:
        """Whether any TLS material was given."""
        return any((self.ca, self.cert, self.key))

    def __repr__(self) -> str:
        """Never shows the password or the key."""
        return f"Credentials(tls={self.tls}, user={self.user!r})"


def read_tls_file(path: str | None, field: str) -> bytes | None:
    """The bytes of a TLS file named in the spec; a RendezvousError naming the field when unreadable."""
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        msg = f"cannot read {field} '{path}': {exc.strerror}"
        raise RendezvousError(msg, fix=f"fix the path in {field}") from exc


@dataclass(frozen=True)
class MemberInfo:
    """One member of the etcd cluster as MemberList answers it (name is empty until a new member started)."""

    id: int
    name: str
    peer_urls: tuple[str, ...]
    client_urls: tuple[str, ...]
    learner: bool

    @classmethod
    def of(cls, member: Any) -> MemberInfo:
        """From an rpc.Member message."""
        return cls(int(member.ID), str(member.name), tuple(map(str, member.peerURLs)),
                   tuple(map(str, member.clientURLs)), bool(member.isLearner))


@dataclass(frozen=True)
class TxnResult:
    """What a transaction answered: which branch ran, at what revision, and each op's kvs ([] for writes)."""

    succeeded: bool
    revision: int
    kvs: list[list[KeyValue]]  # per op: the range's KeyValue messages


class Connection:
    """One gRPC channel to one endpoint, authenticated: etcd's KV, Lease and Watch calls, each with a timeout."""

    def __init__(self, endpoint: Endpoint, creds: Credentials, identity: ClusterIdentity, timeout: float) -> None:
        self.endpoint = endpoint
        self._identity = identity
        self.timeout = timeout
        target = endpoint.target
        with thread_signals.kept_from_new_threads():  # grpc's threads, should the channel make them
            if creds.tls or endpoint.secure:
                tls = grpc.ssl_channel_credentials(creds.ca, creds.key, creds.cert)
                self.channel = rpc.secure_channel(target, tls, options=CHANNEL_OPTIONS)
            else:
                self.channel = rpc.insecure_channel(target, options=CHANNEL_OPTIONS)
        self.metadata: tuple[tuple[str, str], ...] = ()
        self.kv = rpc.KVStub(self.channel)
        self.leases = rpc.LeaseStub(self.channel)
        self.watches = rpc.WatchStub(self.channel)
        self._creds = creds

    async def authenticate(self) -> None:
        """Get a token for user/password, when given."""
        if self._creds.user is None:
            return
        request = rpc.AuthenticateRequest(name=self._creds.user, password=self._creds.password or "")
        auth = rpc.AuthStub(self.channel)  # only with a user: the stub makes one callable per Auth method
        reply = await self._unary(auth.Authenticate, request, linearizable=False)
        self.metadata = (("token", str(reply.token)),)

    async def _unary(self, method: Any, request: Any, *, linearizable: bool = True) -> Any:
        floor = self._identity.revision if linearizable else None
        with rpc_errors():
            reply = await method(request, timeout=self.timeout, metadata=self.metadata)
        self._identity.check(reply.header, floor)
        return reply

    async def range(self, request: RangeRequest) -> Any:
        """A RangeResponse."""
        return await self._unary(self.kv.Range, request)

    async def get(self, key: bytes) -> KeyValue | None:
        """The KeyValue at `key`, or None."""
        reply = await self.range(key_range(key))
        kv: KeyValue | None = reply.kvs[0] if reply.kvs else None
        return kv

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        """Put (on `lease` when non-zero); the revision of the write."""
        reply = await self._unary(self.kv.Put, rpc.PutRequest(key=key, value=value, lease=lease))
        return int(reply.header.revision)

    async def delete(self, key: bytes, *, prefix: bool = False) -> int:
        """Delete `key` (every key under it with prefix=True); how many keys were deleted."""
        request = rpc.DeleteRangeRequest(key=key, range_end=prefix_end(key) if prefix else b"")
        return int((await self._unary(self.kv.DeleteRange, request)).deleted)

    async def txn(self, compare: Sequence[Compare], success: Sequence[RequestOp],
                  failure: Sequence[RequestOp] = ()) -> TxnResult:
        """One transaction of rpc.Compare / rpc.RequestOp messages."""
        reply = await self._unary(self.kv.Txn, rpc.TxnRequest(compare=compare, success=success, failure=failure))
        kvs = [list(r.response_range.kvs) if r.HasField("response_range") else [] for r in reply.responses]
        return TxnResult(bool(reply.succeeded), int(reply.header.revision), kvs)

    async def snapshot(self, ranges: Sequence[RangeRequest]) -> tuple[int, list[list[KeyValue]]]:
        """Read several ranges at ONE revision (a compare-less transaction): (revision, kvs per range)."""
        result = await self.txn([], [range_op(r) for r in ranges])
        return result.revision, result.kvs

    async def lease_grant(self, ttl: int) -> int:
        """A new lease of `ttl` seconds; its id."""
        reply = await self._unary(self.leases.LeaseGrant, rpc.LeaseGrantRequest(TTL=ttl), linearizable=False)
        if reply.error:
            msg = f"etcd refused a lease: {reply.error}"
            raise RendezvousError(msg)
        return int(reply.ID)

    async def lease_keepalive(self, lease_id: int, timeout: float | None = None) -> int:
        """Refresh a lease once; its TTL now (0 or less: etcd does not know it).

        `timeout`: shorter than the connection's, so that a member that stopped answering is left for another one
        well before the lease lapses (runner.rendezvous.etcd.lease).
        """
        call = self.leases.LeaseKeepAlive(metadata=self.metadata, timeout=min(self.timeout, timeout or self.timeout))
        try:
            with rpc_errors():
                await call.write(rpc.LeaseKeepAliveRequest(ID=lease_id))
                reply = await call.read()
        finally:
            call.cancel()
        if reply is grpc.aio.EOF:
            msg = "lease keep-alive stream ended"
            raise Unavailable(msg)
        self._identity.check(reply.header, None)
        return int(reply.TTL)

    async def lease_revoke(self, lease_id: int) -> None:
        """Revoke a lease (its keys vanish)."""
        try:
            await self._unary(self.leases.LeaseRevoke, rpc.LeaseRevokeRequest(ID=lease_id), linearizable=False)
        except LeaseNotFound:
            return

    async def members(self) -> list[MemberInfo]:
        """Every member of the cluster (voters and learners), as the connected member knows them."""
        reply = await self._unary(rpc.ClusterStub(self.channel).MemberList, rpc.MemberListRequest(),
                                  linearizable=False)
        return [MemberInfo.of(m) for m in reply.members]

    async def leader(self) -> int:
        """The id of the leader the connected member follows (0: it knows none).

        From its Status: answered by the member itself, with no quorum and no token.
        """
        reply = await self._unary(rpc.MaintenanceStub(self.channel).Status, rpc.StatusRequest(), linearizable=False)
        return int(reply.leader)

    async def member_add(self, peer_url: str, *, learner: bool) -> tuple[MemberInfo, list[MemberInfo]]:
        """Add a member (a learner: it votes once promoted); (the new member, every member after the change)."""
        request = rpc.MemberAddRequest(peerURLs=[peer_url], isLearner=learner)
        reply = await self._unary(rpc.ClusterStub(self.channel).MemberAdd, request, linearizable=False)
        return MemberInfo.of(reply.member), [MemberInfo.of(m) for m in reply.members]

    async def member_promote(self, member_id: int) -> None:
        """Make a learner that caught up with the leader a voting member (refused while it has not)."""
        await self._unary(rpc.ClusterStub(self.channel).MemberPromote, rpc.MemberPromoteRequest(ID=member_id),
                          linearizable=False)

    async def member_remove(self, member_id: int) -> None:
        """Remove a member from the cluster (it stops serving once it learns of it)."""
        await self._unary(rpc.ClusterStub(self.channel).MemberRemove, rpc.MemberRemoveRequest(ID=member_id),
                          linearizable=False)

    def watch_stream(self) -> Any:
        """A new bidirectional Watch stream (write WatchRequests, read WatchResponses)."""
        return self.watches.Watch(metadata=self.metadata)

    async def close(self) -> None:
        """Close the channel (in-flight calls end with CANCELLED)."""
        await self.channel.close()


async def cancel_task(task: asyncio.Task[object]) -> None:
    """Cancel `task` and wait for it to end, cancelling again if a cancel was swallowed."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_TIMEOUT_S)
    if not task.cancelled() and task.exception() is not None:
        structlog.get_logger("runner.rendezvous.etcd").warning("etcd_task_failed", task=task.get_name(),
                                                               error=repr(task.exception()))


def prefix_end(prefix: bytes) -> bytes:
    r"""range_end covering every key that starts with `prefix` (b"\0": every key, for an all-0xff prefix)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return b"\0"
    return stripped[:-1] + bytes([stripped[-1] + 1])


def range_op(request: RangeRequest) -> RequestOp:
    """A read (rpc.RangeRequest) as a transaction op."""
    return RequestOp(rpc.RequestOp(request_range=request))


def put_op(key: bytes, value: bytes, lease: int = 0) -> RequestOp:
    """A put (on `lease` when non-zero) as a transaction op."""
    return RequestOp(rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease)))


def delete_op(key: bytes) -> RequestOp:
    """A delete of one key as a transaction op."""
    return RequestOp(rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key)))


def key_range(key: bytes) -> RangeRequest:
    """Range request for one key."""
    return RangeRequest(rpc.RangeRequest(key=key))


def prefix_range(prefix: bytes, *, first_created: bool = False, count_only: bool = False) -> RangeRequest:
    """Range request for a prefix; with first_created, only the key created first; with count_only, no kvs."""
    if first_created:
        return RangeRequest(rpc.RangeRequest(key=prefix, range_end=prefix_end(prefix), limit=1,
                                             sort_order=rpc.RangeRequest.ASCEND, sort_target=rpc.RangeRequest.CREATE))
    return RangeRequest(rpc.RangeRequest(key=prefix, range_end=prefix_end(prefix), count_only=count_only))


def absent(key: bytes) -> Compare:
    """Comparison: `key` does not exist."""
    return Compare(rpc.Compare(key=key, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL, create_revision=0))


def none_under(prefix: bytes) -> Compare:
    """Comparison: no key starts with `prefix` (etcd compares every key of the range; an empty range passes)."""
    return Compare(rpc.Compare(key=prefix, range_end=prefix_end(prefix), target=rpc.Compare.CREATE,
                               result=rpc.Compare.EQUAL, create_revision=0))


def value_is(key: bytes, value: bytes) -> Compare:
    """Comparison: `key` holds `value`."""
    return Compare(rpc.Compare(key=key, target=rpc.Compare.VALUE, result=rpc.Compare.EQUAL, value=value))


def modified_at(key: bytes, revision: int) -> Compare:
    """Comparison: `key` was last written at `revision`."""
    return Compare(rpc.Compare(key=key, target=rpc.Compare.MOD, result=rpc.Compare.EQUAL, mod_revision=revision))


class EtcdSession:
    """One logical connection to an etcd cluster that survives server restarts.

    With a `probe_key`, connecting reads it, so connect() returns only once an endpoint answered. Without one,
    connecting only opens the channel (and authenticates, when a user is set): the first call is the probe, and
    call() backs off between attempts that find no etcd, as a probing connect does. That saves one round trip
    per connection for a caller whose first call follows at once (the backend: its lease grant).
    """

    def __init__(self, endpoints: Sequence[str], creds: Credentials, *, connect_timeout: float,
                 probe_key: bytes | None, log: FilteringBoundLogger | None = None, learn_members: bool = False) -> None:
        """`learn_members`: after each connect, add every member's client URLs to the endpoints.

        For a hosted rendezvous, whose members are the job's own nodes (runner.rendezvous.etcd.members).
        """
        self._given = [Endpoint.parse(e) for e in endpoints]
        self._endpoints = list(self._given)
        self._learn_members = learn_members
        self._outage: tuple[float, int] | None = None  # (since, retries) while calls fail: one line per outage
        self.number = next(SESSION_NUMBERS)  # said with its connection events: each session's outages are its own
        self._creds = creds
        self.connect_timeout = connect_timeout
        self._probe_key = probe_key
        self._log = log or structlog.get_logger("runner.rendezvous.etcd")
        self.identity = ClusterIdentity()
        self._client: Connection | None = None
        self._gen = 0
        # Each session starts at a random endpoint and fails over in order from there, so a job's nodes spread over
        # the members (as etcd's own client balances) instead of all serving from the first one listed: with 4096
        # nodes that member did three quarters of a round's etcd work (docs/scale.md).
        self._next_endpoint = random.randrange(len(self._endpoints)) if self._endpoints else 0  # noqa: S311
        self._lock = asyncio.Lock()
        self._failed_at: dict[tuple[str, int], float] = {}  # (host, port) -> monotonic time of its last failure
        self.answered_at = 0.0  # monotonic time of etcd's last answer to a call of this session (the fence reads it)
        self.last_answered: Endpoint | None = None  # the endpoint of that answer

    @property
    def generation(self) -> int:
        """Bumped on every reconnect."""
        return self._gen

    @property
    def client(self) -> Connection:
        """The current connection (connect first)."""
        if self._client is None:
            msg = "etcd session is not connected"
            raise RendezvousError(msg)
        return self._client

    @property
    def connected(self) -> bool:
        """Whether a connection is open now."""
        return self._client is not None

    async def connect(self) -> None:
        """Connect to the first endpoint that answers (trying from a random one on), up to connect_timeout."""
        async with self._lock:
            await self._dial()

    def _pick(self) -> Endpoint:
        """The next endpoint in turn that has not failed within SUSPECT_S.

        If every one has, the one that failed longest ago: a member just lost is tried after the live ones.
        """
        now, n = time.monotonic(), len(self._endpoints)
        order = [(self._next_endpoint + i) % n for i in range(n)]
        failed = [self._failed_at.get((self._endpoints[i].host, self._endpoints[i].port), 0.0) for i in order]
        fresh = [k for k, at in enumerate(failed) if now - at > SUSPECT_S]
        k = fresh[0] if fresh else min(range(n), key=failed.__getitem__)
        self._next_endpoint = order[k] + 1
        return self._endpoints[order[k]]

    async def _dial(self, *, failover: bool = False) -> None:
        """Connect to the first endpoint that answers.

        `failover`: the connection in use failed, so each endpoint gets a short first try (FAILOVER_TRY_S, doubled
        per round of them) where there are others to try.
        """
        deadline = time.monotonic() + self.connect_timeout
        delay, last, tries = BACKOFF_INITIAL_S, "no attempt", 0
        while True:
            endpoint = self._pick()
            rounds = tries // len(self._endpoints)
            cap = FAILOVER_TRY_S * 2 ** rounds if failover and len(self._endpoints) > 1 else OP_TIMEOUT_S
            tries += 1
            conn = Connection(endpoint, self._creds, self.identity,
                              max(0.5, min(cap, OP_TIMEOUT_S, deadline - time.monotonic())))
            try:
                await conn.authenticate()
                if self._probe_key is not None:
                    await conn.get(self._probe_key)
            except Unavailable as exc:
                last = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                self._failed_at[(endpoint.host, endpoint.port)] = time.monotonic()
                await conn.close()
                if self._creds.trust_from is not None and untrusted_server(str(exc)):
                    raise self._not_the_jobs(endpoint, last) from None
            except RendezvousError as exc:
                await conn.close()
                raise self._refused(exc) from exc
            except BaseException:  # cancelled (a caller's deadline): do not leak the channel
                await asyncio.shield(conn.close())
                raise
            else:
                conn.timeout = min(OP_TIMEOUT_S, max(0.5, self.connect_timeout))
                self._client, self._gen = conn, self._gen + 1
                await self._learn_from(conn)
                self._connected(endpoint)
                return
            if time.monotonic() + delay > deadline:
                raise self._unreachable(last)
            self._retrying(endpoint, last)
            await asyncio.sleep(delay)
            delay = min(BACKOFF_MAX_S, delay * 2)

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        """Where this session looks for etcd: the given endpoints, then the members learnt since."""
        return tuple(self._endpoints)

    @property
    def current(self) -> Endpoint | None:
        """The endpoint connected now (None while not connected)."""
        return self._client.endpoint if self._client is not None else None

    def prefer(self, endpoint: Endpoint) -> None:
        """Dial `endpoint` first next time (one that answered another session of this node: a live member)."""
        for i, known in enumerate(self._endpoints):
            if (known.host, known.port) == (endpoint.host, endpoint.port):
                self._next_endpoint = i
                return

    def learn(self, client_urls: Sequence[str]) -> None:
        """The cluster's members now serve at `client_urls`: the given endpoints and these, in that order.

        A member removed since is dropped (its host is gone); the connection open now is kept.
        """
        learnt = []
        for url in client_urls:
            try:
                learnt.append(Endpoint.parse(url))
            except RendezvousError:
                continue
        seen: dict[tuple[str, int], Endpoint] = {}
        for endpoint in (*self._given, *learnt):  # a name given and the address it serves at are both kept
            seen.setdefault((endpoint.host, endpoint.port), endpoint)
        merged = list(seen.values())
        if merged != self._endpoints:
            self._endpoints = merged
            self._log.info("etcd_endpoints_learnt", endpoints=[str(e) for e in merged])

    async def _learn_from(self, conn: Connection) -> None:
        """With learn_members: every member's client URLs (a failure here leaves the endpoints as they were)."""
        if not self._learn_members:
            return
        try:
            members = await conn.members()
        except (Unavailable, RendezvousError):
            return
        self.learn([url for m in members if not m.learner for url in m.client_urls])

    def _retrying(self, endpoint: Endpoint, error: str) -> None:
        """A failed attempt, counted: one warning per outage, once every endpoint failed; the count said at its end.

        A lost member that the next endpoint replaces is no outage.
        """
        since, tries = self._outage or (time.monotonic(), 0)
        self._outage = (since, tries + 1)
        if tries + 1 == len(self._endpoints):
            self._log.warning("etcd_connect_retry", endpoint=str(endpoint), error=error, session=self.number,
                              detail="no endpoint answers; retrying them all, further attempts counted, not shown")

    def _connected(self, endpoint: Endpoint) -> None:
        outage, self._outage = self._outage, None
        if outage is None:
            self._log.info("etcd_connected", endpoint=str(endpoint), generation=self._gen, session=self.number)
        else:
            self._log.info("etcd_connected", endpoint=str(endpoint), generation=self._gen, session=self.number,
                           retries=outage[1], after_s=round(time.monotonic() - outage[0], 1))

    def _unreachable(self, last: str) -> EtcdUnreachable:
        names = ", ".join(map(str, self._endpoints))
        tried = f"; {self._outage[1]} attempt(s) in {time.monotonic() - self._outage[0]:.0f} s" if self._outage else ""
        msg = f"cannot reach etcd at {names} within {self.connect_timeout:g} s (last error: {last}{tried})"
        return EtcdUnreachable(msg, fix="start etcd there, or fix rendezvous.endpoints / rendezvous.tls "
                               "(raise rendezvous.connect_timeout if etcd starts slowly; a hosted rendezvous with a "
                               "secret answers only with it: rendezvous.secret_file or RUNNER_SECRET_FILE)")

    def _not_the_jobs(self, endpoint: Endpoint, last: str) -> RendezvousError:
        msg = (f"the etcd at {endpoint} is not this job's rendezvous: its certificate is not signed by the job's CA, "
               f"which the job's secret ({self._creds.trust_from}) gives; another job or a stranger holds this "
               f"address, or this node's secret is not the others' ({last})")
        return RendezvousError(msg, fix=f"give every node the same secret file ({self._creds.trust_from}); check "
                               "that the endpoint names the hosting node")

    @staticmethod
    def _refused(exc: RendezvousError) -> RendezvousError:
        detail = exc.message.removeprefix("etcd refused the request: ")
        return RendezvousError(f"etcd refused the connection: {detail}",
                               fix="check rendezvous.auth (user, password_env/password_file) and the "
                               "user's permissions on rendezvous.prefix")

    async def reconnect(self, failed_generation: int) -> None:
        """Replace the connection unless someone already did since `failed_generation`."""
        async with self._lock:
            if self._gen != failed_generation and self._client is not None:
                return
            old, self._client = self._client, None
            if old is not None:  # bounded: its calls are cancelled, and one that does not end must not hold us
                closing = asyncio.ensure_future(old.close())
                closing.add_done_callback(lambda t: t.cancelled() or t.exception())  # its outcome is not ours
                await asyncio.wait({closing}, timeout=CANCEL_TIMEOUT_S)
            await self._dial(failover=old is not None)

    async def call(self, op: Callable[[Connection], Awaitable[T]], *, budget: float | None = None) -> T:
        """Run `op(connection)`; on a lost connection reconnect and run it again (op must be idempotent).

        Returns or raises RendezvousError within `budget` seconds (default: the connect timeout), whatever
        etcd does: an unreachable etcd is a RendezvousError naming the endpoints, never a hang.
        """
        limit = self.connect_timeout if budget is None else budget
        last, delay = "no attempt", 0.0
        try:
            async with asyncio.timeout(limit):
                while True:
                    gen = self._gen
                    try:
                        if self._client is None:
                            await self.reconnect(gen)
                        result = await op(self.client)
                    except Unavailable as exc:
                        last = str(exc)
                        if (failed := self._client) is not None and self._gen == gen:
                            self._failed_at[(failed.endpoint.host, failed.endpoint.port)] = time.monotonic()
                        if self._outage is None:
                            self._log.warning("etcd_call_retry", error=last)
                        if self._probe_key is None:  # no probing connect to wait between attempts: wait here
                            await asyncio.sleep(delay)
                            delay = min(BACKOFF_MAX_S, max(BACKOFF_INITIAL_S, delay * 2))
                        await self.reconnect(gen)
                    else:
                        self.answered_at, self.last_answered = time.monotonic(), self.client.endpoint
                        return result
        except TimeoutError:
            raise self._unreachable(last) from None

    async def close(self) -> None:
        """Close the connection."""
        async with self._lock:
            old, self._client = self._client, None
            self._gen += 1
        if old is not None:
            await old.close()
