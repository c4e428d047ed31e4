"""Hosted rendezvous (rendezvous.hosted): one node starts etcd itself, every node (that one included) uses it.

Who hosts: runner.rendezvous.etcd.host_rule (the node whose machine has the endpoint's address; on that machine,
the first agent to bind its port). The etcd process: runner.rendezvous.etcd.hosted_server. Everything else (rounds,
elasticity, restarts, `runner status` / `runner stop`) is the etcd backend's, runner.rendezvous.etcd.backend,
unchanged: this class wraps it.

Members. With the job's secret, the hosted etcd grows to rendezvous.hosted_members members (3 by default) on the job's
first nodes, each on a machine of its own (runner.rendezvous.etcd.members): losing any one host then leaves a
quorum, and the survivors go on as after any lost node. With one member (hosted_members 1, a job of at most two
nodes, no secret, a loopback endpoint) the hosting node is the rendezvous, as before.

Lifetime. The etcd must stay up while another node still uses it. At close a member leaves the rendezvous like any
node, then removes itself from the cluster while other members remain (its etcd stops); the last member waits
until no other node is live (each one's live state key is gone: it left, or its lease expired), at most
shutdown.grace_period + rendezvous.lease_ttl + rendezvous.connect_timeout (the others' workers stopping, a lost
node's lease expiring, their last writes), then stops etcd. A lone member stopped by a signal takes the rendezvous
with it: it first asks every node to stop, as `runner stop` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import tempfile
import time
from collections.abc import Awaitable, Coroutine, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import structlog

from runner.config.spec import JobSpec
from runner.contract import HOSTED_NODES_ENV
from runner.errors import RendezvousError
from runner.observe.logs import RUN_LOG
from runner.rendezvous.base import RendezvousResult, RoundCharge
from runner.rendezvous.etcd import founder
from runner.rendezvous.etcd.admin import write_control
from runner.rendezvous.etcd.backend import EtcdRendezvous
from runner.rendezvous.etcd.client import Endpoint, EtcdSession, EtcdUnreachable, prefix_range
from runner.rendezvous.etcd.connect import credentials, new_session, refuse_without_secret
from runner.rendezvous.etcd.host_rule import (
    LOOPBACK_FIX,
    PROBE_TIMEOUT_S,
    local_addresses,
    loopback_only,
    port_taken,
    refuse_loopback,
    serving_elsewhere,
    url_host,
    wait_for_host,
)
from runner.rendezvous.etcd.hosted_server import STOP_GRACE_S, HostedEtcd, PeerPlan
from runner.rendezvous.etcd.job_secret import job_trust
from runner.rendezvous.etcd.keys import JobKeys, load
from runner.rendezvous.etcd.lease_revoke import LeaseListener
from runner.rendezvous.etcd.member_memo import MemberMemo, recall
from runner.rendezvous.etcd.members import MEMBER_AT, Membership, Place, target
from runner.rundir.layout import members_memo_path

if TYPE_CHECKING:
    from collections.abc import Callable

    from structlog.typing import FilteringBoundLogger

    from runner.events import Event, StopRequested
    from runner.hangs import RankRecord
    from runner.outcomes import FailureClass
    from runner.rendezvous.node_ledger import Mark, NodeRecord

LINGER_POLL_S = 0.25
STOPPED_GRACE_S = 1.0  # etcd's SIGTERM grace when the job was stopped (the whole close has a few seconds)
T = TypeVar("T")


class HostedRendezvous:
    """The etcd backend on an etcd that this node starts when the rule says it hosts. No I/O until open().

    One concern over 20 methods: a hosted rendezvous's life around the etcd backend it wraps. Half are the
    Rendezvous protocol passed through (with the lost-rendezvous guard); the rest start the etcd, keep its members
    (runner.rendezvous.etcd.members does the membership itself) and end it in order: leave, linger, stop.
    """

    def __init__(self, spec: JobSpec, node: str, *, advertise_addr: str, run_dir: Path | None = None,
                 log: FilteringBoundLogger | None = None, node_named: bool = False,
                 environ: Mapping[str, str] = os.environ) -> None:
        """`environ`: where the cluster templates' member hosts are read (HOSTED_NODES_ENV)."""
        spec, self._hint_error = with_member_hosts(spec, environ.get(HOSTED_NODES_ENV, ""))
        self._spec, self._node, self._run_dir, self._node_named = spec, node, run_dir, node_named
        self._log = log or structlog.get_logger("runner.rendezvous.etcd.hosted").bind(node=node)
        self._inner = EtcdRendezvous(spec, node, advertise_addr=advertise_addr, log=self._log)
        self._advertise = advertise_addr
        self._members: Membership | None = None
        self._reconciling: asyncio.Task[None] | None = None
        self._founding: asyncio.Task[None] | None = None  # the founder's watch (runner.rendezvous.etcd.founder)
        self._leaderless = False  # the founder's watch found its etcd without a leader at its last look
        self._going_alone = False  # the founder going on alone, until the lost node was let go
        self._admitted = False
        self._lost: str | None = None  # why the rendezvous is lost (_unless_lost)
        self._lost_at = 0.0  # when (monotonic): an answer of etcd after it means the rendezvous is back
        # the members this node last knew, on its machine: found again when it starts again (member_memo.py)
        self._memo = MemberMemo(members_memo_path(spec.name, spec.identity()), self._log)

    @property
    def _server(self) -> HostedEtcd | None:
        return self._members.server if self._members is not None else None

    @property
    def server(self) -> HostedEtcd | None:
        """The etcd member this node runs: the hosting node's, or the one it joined as (else None, and once stopped)."""
        return self._server

    def on_lease(self, listener: LeaseListener) -> None:
        """As the etcd backend's: `listener` learns how to revoke this node's lease (its guard, if the agent dies)."""
        self._inner.on_lease(listener)

    def on_stop(self, sink: Callable[[StopRequested], None]) -> None:
        """As the etcd backend's: `runner stop` goes to `sink`."""
        self._inner.on_stop(sink)

    async def open(self, events: asyncio.Queue[Event]) -> None:
        """Host etcd when the rule says so, else wait for the hosting node's (join_timeout); then join the job."""
        if self._hint_error is not None:
            raise self._hint_error
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
        count = target(self._spec, secured=trust is not None and not loopback_only(ips))
        members = self._members = await self._membership(endpoint.port, count)
        others = tuple((e.host, e.port) for e in map(Endpoint.parse, rdzv.endpoints[1:])) + self._recalled()
        elsewhere = bool(ips) and not port_taken(ips, endpoint.port) and await self._members_elsewhere(others)
        if ips and not elsewhere and not port_taken(ips, endpoint.port):
            plan = Place(ips[0], endpoint.port).plan(self._node) if count > 1 else None
            server = HostedEtcd(self._folder(), ips, endpoint.port, f"{url_host(endpoint.host)}:{endpoint.port}",
                                self._log, trust=trust, host=endpoint.host, peer=plan)
            # False: the port was taken between the look and etcd's bind, by another agent of this machine that
            # hosts, or by the hosting agent's etcd starting again: this node joins as if it had found it taken.
            if await server.start(rdzv.connect_timeout):
                members.server = server
                if plan is not None:  # the founder, members to come: it goes on alone should the other of two go
                    watch = founder.watch(server.client_urls.split(",")[0], credentials(self._spec), plan.name,
                                          lambda lost: self._go_on_alone(server, lost.name), self._log,
                                          leaderless=self._saw_leaderless)
                    self._founding = asyncio.get_running_loop().create_task(watch, name="etcd-founder")
        if self._server is None:
            if ips and not elsewhere:
                self._log.info("rendezvous_hosted_by_another_agent", endpoint=rdzv.endpoints[0],
                               detail="the port is taken on this machine: joining the etcd listening there")
            await wait_for_host(endpoint.host, endpoint.port, rdzv.join_timeout, self._log, also=others)
        await self._inner.open(events)
        self._admitted = True
        if count > 1:
            self._log.info("rendezvous_members_planned", members=count, hosts="the job's first nodes, one per "
                           "machine", detail="the rendezvous outlives any one of them")

    def _recalled(self) -> tuple[tuple[str, int], ...]:
        """The members this node's machine last knew of this job, beyond the spec's endpoints (member_memo.py).

        Tried as the spec's other endpoints are: a node started again after the first endpoint's member was lost
        finds the members that went on, even when the spec names that machine alone.
        """
        given = {(e.host, e.port) for e in map(Endpoint.parse, self._spec.rendezvous.endpoints)}
        found = [e for e in recall(self._memo.path) if (e.host, e.port) not in given]
        if found:
            self._inner.also_known = [str(e) for e in found]
            self._log.info("rendezvous_members_recalled", endpoints=self._inner.also_known,
                           detail="the members this machine last knew of the job, tried beside the spec's endpoints")
        return tuple((e.host, e.port) for e in found)

    def _saw_leaderless(self, leaderless: bool) -> None:
        self._leaderless = leaderless

    async def _go_on_alone(self, server: HostedEtcd, lost: str) -> None:
        """The founder's etcd as a cluster of one (runner.rendezvous.etcd.founder); the lost voter's node let go.

        Let go at once: its lease revoked, so every node hears it is lost now, not a lease_ttl after etcd was back (etcd
        extends every lease when a leader is elected). Cut off rather than lost, that node holds one voter of two:
        it could not go on anyway, and its lease lapsing is what fences it.
        """
        self._going_alone = True  # until the lost node was let go: the news of it comes late (recovering)
        try:
            await server.go_on_alone()
            await self._let_go(lost)
        finally:
            self._going_alone = False

    async def _let_go(self, lost: str) -> None:
        """The lost node's lease revoked (its live state's), so every node hears of its loss now."""
        keys = JobKeys(self._spec.rendezvous.prefix, self._spec.name)
        session = self._inner.session
        try:
            kv = await session.call(lambda c: c.get(keys.state(lost)))
            if kv is not None and kv.lease:
                await session.call(lambda c: c.lease_revoke(kv.lease))
                self._log.info("rendezvous_lost_node_let_go", lost=lost, lease=f"{kv.lease:#x}")
        except RendezvousError as exc:  # its lease then lapses by itself, a lease_ttl later
            self._log.info("rendezvous_lost_node_lease_left", lost=lost, error=exc.message)

    async def _members_elsewhere(self, others: tuple[tuple[str, int], ...]) -> bool:
        """Whether the job's etcd already serves at another of the spec's endpoints.

        Then this machine's member was lost and the others went on: this node joins them as a client (and may become
        a member again as the cluster grows back) rather than host a second, empty etcd under the job's first
        endpoint. At a job's start no other endpoint serves yet: only the first endpoint's machine hosts, the
        others become members later.
        """
        found = await serving_elsewhere(others, PROBE_TIMEOUT_S)
        if found is not None:
            self._log.warning("rendezvous_members_elsewhere", endpoint=found,
                              message=f"the job's etcd answers at {found}: this machine's member was lost, this node "
                                      "joins the members that went on instead of starting an etcd of its own")
        return found is not None

    async def _membership(self, port: int, count: int) -> Membership:
        """This node's part in the members (`count`: their target), its member's address in every state record.

        Published there, the address lets the members grow over machines, not nodes (runner.rendezvous.etcd.members).
        """
        place = await self._place(port)
        if place is not None and count > 1:
            self._inner.always_published = {MEMBER_AT: place.ip}
        rdzv = self._spec.rendezvous
        return Membership(self._node, JobKeys(rdzv.prefix, self._spec.name), target=count, place=place,
                          start=lambda plan: self._start_member(plan, port), promote_timeout=rdzv.connect_timeout,
                          log=self._log)

    async def _place(self, port: int) -> Place | None:
        """Where a member of this node would serve: its advertised address, if this machine's and no loopback one.

        None: this node never becomes a member.
        """
        ips = [ip for ip in await local_addresses(self._advertise) if not loopback_only((ip,))]
        return Place(ips[0], port) if ips else None

    async def _start_member(self, plan: PeerPlan, port: int) -> HostedEtcd:
        """Start this node's etcd as a member joining the cluster (`plan.cluster`); RendezvousError if it cannot."""
        rdzv = self._spec.rendezvous
        server = HostedEtcd(self._folder(), (plan.ip,), port, f"{url_host(plan.ip)}:{port}", self._log,
                            trust=job_trust(rdzv, self._spec.name), host=self._advertise, peer=plan)
        if not await server.start(rdzv.connect_timeout):
            msg = f"cannot join the rendezvous as a member: port {port} is taken on this machine"
            raise RendezvousError(msg)
        return server

    def _folder(self) -> Path:
        """Where etcd keeps its data and log: <run dir>/etcd (a fresh temporary folder when no run dir is known)."""
        if self._run_dir is not None:
            return self._run_dir / "etcd"
        sink = RUN_LOG.sink  # the agent's run dir holds agent.jsonl
        if sink is not None:
            return sink.path.parent / "etcd"
        return Path(tempfile.mkdtemp(prefix="runner-etcd-"))

    async def next_round(self, attempt: int) -> RendezvousResult:
        """As the etcd backend; then, in the background, the members (runner.rendezvous.etcd.members)."""
        result = await self._inner.next_round(attempt)
        members = self._members
        if members is not None and members.target > 1:
            members.round = result  # a reconcile still running goes on with it
            if self._reconciling is None or self._reconciling.done():
                self._reconciling = asyncio.get_running_loop().create_task(self._reconcile(members),
                                                                          name="etcd-members")
        return result

    async def _reconcile(self, members: Membership) -> None:
        """The members after the rounds, on a session of their own (runner.rendezvous.etcd.members)."""
        session = self._session()

        def teach(urls: list[str]) -> None:
            session.learn(urls)
            self._inner.learn(urls)
            self._memo.remember(urls)
        try:
            await members.reconcile(session, lambda: self._inner.lease.lease_id, teach)
        finally:
            await asyncio.shield(session.close())

    def _session(self) -> EtcdSession:
        """A new session that knows every endpoint this node's own has learnt (the members)."""
        session = new_session(self._spec, self._log)
        with contextlib.suppress(RendezvousError):  # before open(): the spec's endpoints only
            known = self._inner.session
            session.learn([f"{e.host}:{e.port}" for e in known.endpoints])
            current = known.current or known.last_answered
            if current is not None:
                session.prefer(current)
        return session

    async def _stop_reconciling(self) -> None:
        for task in (self._reconciling, self._founding):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._reconciling = self._founding = None

    async def charge_restart(
        self, max_restarts: int, failure_class: FailureClass | None = None, class_limit: int | None = None, *,
        charged: bool = True, defer: float = 0.0,
    ) -> RoundCharge:
        """As the etcd backend (at once a RendezvousError once the rendezvous is lost)."""
        return await self._unless_lost(self._inner.charge_restart(max_restarts, failure_class, class_limit,
                                                                  charged=charged, defer=defer))

    async def _unless_lost(self, work: Awaitable[T]) -> T:
        """`work`, unless the rendezvous is lost: then a RendezvousError at once, saying why.

        Lost: a call found no member answering within rendezvous.connect_timeout. The members are the job's own
        nodes: an etcd away this long has most likely lost its quorum for good (the lone member's host, or most
        members' hosts, are gone). Said once, naming the hosts; from then on the side calls (status, the restart
        budget, leaving) fail at once instead of one connect_timeout each, so a failure that follows ends the node
        promptly. The workers are left alone (their result stands), and when etcd answers this node again (its
        lease keep-alive, its watch: a hosting node's etcd restarted, or frozen a while) the rendezvous is back.
        """
        if self._lost is not None:
            if self._inner.session.answered_at <= self._lost_at:
                if isinstance(work, Coroutine):
                    work.close()
                raise RendezvousError(self._lost)
            self._lost = None
            self._log.info("rendezvous_back", detail="etcd answers again")
        try:
            return await work
        except RendezvousError as e:
            if isinstance(e, EtcdUnreachable) and self._admitted and self._inner.fenced is None:
                self._rendezvous_lost()
                raise RendezvousError(self._lost or e.message, fix=e.fix) from e
            raise

    def _rendezvous_lost(self) -> None:
        hosts = sorted({e.host for e in self._inner.session.endpoints})
        count = self._members.target if self._members is not None else 1
        limit = self._spec.rendezvous.connect_timeout
        self._lost, self._lost_at = (
            f"the rendezvous is lost: no etcd member answers within {limit:g} s (rendezvous.connect_timeout) on "
            f"{', '.join(hosts)}, so its quorum is gone "
            + ("(its only member's host is lost: with one member, the hosting node is a single point of failure; "
               "rendezvous.hosted_members 3 on 3 nodes or more survives it)" if count == 1 else
               f"(more than half of its {count} members' hosts are lost)")
            + "; the job cannot go on"), time.monotonic()
        self._log.error("rendezvous_lost", hosts=hosts, reason=self._lost)

    async def share_hang(self, local: list[RankRecord], *, timeout: float) -> list[RankRecord]:
        """As the etcd backend."""
        return await self._inner.share_hang(local, timeout=timeout)

    async def note_node(self, mark: Mark | None) -> None:
        """As the etcd backend."""
        await self._inner.note_node(mark)

    async def node_ledger(self) -> dict[str, NodeRecord]:
        """As the etcd backend."""
        return await self._inner.node_ledger()

    async def stopping(self) -> None:
        """Ask the other nodes to stop now when no other voting member keeps the rendezvous.

        Before this node's workers stop: asked after, a peer read a loaded host's going as a lost peer and restarted
        first (CI, stop 45). A rendezvous other members keep needs no word: this node leaves it.
        """
        members = self._members
        if members is None or self._server is None or not self._admitted or self._lost is not None:
            return
        if not await members.others_remain(self._inner.session):
            await self._stop_others()

    def recovering(self) -> bool:
        """While this node's founding member has no leader, and until it went on alone and let the lost node go."""
        return self._leaderless or self._going_alone

    async def progress_of_nodes(self) -> dict[str, float]:
        """As the etcd backend ({} once the rendezvous is lost)."""
        if self._lost is not None:
            return {}
        return await self._inner.progress_of_nodes()

    async def publish(self, state: dict[str, object]) -> None:
        """As the etcd backend (nothing once the rendezvous is lost)."""
        if self._lost is None:
            await self._unless_lost(self._inner.publish(state))

    async def close(self, outcome: str, *, alone: bool = False) -> None:
        """Leave; a member then leaves the cluster, or, the last one, waits for the others (bounded) and stops etcd."""
        await self._stop_reconciling()
        if outcome == "succeeded":  # the job is over: a later run starts afresh (a stopped node may be requeued)
            self._memo.forget()
        if self._lost is not None and self._inner.session.answered_at <= self._lost_at:
            self._inner.give_up(self._lost)  # still lost: nothing more goes to etcd (leaving included)
        server, members = self._server, self._members
        if server is None or members is None:
            await self._inner.close(outcome, alone=alone)
            return
        try:
            if outcome == "stopped" and self._admitted and not await members.others_remain(self._inner.session):
                await self._stop_others()
            await self._inner.close(outcome, alone=alone)
        finally:
            try:
                # a fenced node reaches no etcd: nothing to wait for. A stopped node lingers too (the stop it passed
                # on must reach the others), within the stop's own budget (runner.states.shutdown)
                if self._admitted and self._inner.fenced is None and not await self._leave_cluster(members):
                    await self._linger()
            finally:
                members.server = None
                await server.stop(STOPPED_GRACE_S if outcome == "stopped" else STOP_GRACE_S)

    async def _leave_cluster(self, members: Membership) -> bool:
        """Remove this node's member while others remain (True); False: it is the last, or etcd refused."""
        if self._server is None or self._server.peer is None:
            return False
        session = self._session()
        try:
            async with asyncio.timeout(self._spec.rendezvous.connect_timeout):
                await session.connect()
                return await members.leave(session)
        except (RendezvousError, TimeoutError) as exc:
            self._log.warning("rendezvous_member_leave_failed", error=str(exc) or type(exc).__name__)
            return False
        finally:
            await session.close()

    async def _stop_others(self) -> None:
        """Ask every node to stop (the control key, as `runner stop`): the rendezvous leaves with this node."""
        keys = JobKeys(self._spec.rendezvous.prefix, self._spec.name)
        value = {"state": "stopping", "graceful": False, "by": self._node, "why": "the hosting node was stopped"}
        session = self._inner.session
        try:
            async with asyncio.timeout(self._spec.rendezvous.connect_timeout):
                raw = await session.call(lambda c: c.get(keys.control))
                current = load(raw.value) if raw is not None else None
                if isinstance(current, dict) and current.get("state") == "stopping":
                    return  # `runner stop` already asks every node: nothing to add, nothing to say
                await write_control(session, keys, value)
        except (RendezvousError, TimeoutError) as exc:
            self._log.warning("hosted_stop_request_failed", error=str(exc) or type(exc).__name__)
        else:
            self._log.info("hosted_node_stopped_job", detail="the other nodes are asked to stop",
                           message="this node hosts the rendezvous, which stops with it: every other node of the job "
                                   "is asked to stop too")

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
        session = self._session()
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


