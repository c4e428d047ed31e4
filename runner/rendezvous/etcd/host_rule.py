"""Which node hosts a hosted rendezvous (rendezvous.hosted): a rule each node evaluates alone, without the others.

The rule, the one torchrun's c10d backend applies to its store:

1. The endpoint's host (`endpoints[0]`, a name or an address) is resolved; this machine is the hosting machine when
   one of those addresses is its own, i.e. a socket can be bound to it here. Every other machine cannot bind it, so
   exactly one machine qualifies when the endpoint names a machine (a loopback endpoint qualifies on every machine:
   it is meant for one machine only).
2. On the hosting machine, the agent that binds the endpoint's port first hosts; any other agent of the job on the
   same machine (several nodes on one machine, as in the tests) finds the port taken and joins as a client.

A node that does not host waits for the endpoint to accept connections, at most rendezvous.join_timeout: the
hosting node may start later than the others.

A loopback endpoint (127.0.0.1, `localhost`, or a name that resolves to a loopback address on this machine, as a
hostname mapped to 127.0.1.1 by /etc/hosts) is hosted on every machine where it is tried: two machines of one job
would each host an etcd and form a job of their own, each training alone (a split brain nobody is told of). So an
agent refuses to host or join a loopback endpoint while the spec allows more than one node, unless its node id was
given by hand (`--node` or $RUNNER_NODE): that is how several agents of one machine tell themselves apart, and the
only layout in which a loopback endpoint is right (`refuse_loopback`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

from runner.errors import RendezvousError
from runner.system import tcp
from runner.system.served import tcp_listeners

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

WAIT_RETRY_S = 0.2
WAIT_RETRY_MAX_S = 1.0
PROBE_TIMEOUT_S = 2.0
PROC = Path("/proc")
WILDCARDS = ("0.0.0.0", "::")  # noqa: S104 - addresses a listener may hold, never bound here


async def local_addresses(host: str) -> tuple[str, ...]:
    """The addresses `host` resolves to that this machine owns (it can bind them); empty: not this machine.

    A name that does not resolve (yet) is no address of this machine.
    """
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return ()
    found: dict[str, None] = {}
    for family, _, _, _, sockaddr in infos:
        ip = str(sockaddr[0])
        if family in (socket.AF_INET, socket.AF_INET6) and ip not in found and can_bind(family, ip):
            found[ip] = None
    return tuple(found)


def loopback_only(ips: tuple[str, ...]) -> bool:
    """Whether every one of `ips` (at least one) is a loopback address: an endpoint every machine has."""
    return bool(ips) and all(ipaddress.ip_address(ip.split("%", 1)[0]).is_loopback for ip in ips)


def refuse_loopback(endpoint: str, ips: tuple[str, ...], nodes_max: int, *, node_named: bool) -> str | None:
    """Why a hosted rendezvous on `endpoint` (resolving here to `ips`) must not start, or None.

    Refused: a loopback endpoint while more than one node may join, by an agent whose node id was not given by hand
    (the module's docstring). `ips` empty (the endpoint is another machine's) is never refused.
    """
    if nodes_max <= 1 or not loopback_only(ips) or node_named:
        return None
    host = endpoint.rpartition(":")[0].strip("[]")
    seen = "" if host in ips else f" (it resolves to {', '.join(ips)} here)"
    return (f"rendezvous.endpoints: {endpoint} is a loopback address{seen}, which every machine has: with up to "
            f"{nodes_max} nodes, each machine would host an etcd and train a job of its own")


LOOPBACK_FIX = ("give the hosting machine's name or address that the other machines reach "
                '(endpoints: ["node0:29400"]); to run several nodes on this one machine, name each agent: '
                "runner job.yaml --node a")


def can_bind(family: int, ip: str, port: int = 0) -> bool:
    """Whether a TCP socket can be bound to `ip`:`port` here (port 0: whether the address is this machine's)."""
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((ip, port))
        except OSError:
            return False
    return True


def port_taken(ips: tuple[str, ...], port: int, proc: Path = PROC) -> bool:
    """Whether a socket listens on `port` at one of `ips` or at a wildcard address: per /proc/net/tcp and tcp6.

    That is another agent's etcd (or any other server). Listeners count, not bound sockets: the connections of an
    etcd that just stopped may hold the port a while longer (FIN_WAIT), and etcd can listen in spite of them.
    """
    wanted = {*ips, *WILDCARDS}
    for name in ("tcp", "tcp6"):
        try:
            table = (proc / "net" / name).read_text()
        except OSError:
            continue
        if any(ip in wanted for ip, p, _ in tcp_listeners(table) if p == port):
            return True
    return False


def url_host(ip: str) -> str:
    """`ip` as the host part of a URL (IPv6 in brackets)."""
    return f"[{ip}]" if ":" in ip else ip


async def wait_for_host(host: str, port: int, timeout: float, log: FilteringBoundLogger,
                        also: tuple[tuple[str, int], ...] = ()) -> None:
    """Return once `host`:`port` or one of `also` accepts TCP connections; RendezvousError after `timeout` s.

    `also`: the spec's other endpoints (the hosted etcd's other members). Retried with a short backoff: the hosting
    node may not have started yet (nothing listens, or the name does not resolve yet, as a Kubernetes service before
    its pod is ready).
    """
    deadline = time.monotonic() + timeout
    delay, last, said = WAIT_RETRY_S, "no attempt", False
    while True:
        for target in ((host, port), *also):
            refused = await accepts(*target, min(PROBE_TIMEOUT_S, max(0.1, deadline - time.monotonic())))
            if refused is None:
                return
            last = refused
        if not said:
            log.info("rendezvous_waiting_for_host", endpoint=f"{host}:{port}", error=last,
                     message=f"waiting for the hosting node's etcd at {url_host(host)}:{port} (at most {timeout:g} s, "
                             f"rendezvous.join_timeout; the node whose machine has {host} starts it): {last}")
            said = True
        if time.monotonic() + delay > deadline:
            msg = (f"the hosting node's etcd at {url_host(host)}:{port} did not answer within {timeout:g} s "
                   f"(rendezvous.join_timeout; last error: {last})")
            raise RendezvousError(msg, fix=f"start the node whose machine has the address {host} (with "
                                  "rendezvous.hosted it starts etcd there), or fix rendezvous.endpoints; check that "
                                  f"port {port} is open between the machines")
        await asyncio.sleep(delay)
        delay = min(WAIT_RETRY_MAX_S, delay * 2)


async def accepts(host: str, port: int, timeout: float) -> str | None:
    """None when `host`:`port` accepts a TCP connection within `timeout` s; else why not (the error, one line)."""
    error = await tcp.dial(host, port, timeout)
    return None if error is None else (str(error) or type(error).__name__)


async def serving_elsewhere(targets: tuple[tuple[str, int], ...], timeout: float) -> str | None:
    """The first of `targets` (host, port) that accepts a connection; None when none does within `timeout` s.

    `targets`: the spec's other endpoints, where a surviving member of the job's etcd serves; all tried at once.
    """
    if not targets:
        return None
    refusals = await asyncio.gather(*(accepts(host, port, timeout) for host, port in targets))
    return next((f"{url_host(h)}:{p}" for (h, p), why in zip(targets, refusals, strict=True) if why is None), None)
