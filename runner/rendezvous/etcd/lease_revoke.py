"""Revoking a dead agent's etcd lease from its guard: what the guard is told, and the bounded call it makes.

The agent tells its guard (runner.system.shepherd_main) how to revoke the node's lease each time the lease is
granted or replaced, as a `RevokeTicket` sent over the guard's stdin pipe, and an empty ticket once it gave the lease
up itself. The guard keeps the ticket's bytes in memory only and decodes them only when the agent has died, after
it killed the job's processes: `revoke()` then revokes the lease through etcd's JSON gateway (`POST
/v3/auth/authenticate` for a token when rendezvous.auth names a user, then `POST /v3/lease/revoke`), over https with
the spec's TLS files when TLS is on (a hosted job's CA, derived from its secret, travels as PEM text in the ticket),
trying each endpoint in turn, everything within REVOKE_BUDGET_S. The lease's
keys (the node's live state and join records) vanish at once, so the peers' watches see the node gone within a
second instead of one lease TTL.

Two routes, chosen by measurement and by what etcd allows:
- etcd's JSON gateway over http.client: ~60 ms of imports in the guard (`python -S -I`, standard library only);
  the default.
- etcd's gRPC API through runner.rendezvous.etcd.client (the agent's own client): ~150 ms of imports (grpc, aetcd),
  made possible at death by the agent's sys.path, which the ticket carries. Taken when a client certificate and a
  user are both set (etcd's gateway refuses a request whose certificate has a CommonName once auth is on: "CommonName
  of client sending a request against gateway will be ignored"), and when what answers on the port is not etcd's
  gateway (it may be disabled: --enable-grpc-gateway=false).
The password, when auth is on, travels over the pipe and lives in the guard's memory: never on disk, never in an
environment, never on a command line.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from runner.system.shepherd_main import say

if TYPE_CHECKING:
    from http.client import HTTPConnection

DEATH_MARK_TTL_S = 3600  # as an agent's own final state (runner/rendezvous/etcd/backend.py FINAL_STATE_TTL_S)
REVOKE_BUDGET_S = 2.0  # the whole revoke (every endpoint, token included); a dead etcd costs the guard no more
REQUEST_TIMEOUT_S = 1.0  # one connect, one request: a silent endpoint leaves time to try another
RETRY_PAUSE_S = 0.1  # between passes over the endpoints (etcd electing a leader answers 5xx for a moment)


@dataclass(frozen=True)
class GatewayEndpoint:
    """One etcd client endpoint as the gateway is reached: host, port, https or not."""

    host: str
    port: int
    https: bool


@dataclass(frozen=True)
class RevokeTicket:
    """Everything needed to revoke one lease: the lease, where etcd is, TLS file paths, user and password."""

    lease: int
    endpoints: tuple[GatewayEndpoint, ...]
    ca: str | None = None  # absolute paths of the spec's rendezvous.tls files
    cert: str | None = None
    key: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    path: tuple[str, ...] = ()  # the agent's sys.path: where the gRPC route finds grpc and aetcd
    ca_pem: str | None = None  # a hosted job's CA (derived from its secret), as PEM text: no file to read
    final_key: str | None = None  # the node's final-state key (base64): the guard marks the node dead there

    def handler(self) -> str:
        """The module whose `on_agent_death` the guard calls with encode()'s bytes (a shepherd DeathNote)."""
        return __name__

    def encode(self) -> bytes:
        """One line of JSON (no newline in it, whatever the password holds)."""
        return json.dumps({
            "lease": self.lease, "endpoints": [[e.host, e.port, e.https] for e in self.endpoints],
            "ca": self.ca, "cert": self.cert, "key": self.key, "user": self.user, "password": self.password,
            "path": list(self.path), "ca_pem": self.ca_pem, "final_key": self.final_key,
        }, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> RevokeTicket:
        """The ticket encode() wrote; ValueError for anything else."""
        try:
            raw = json.loads(data)
            endpoints = tuple(GatewayEndpoint(str(h), int(p), bool(s)) for h, p, s in raw["endpoints"])
            lease = int(raw["lease"])
            texts = {k: raw.get(k) for k in ("ca", "cert", "key", "user", "password", "ca_pem", "final_key")}
            path = tuple(raw.get("path", ()))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            msg = f"not a revoke ticket: {type(exc).__name__}"
            raise ValueError(msg) from None
        strings = [*texts.values(), *path]
        if not all(v is None or isinstance(v, str) for v in strings) or None in path or lease <= 0 or not endpoints:
            msg = "not a revoke ticket: bad field"
            raise ValueError(msg)
        return cls(lease, endpoints, texts["ca"], texts["cert"], texts["key"], texts["user"], texts["password"], path,
                   texts["ca_pem"], texts["final_key"])

    @property
    def tls(self) -> bool:
        """Whether TLS was given (then every endpoint is reached over https, as the agent's client does)."""
        return any((self.ca, self.cert, self.key, self.ca_pem))


LeaseListener = Callable[[RevokeTicket | None], None]


@runtime_checkable
class LeaseHolder(Protocol):
    """A rendezvous backend that holds a lease a dead agent's guard should revoke (the etcd backends)."""

    def on_lease(self, listener: LeaseListener) -> None:
        """Call `listener` with a ticket whenever the lease is granted or replaced, with None once given up."""


class RevokeError(Exception):
    """The lease could not be revoked within the budget; the message says what each endpoint answered."""


def death_mark() -> bytes:
    """The final state a guard writes for its dead agent's node: it ended, and how.

    A hosting node's linger reads it and stops waiting for that node; `runner status` shows it.
    """
    return json.dumps({"state": "SHUTDOWN", "outcome": "died", "by": "guard", "time": time.time()}).encode()


def on_agent_death(ticket: bytes) -> None:
    """In the guard of a dead agent: revoke its lease (bounded); say on stderr when that failed, and what it costs."""
    try:
        revoke(RevokeTicket.decode(ticket))
    except (RevokeError, ValueError) as exc:
        say(f"runner guard: the agent died and its etcd lease could not be revoked within {REVOKE_BUDGET_S:g} s "
            f"({exc}); its peers see this node lost when the lease expires (rendezvous.lease_ttl)\n")


def revoke(ticket: RevokeTicket, budget: float = REVOKE_BUDGET_S, clock: Callable[[], float] = time.monotonic) -> str:
    """Revoke the ticket's lease within `budget` seconds: 'revoked' or 'already gone'; RevokeError otherwise.

    A lease etcd does not know (expired, revoked by the agent itself, etcd's data lost) is 'already gone'. Auth
    refused is final (another try would be refused as well); an endpoint that is down, silent or answers 5xx is
    left for the next one, until the budget is spent.
    """
    deadline = clock() + budget
    if ticket.cert and ticket.user is not None:  # the gateway would refuse the certificate's CommonName
        return revoke_grpc(ticket, budget)
    try:
        return _revoke_gateway(ticket, deadline, clock)
    except _NoGatewayError:
        return revoke_grpc(ticket, deadline - clock())


def _revoke_gateway(ticket: RevokeTicket, deadline: float, clock: Callable[[], float]) -> str:
    errors: dict[str, str] = {}
    while True:
        for endpoint in ticket.endpoints:
            left = deadline - clock()
            if left <= 0:
                raise RevokeError("; ".join(f"{k}: {v}" for k, v in errors.items()) or "no time left")
            try:
                return _revoke_at(ticket, endpoint, min(REQUEST_TIMEOUT_S, left))
            except OSError as exc:  # refused, reset, timed out, TLS failure: another endpoint may answer
                errors[f"{endpoint.host}:{endpoint.port}"] = str(exc) or type(exc).__name__
            except _RetryableError as exc:
                errors[f"{endpoint.host}:{endpoint.port}"] = str(exc)
        if deadline - clock() <= RETRY_PAUSE_S:
            raise RevokeError("; ".join(f"{k}: {v}" for k, v in errors.items()))
        time.sleep(RETRY_PAUSE_S)


class _RetryableError(Exception):
    """etcd answered, but a moment later it may not say the same (5xx: no leader yet, overloaded)."""


class _NoGatewayError(Exception):
    """What answered is not etcd's JSON gateway (disabled, or refusing our certificate): use gRPC."""


def revoke_grpc(ticket: RevokeTicket, budget: float) -> str:
    """Revoke through etcd's gRPC API with the agent's own client, within `budget` s; RevokeError otherwise.

    Imports grpc and aetcd from the agent's sys.path (the ticket's), which the guard does not load while it waits.
    """
    sys.path.extend(p for p in ticket.path if p not in sys.path)
    errors: dict[str, str] = {}
    try:
        return asyncio.run(asyncio.wait_for(_revoke_grpc(ticket, errors), max(0.0, budget)))
    except TimeoutError:
        said = "; ".join(f"{k}: {v}" for k, v in errors.items()) or "no answer"
        raise RevokeError(f"gRPC: {said}") from None


async def _revoke_grpc(ticket: RevokeTicket, errors: dict[str, str]) -> str:
    """Try each endpoint in turn until one revokes the lease (the caller bounds it); what failed goes to `errors`."""
    from runner.errors import RendezvousError
    from runner.rendezvous.etcd.client import ClusterIdentity, Connection, Credentials, Endpoint, Unavailable

    try:
        creds = (Credentials(ca=ticket.ca_pem.encode(), user=ticket.user, password=ticket.password)
                 if ticket.ca_pem is not None else
                 Credentials.load(ticket.ca, ticket.cert, ticket.key, ticket.user, ticket.password))
    except RendezvousError as exc:
        raise RevokeError(exc.message) from None
    while True:
        for e in ticket.endpoints:
            conn = Connection(Endpoint(e.host, e.port, e.https), creds, ClusterIdentity(), REQUEST_TIMEOUT_S)
            try:
                await conn.authenticate()
                await conn.lease_revoke(ticket.lease)  # a lease etcd no longer knows is fine too
                if ticket.final_key is not None:  # best effort: the node's final state says it died
                    with contextlib.suppress(Unavailable, RendezvousError):
                        mark = await conn.lease_grant(DEATH_MARK_TTL_S)
                        await conn.put(base64.b64decode(ticket.final_key), death_mark(), lease=mark)
            except Unavailable as exc:
                errors[f"{e.host}:{e.port}"] = str(exc) or type(exc).__name__
                continue
            except RendezvousError as exc:
                raise RevokeError(f"{e.host}:{e.port}: {exc.message}") from None
            finally:
                await conn.close()
            return "revoked"
        await asyncio.sleep(RETRY_PAUSE_S)  # the caller's timeout ends this loop


def _revoke_at(ticket: RevokeTicket, endpoint: GatewayEndpoint, timeout: float) -> str:
    import http.client

    conn: HTTPConnection
    if ticket.tls or endpoint.https:
        import ssl

        context = ssl.create_default_context(cafile=ticket.ca, cadata=ticket.ca_pem)
        if ticket.cert:
            context.load_cert_chain(ticket.cert, ticket.key)
        conn = http.client.HTTPSConnection(endpoint.host, endpoint.port, timeout=timeout, context=context)
    else:
        conn = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"}
        if ticket.user is not None:
            status, reply = _post(conn, "/v3/auth/authenticate", {"name": ticket.user,
                                                                  "password": ticket.password or ""}, headers)
            token = reply.get("token")
            if status != 200 or not isinstance(token, str):
                raise _refusal("authenticate", status, reply)
            headers["Authorization"] = token
        status, reply = _post(conn, "/v3/lease/revoke", {"ID": str(ticket.lease)}, headers)
        if status == 200 or "lease not found" in str(reply.get("error", "")):
            _mark_dead_gateway(conn, ticket, headers)
    finally:
        conn.close()
    if status == 200:
        return "revoked"
    if "lease not found" in str(reply.get("error", "")):
        return "already gone"
    raise _refusal("lease revoke", status, reply)


def _mark_dead_gateway(conn: HTTPConnection, ticket: RevokeTicket, headers: dict[str, str]) -> None:
    """Best effort, after the revoke: the node's final state says it died (on a lease of its own, as an agent's)."""
    if ticket.final_key is None:
        return
    try:
        status, reply = _post(conn, "/v3/lease/grant", {"TTL": str(DEATH_MARK_TTL_S)}, headers)
        lease = reply.get("ID")
        if status != 200 or not isinstance(lease, str):
            return
        _post(conn, "/v3/kv/put", {"key": ticket.final_key, "value": base64.b64encode(death_mark()).decode(),
                                   "lease": lease}, headers)
    except (OSError, _RetryableError):
        return  # the revoke is what matters; a linger then waits out its bound for this node


def _post(conn: HTTPConnection, path: str, body: dict[str, str],
          headers: dict[str, str]) -> tuple[int, dict[str, object]]:
    import http.client

    try:
        conn.request("POST", path, body=json.dumps(body), headers=headers)
        response = conn.getresponse()
        data = response.read(64 * 1024)  # etcd's replies here are a few hundred bytes
    except http.client.HTTPException as exc:  # not HTTP at all, or cut short: maybe not so at the next endpoint
        raise _RetryableError(f"{path}: {type(exc).__name__}") from None
    try:
        reply = json.loads(data)
    except ValueError:
        reply = {}
    return response.status, reply if isinstance(reply, dict) else {}


def _refusal(what: str, status: int, reply: dict[str, object]) -> Exception:
    """The error for etcd's refusal: retryable for a 5xx, final otherwise (auth refused, permission denied)."""
    detail = str(reply.get("message") or reply.get("error") or f"HTTP {status}")
    if "code" not in reply and status < 500:  # not etcd's gateway answering (disabled, or our certificate refused)
        return _NoGatewayError(f"{what}: {detail}")
    if status >= 500:
        return _RetryableError(f"{what}: {detail}")
    return RevokeError(f"{what}: {detail}")