MAX_HOSTED_NODES = 16
HOST_NAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252})")


def with_member_hosts(spec: JobSpec, hint: str) -> tuple[JobSpec, RendezvousError | None]:
    """`spec` with the hosts of HOSTED_NODES_ENV (a template's: the members' hosts) added to its endpoints.

    On the first endpoint's port. A malformed value: the spec as it is, and the error that names it (open() raises it).
    """
    names = [name.strip() for name in hint.split(",") if name.strip()]
    if not names:
        return spec, None
    bad = [n for n in names if not HOST_NAME.fullmatch(n)]
    if bad or len(names) > MAX_HOSTED_NODES:
        what = f"{bad[0][:60]!r} is no host name" if bad else f"{len(names)} hosts, at most {MAX_HOSTED_NODES}"
        msg = f"${HOSTED_NODES_ENV} (the hosts of the hosted etcd's members, set by the cluster template): {what}"
        return spec, RendezvousError(msg, fix="unset it, or give host names separated by commas: node0,node1,node2")
    rdzv = spec.rendezvous
    port = Endpoint.parse(rdzv.endpoints[0]).port
    known = {(e.host, e.port) for e in map(Endpoint.parse, rdzv.endpoints)}
    extra = tuple(dict.fromkeys(f"{n}:{port}" for n in names if (n, port) not in known))
    return dataclasses.replace(spec, rendezvous=dataclasses.replace(rdzv, endpoints=(*rdzv.endpoints, *extra))), None


async def round_members(session: EtcdSession, keys: JobKeys) -> set[str]:
    """Every node the job's last round included (its result; join records vanish with leases).

    Only the last: a node an earlier round included and a later one left out was lost and replaced; it owes the
    job nothing, and the last member must not wait for it (a lost host's node never comes back to say so).
    """
    _, (kvs,) = await session.call(lambda c: c.snapshot([prefix_range(keys.rounds)]))
    last, members = -1, set[str]()
    for kv in kvs:
        if not bytes(kv.key).endswith(b"/result"):
            continue
        record, part = load(kv.value), bytes(kv.key).rsplit(b"/", 2)[-2]  # .../rounds/<n>/result
        nodes = record.get("nodes") if isinstance(record, dict) else None
        number = int(part) if part.isdigit() else -1
        if not isinstance(nodes, list) or number < last:
            continue
        if number > last:
            last, members = number, set()
        members.update(str(n) for n in nodes)
    return members
