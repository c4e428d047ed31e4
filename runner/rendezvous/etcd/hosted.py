"""Hosted rendezvous (rendezvous.hosted): one node starts etcd itself, every node (that one included) uses it.

Who hosts: runner.rendezvous.etcd.host_rule (the node whose machine has the endpoint's address; on that machine,
the first agent to bind its port). The etcd process: runner.rendezvous.etcd.hosted_server. Everything else (rounds,
elasticity, restarts, `runner status` / `runner stop`) is the etcd backend's, runner.rendezvous.etcd.backend,
unchanged: this class wraps it.

Lifetime. The hosting node's etcd must stay up while another node still uses it. At close the hosting agent leaves
the rendezvous like any node, then waits until no other node is live (each one's live state key is gone: it left,
or its lease expired), at most shutdown.grace_period + rendezvous.lease_ttl + rendezvous.connect_timeout (the others'
workers stopping, a lost node's lease expiring, their last writes), then stops etcd. A hosting node stopped by a
signal takes the rendezvous with it: it first asks every node to stop, as `runner stop` does.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from runner.config.spec import JobSpec
from runner.errors import RendezvousError
from runner.observe.logs import RUN_LOG
from runner.rendezvous.base import RendezvousResult
from runner.rendezvous.etcd.admin import write_control
from runner.rendezvous.etcd.backend import EtcdRendezvous
from runner.rendezvous.etcd.client import Endpoint, EtcdSession, prefix_range
from runner.rendezvous.etcd.connect import new_session, refuse_without_secret
from runner.rendezvous.etcd.host_rule import (
    LOOPBACK_FIX,
    local_addresses,
    loopback_only,
    port_taken,
    refuse_loopback,
    url_host,
    wait_for_host,
)
from runner.rendezvous.etcd.hosted_server import HostedEtcd
from runner.rendezvous.etcd.job_secret import job_trust
from runner.rendezvous.etcd.keys import JobKeys, load
from runner.rendezvous.etcd.lease_revoke import LeaseListener

if TYPE_CHECKING:
    from collections.abc import Callable

    from structlog.typing import FilteringBoundLogger

    from runner.events import Event, StopRequested
    from runner.hangs import RankRecord
    from runner.rendezvous.node_ledger import Mark, NodeRecord

LINGER_POLL_S = 0.25


class HostedRendezvous:
    """The etcd backend on an etcd that this node starts when the rule says it hosts. No I/O until open()."""

    def __init__(self, spec: JobSpec, node: str, *, advertise_addr: str, run_dir: Path | None = None,
                 log: FilteringBoundLogger | None = None, node_named: bool = False) -> None:
        self._spec, self._node, self._run_dir, self._node_named = spec, node, run_dir, node_named
        self._log = log or structlog.get_logger("runner.rendezvous.etcd.hosted").bind(node=node)
        self._inner = EtcdRendezvous(spec, node, advertise_addr=advertise_addr, log=self._log)
        self._server: HostedEtcd | None = None
        self._admitted = False

    @property
    def server(self) -> HostedEtcd | None:
        """The etcd this node hosts (None on the other nodes, and once stopped)."""
        return self._server

    def on_lease(self, listener: LeaseListener) -> None:
        """As the etcd backend's: `listener` learns how to revoke this node's lease (its guard, if the agent dies)."""
        self._inner.on_lease(listener)

    def on_stop(self, sink: Callable[[StopRequested], None]) -> None:
        """As the etcd backend's: `runner stop` goes to `sink`."""
        self._inner.on_stop(sink)

    async def open(self, events: asyncio.Queue[Event]) -> None:
        """Host etcd when the rule says so, else wait for the hosting node's (join_timeout); then join the job."""
        rdzv = self._spec.rendezvous
        endpoint = Endpoint.parse(rdzv.endpoints[0])
        ips = await local_addresses(endpoint.host)
        why = refuse_loopback(rdzv.endpoints[0], ips, self._spec.nodes.max, node_named=self._node_named)
        if why:
            raise RendezvousError(why, fix=LOOPBACK_FIX)
        if loopback_only(ips) and self._spec.nodes.max > 1:
            self._log.warning("rendezvous_loopback_endpoint", endpoint=rdzv.endpoints[0],
                              detail="a loopback endpoint: only agents on this machine can join this job")
        await refuse_without_secret(self._spec)
        trust = job_trust(rdzv, self._spec.name)  # read now: a bad secret file is refused before anything starts
        if ips and not port_taken(ips, endpoint.port):
            server = HostedEtcd(self._folder(), ips, endpoint.port, f"{url_host(endpoint.host)}:{endpoint.port}",
                                self._log, trust=trust, host=endpoint.host)
            if await server.start(rdzv.connect_timeout):
                self._server = server
            elif not port_taken(ips, endpoint.port):
                msg = f"cannot host the rendezvous: port {endpoint.port} is in use on this machine, but not by a server"
                raise RendezvousError(msg, fix="free the port (see `ss -tanp`), or choose another port in "
                                      "rendezvous.endpoints")
        if self._server is None:
            if ips:
                self._log.info("rendezvous_hosted_by_another_agent", endpoint=rdzv.endpoints[0],
                               detail="the port is taken on this machine: joining the etcd listening there")
            await wait_for_host(endpoint.host, endpoint.port, rdzv.join_timeout, self._log)
        await self._inner.open(events)
        self._admitted = True

    def _folder(self) -> Path:
        """Where etcd keeps its data and log: <run dir>/etcd (a fresh temporary folder when no run dir is known)."""
        if self._run_dir is not None:
            return self._run_dir / "etcd"
        sink = RUN_LOG.sink  # the agent's run dir holds agent.jsonl
        if sink is not None:
            return sink.path.parent / "etcd"
        return Path(tempfile.mkdtemp(prefix="runner-etcd-"))

    async def next_round(self, attempt: int) -> RendezvousResult:
        """As the etcd backend."""
        return await self._inner.next_round(attempt)

    async def charge_restart(
        self, max_restarts: int, failure_class: str = "", class_limit: int | None = None, *, charged: bool = True,
        defer: float = 0.0,
    ) -> int | None:
        """As the etcd backend."""
        return await self._inner.charge_restart(max_restarts, failure_class, class_limit, charged=charged,
                                                 defer=defer)

    async def share_hang(self, local: list[RankRecord], *, timeout: float) -> list[RankRecord]:
        """As the etcd backend."""
        return await self._inner.share_hang(local, timeout=timeout)

    async def note_node(self, mark: Mark | None) -> None:
        """As the etcd backend."""
        await self._inner.note_node(mark)

    async def node_ledger(self) -> dict[str, NodeRecord]:
        """As the etcd backend."""
        return await self._inner.node_ledger()

    async def publish(self, state: dict[str, object]) -> None:
        """As the etcd backend."""
        await self._inner.publish(state)

    async def close(self, outcome: str, *, alone: bool = False) -> None:
        """Leave; the hosting node then waits for the others to leave (bounded) and stops its etcd."""
        server = self._server
        if server is None:
            await self._inner.close(outcome, alone=alone)
            return
        try:
            if outcome == "stopped" and self._admitted:
                await self._stop_others()
            await self._inner.close(outcome, alone=alone)
        finally:
            try:
                if self._admitted and self._inner.fenced is None:  # a fenced node reaches no etcd: nothing to wait for
                    await self._linger()
            finally:
                self._server = None
                await server.stop()

    async def _stop_others(self) -> None:
        """Ask every node to stop (the control key, as `runner stop`): the rendezvous leaves with this node."""
        keys = JobKeys(self._spec.rendezvous.prefix, self._spec.name)
        value = {"state": "stopping", "graceful": False, "by": self._node, "why": "the hosting node was stopped"}
        try:
            async with asyncio.timeout(self._spec.rendezvous.connect_timeout):
                await write_control(self._inner.session, keys, value)
        except (RendezvousError, TimeoutError) as exc:
            self._log.warning("hosted_stop_request_failed", error=str(exc) or type(exc).__name__)
        else:
            self._log.info("hosted_node_stopped_job", detail="the other nodes are asked to stop")

    async def _linger(self) -> None:
        """Wait until no other node is live nor owes its end, at most grace_period + lease_ttl + connect_timeout.

        A node owes its end when a round included it and it has written no final state: cut off by a network
        partition, its lease may have lapsed (and the others gone on without it) while its agent still runs; once
        back, it must find the etcd to learn that the job closed (else it would fail for want of a rendezvous).
        Never raises.
        """
        spec, rdzv = self._spec, self._spec.rendezvous
        limit = spec.shutdown.grace_period + rdzv.lease_ttl + rdzv.connect_timeout
        keys = JobKeys(rdzv.prefix, spec.name)
        session = new_session(spec, self._log)
        started, live, said = time.monotonic(), ["?"], False
        shown: tuple[list[str], list[str]] | None = None
        try:
            async with asyncio.timeout(limit):
                await session.connect()
                members = await round_members(session, keys)
                while True:
                    _, (kvs, finals) = await session.call(lambda c: c.snapshot(
                        [prefix_range(keys.states), prefix_range(keys.finals)]))
                    ended = {JobKeys.leaf(kv.key) for kv in finals} | {self._node}
                    running = {JobKeys.leaf(kv.key) for kv in kvs} - {self._node}
                    live = sorted(running | (members - ended))
                    if not live:
                        break
                    # said again whenever it changes: `lapsed` are nodes whose lease lapsed but who owe their end
                    lapsed = sorted(members - ended - running)
                    if shown != (live, lapsed):
                        self._log.info("hosted_etcd_waiting_for_nodes", nodes=live, lapsed=lapsed,
                                       at_most_s=round(limit - (time.monotonic() - started), 1))
                        shown, said = (live, lapsed), True
                    await asyncio.sleep(LINGER_POLL_S)
        except (RendezvousError, TimeoutError, ValueError) as exc:
            self._log.warning("hosted_etcd_stopping_with_live_nodes", nodes=live, waited_s=round(
                time.monotonic() - started, 1), error=str(exc) or f"still live after {limit:g} s")
        else:
            if said:
                self._log.info("hosted_etcd_nodes_left", waited_s=round(time.monotonic() - started, 1))
        finally:
            await session.close()


async def round_members(session: EtcdSession, keys: JobKeys) -> set[str]:
    """Every node that any round of the job included (the rounds' results; join records vanish with leases)."""
    _, (kvs,) = await session.call(lambda c: c.snapshot([prefix_range(keys.rounds)]))
    members: set[str] = set()
    for kv in kvs:
        if not bytes(kv.key).endswith(b"/result"):
            continue
        record = load(kv.value)
        nodes = record.get("nodes") if isinstance(record, dict) else None
        if isinstance(nodes, list):
            members.update(str(n) for n in nodes)
    return members
