"""The hosted rendezvous's members (rendezvous.hosted_members): grown over the first nodes, pruned, left.

The etcd the first node hosts grows over the job's first nodes, drops the members whose host is lost, and shrinks
as nodes leave (docs/multinode.md#members).

- How many (`target`): hosted_members, never more than nodes.max, never an even count (two members survive the
  loss of neither: both are needed for a quorum), and 1 without the job's secret (members meet over TLS with its
  certificates) or on a loopback endpoint (one machine).
- Growing (`Membership.reconcile`, after every round this node is in): a node that is no member, on a machine that
  has none (its address is no member's), among the round's first 2 x target nodes, claims the member key (on its
  lease: one node at a time, and a dead claimant's claim lapses), adds itself as a learner (it votes only once it
  caught up: the quorum never waits on a member still copying), starts its etcd joining the cluster, promotes
  itself once etcd lets it, and lets the claim go. An odd count grows only when two machines with no member can
  join (1 -> 3, never to 2 and stuck there): machines, not nodes, counted by the address each of the first nodes
  would serve a member at (`member_at` in its live state record), so agents sharing a machine count once.
- Losing: the round's first node removes every member whose node is live no more (no state key: lost, or gone)
  and whose etcd no longer accepts a connection (a lease lapsed under load, its node alive, costs no member), and
  every learner nobody is starting (no claim). A node that finds a member of its own name it does not run (its
  previous life on another machine) removes it.
- Learning: every node reads the member list after each round (and while the cluster grows) and adds the members'
  client URLs to its session's endpoints, so a lost member is one failover away.
- Leaving (`leave`): at its end a member removes itself while other started members remain; etcd refuses when that
  would leave too few to form a quorum (strict reconfiguration check), and that member is then the last one, which
  waits for the others to leave (runner.rendezvous.etcd.hosted).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import urlsplit

from runner.errors import RendezvousError
from runner.rendezvous.etcd.client import (
    Connection,
    Endpoint,
    EtcdSession,
    MemberInfo,
    MembersBusy,
    absent,
    delete_op,
    key_range,
    prefix_range,
    put_op,
    value_is,
)
from runner.rendezvous.etcd.hosted_server import PEER_PORT_OFFSET, HostedEtcd, PeerPlan
from runner.rendezvous.etcd.keys import JobKeys, load
from runner.system import tcp

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

    from runner.config.spec import JobSpec
    from runner.rendezvous.base import RendezvousResult

T = TypeVar("T")
MEMBER_AT = "member_at"  # a live state record's field: the address this node's member would serve at
GROW_WINDOW_S = 60.0  # after a round, how long a node keeps reading the member list while the cluster grows
POLL_S = 1.0  # between two reads, for a node that may join
SERVING_DIAL_S = 1.0  # how long a member of a node whose lease lapsed has to accept a connection (else: lost)
FAR_POLL_S = 5.0  # for the others (they only learn the endpoints)
PROMOTE_POLL_S = 0.2
BUSY_POLL_S = 0.5  # etcd lets a membership change wait 5 s after the last one (its health interval)
NOT_YET = ("in sync with leader", "not ready")  # etcd's refusals to promote a learner still catching up
GONE = "member not found"  # removed by another node meanwhile


def target(spec: JobSpec, *, secured: bool) -> int:
    """How many members the hosted etcd grows to (the module's docstring)."""
    if not secured:
        return 1
    count = min(spec.rendezvous.hosted_members, spec.nodes.max)
    return max(1, count if count % 2 else count - 1)


def peer_host(member: MemberInfo) -> str | None:
    """The address of a member's (first) peer URL."""
    for url in member.peer_urls:
        with contextlib.suppress(ValueError):
            return urlsplit(url).hostname
    return None


def may_grow(ip: str, members: list[MemberInfo], candidates: Collection[str]) -> bool:
    """Whether the node whose member would serve at `ip`, no member and among the round's first nodes, joins now.

    `candidates`: the addresses the round's first nodes would serve a member at. One joins at a time (no learner),
    one member per machine, and an odd count grows only when two machines with no member can join.
    """
    hosting = {peer_host(m) for m in members}
    if any(m.learner for m in members) or ip in hosting:
        return False
    free = {ip, *candidates} - hosting
    return len(members) % 2 == 0 or len(free) >= 2


def voters(members: list[MemberInfo]) -> int:
    """How many members vote and serve clients (started, promoted)."""
    return sum(1 for m in members if not m.learner and m.client_urls)


def client_urls(members: list[MemberInfo]) -> list[str]:
    """The voting members' client URLs (a learner serves no client until promoted)."""
    return [url for m in members if not m.learner for url in m.client_urls]


async def live_nodes(session: EtcdSession, keys: JobKeys) -> set[str]:
    """The nodes whose live state key is there (it is on their lease: gone when the node is)."""
    _, (kvs,) = await session.call(lambda c: c.snapshot([prefix_range(keys.states)]))
    return {JobKeys.leaf(kv.key) for kv in kvs}


async def serving(members: list[MemberInfo]) -> set[int]:
    """The ids of `members` whose etcd accepts a connection on a client URL now (within SERVING_DIAL_S, all at once).

    A member's etcd runs only while its node's agent does (it stops the member as it leaves): one that answers has
    a live node, whatever its lease says.
    """
    async def answers(member: MemberInfo) -> bool:
        for url in member.client_urls:
            try:
                endpoint = Endpoint.parse(url)  # the sessions' own reading of a member's URL
            except RendezvousError:
                continue
            if await tcp.dial(endpoint.host, endpoint.port, SERVING_DIAL_S) is None:
                return True
        return False

    found = await asyncio.gather(*(answers(m) for m in members))
    return {m.id for m, ok in zip(members, found, strict=True) if ok}


def lost_members(lapsed: list[MemberInfo], up: set[int]) -> dict[int, str]:
    """Which members of nodes whose lease lapsed to remove, and why: those whose etcd no longer answers (`up`).

    A lease lapses under load too (a keep-alive starved past the TTL) while the node, and its member, live on: such
    a member stays (removing it would cost the job a voter, and its node's agent puts its state back at once).
    """
    return {m.id: f"node {m.name} is lost or gone (its lease lapsed, its etcd does not answer)"
            for m in lapsed if m.id not in up}


def removal(member_id: int) -> Callable[[Connection], Awaitable[None]]:
    """The call that removes member `member_id` (for EtcdSession.call)."""
    return lambda c: c.member_remove(member_id)


@dataclass(frozen=True)
class Place:
    """Where this node's member would serve: its address (the others reach it there) and the client port."""

    ip: str
    port: int

    def plan(self, node: str, cluster: str = "") -> PeerPlan:
        """The member's peer plan: peer port = client port + PEER_PORT_OFFSET."""
        return PeerPlan(node, self.ip, self.port + PEER_PORT_OFFSET, cluster)


Starter = Callable[[PeerPlan], Awaitable[HostedEtcd]]


class Membership:
    """This node's part in the hosted etcd's membership: grow, prune, learn, leave (the module's docstring)."""

    def __init__(self, node: str, keys: JobKeys, *, target: int, place: Place | None, start: Starter,
                 promote_timeout: float, log: FilteringBoundLogger) -> None:
        self.node, self.keys, self.target, self.place = node, keys, target, place
        self._start, self._promote_timeout, self._log = start, promote_timeout, log
        self.server: HostedEtcd | None = None  # the member this node runs (the hosting node's from the start)
        self.round: RendezvousResult | None = None  # the last round this node is in (set by its rendezvous)
        self._kept_said = False  # whether it said the members stay fewer than the target for want of machines

    def _mine(self, member: MemberInfo) -> bool:
        """Whether `member` is the one this node runs now."""
        return (self.server is not None and self.server.peer is not None and member.name == self.node
                and self.server.peer.url in member.peer_urls)

    async def reconcile(self, session: EtcdSession, lease_id: Callable[[], int],
                        teach: Callable[[list[str]], None]) -> None:
        """While rounds go on: drop dead members, grow while below target, tell `teach` the endpoints.

        Until GROW_WINDOW_S after the last round (`self.round`, which the caller updates: a new round does not cancel
        a member half-way through joining). Never raises.

        `session`: one of its own (etcd refuses membership changes for a while after each one, "unhealthy
        cluster", and the session's retries must not disturb the node's watches).
        """
        loop = asyncio.get_running_loop()
        seen: RendezvousResult | None = None
        deadline = 0.0
        try:
            while (result := self.round) is not None:
                if result is not seen:
                    seen, deadline = result, loop.time() + GROW_WINDOW_S
                members = await self._prune(session, await session.call(lambda c: c.members()), result)
                if self.server is not None:  # a founder whose data is wiped starts afresh only while it is alone
                    self.server.others = max(self.server.others, sum(1 for m in members if m.name != self.node))
                teach(client_urls(members))
                # a member whose node the round left out is about to be removed (by the round's first node)
                settled = all(not m.name or m.name in result.nodes for m in members)
                # only voters count: a learner (or a member added but not started) serves no client yet, and a node
                # that stopped looking before it was promoted would never learn its endpoint
                if (settled and voters(members) >= self.target) or loop.time() > deadline:
                    return
                if not settled:
                    await asyncio.sleep(POLL_S)
                    continue
                if await self._may_grow(session, members, result) and await self._grow(session, lease_id()):
                    continue
                await asyncio.sleep(POLL_S if result.group_rank < 2 * self.target else FAR_POLL_S)
        except RendezvousError as e:
            self._log.warning("rendezvous_members_unchanged", error=e.message)

    async def _prune(self, session: EtcdSession, members: list[MemberInfo],
                     result: RendezvousResult) -> list[MemberInfo]:
        """Remove the members of lost nodes (the round's first node does), and this node's previous life."""
        stale = {m.id: "this node's member from before (it runs none there now)" for m in members
                 if m.name == self.node and not self._mine(m)}
        if result.group_rank == 0 and len(members) > 1:
            live = await live_nodes(session, self.keys)
            claim = await session.call(lambda c: c.get(self.keys.member_claim))
            lapsed = [m for m in members if m.name and m.name != self.node and m.name not in live]
            stale |= lost_members(lapsed, await serving(lapsed))
            stale |= {m.id: "a learner nobody is starting (its node died while it joined)"
                      for m in members if not m.name and claim is None}
        for member_id, why in stale.items():
            name = next((m.name for m in members if m.id == member_id), "") or hex(member_id)
            if (refused := await self._remove(session, member_id, patient=False)) is not None:
                self._log.warning("rendezvous_member_not_removed", member=name, error=refused)
                continue
            self._log.warning("rendezvous_member_removed", member=name, reason=why)
            members = [m for m in members if m.id != member_id]
        return members

    async def _remove(self, session: EtcdSession, member_id: int, *, patient: bool) -> str | None:
        """Remove a member (`patient`: while etcd says it is busy); None once it is gone, else etcd's refusal."""
        op = removal(member_id)
        try:
            await (self._patiently(session, op) if patient else session.call(op))
        except RendezvousError as e:
            return None if GONE in e.message else e.message
        return None

    async def others_remain(self, session: EtcdSession) -> bool:
        """Whether other voting members would keep the rendezvous without this node's (never raises)."""
        if self.server is None or self.server.peer is None:
            return False
        try:
            found = await session.call(lambda c: c.members())
        except RendezvousError:
            return False
        return any(m.name != self.node and not m.learner for m in found)

    async def _may_grow(self, session: EtcdSession, members: list[MemberInfo], result: RendezvousResult) -> bool:
        """Whether this node should try to join as a member now (`may_grow`)."""
        if self.place is None or self.server is not None or result.group_rank >= 2 * self.target:
            return False
        try:
            candidates = await self._candidates(session, result)
        except RendezvousError as e:  # unread (etcd busy, a member host just lost): no growth this time, not the end
            self._log.info("rendezvous_members_unread", error=e.message)  # of the reconcile (the next poll reads)
            return False
        if may_grow(self.place.ip, members, candidates):
            return True
        machines = len({self.place.ip, *candidates} | {peer_host(m) for m in members})
        if not self._kept_said and len(members) % 2 and not any(m.learner for m in members) and machines < self.target:
            self._kept_said = True  # once: the machines only change with the rounds
            self._log.info("rendezvous_members_kept", members=len(members), machines=machines,
                           detail=f"the job's first nodes run on {machines} machine(s): the members stay "
                                  f"{len(members)}, one per machine and an odd count, until more machines join")
        return False

    async def _candidates(self, session: EtcdSession, result: RendezvousResult) -> set[str]:
        """Where the round's first 2 x target nodes would serve a member (their live state records' `member_at`)."""
        first = result.nodes[:2 * self.target]
        _, found = await session.call(lambda c: c.snapshot([key_range(self.keys.state(n)) for n in first]))
        records = (load(kv.value) for kvs in found for kv in kvs)
        return {at for r in records if isinstance(r, dict) and isinstance(at := r.get(MEMBER_AT), str)}

    async def _grow(self, session: EtcdSession, lease_id: int) -> bool:
        """Claim, add this node as a learner, start its etcd, promote it; True once it votes."""
        assert self.place is not None
        claim, me = self.keys.member_claim, self.node.encode()
        took = await session.call(lambda c: c.txn([absent(claim)], [put_op(claim, me, lease_id)]))
        if not took.succeeded:
            return False
        plan, added = self.place.plan(self.node), None
        try:
            added, after = await self._add(session, plan.url)
            cluster = ",".join(f"{m.name or self.node}={m.peer_urls[0]}" for m in after
                               if m.peer_urls and (m.name or m.id == added.id))
            self.server = await self._start(self.place.plan(self.node, cluster))
            await self._promote(session, added.id)
        except (RendezvousError, OSError, TimeoutError) as e:
            self._log.warning("rendezvous_member_not_added", error=getattr(e, "message", None) or str(e))
            await self._undo(session, added)
            return False
        except BaseException:
            await asyncio.shield(self._undo(session, added))
            raise
        finally:
            with contextlib.suppress(RendezvousError):
                await session.call(lambda c: c.txn([value_is(claim, me)], [delete_op(claim)]))
        self._log.info("rendezvous_member_joined", member=self.node, members=len(after), peer=plan.url)
        return True

    async def _patiently(self, session: EtcdSession, op: Callable[[Connection], Awaitable[T]]) -> T:
        """`op` through the session, asked again while etcd says a membership change must wait (MembersBusy)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._promote_timeout
        while True:
            try:
                return await session.call(op)
            except MembersBusy:
                if loop.time() > deadline:
                    raise
            await asyncio.sleep(BUSY_POLL_S)

    async def _add(self, session: EtcdSession, url: str) -> tuple[MemberInfo, list[MemberInfo]]:
        """MemberAdd as a learner; a retry after a lost reply finds the member it added."""
        try:
            return await self._patiently(session, lambda c: c.member_add(url, learner=True))
        except MembersBusy:
            raise
        except RendezvousError as e:
            if "already exists" not in e.message:
                raise
        members = await session.call(lambda c: c.members())
        added = next((m for m in members if url in m.peer_urls), None)
        if added is None:
            raise RendezvousError(f"etcd says the peer URL {url} exists, but no member has it")
        return added, members

    async def _promote(self, session: EtcdSession, member_id: int) -> None:
        """Promote the learner once it caught up (etcd refuses before); at most the promote timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._promote_timeout
        while True:
            try:
                await self._patiently(session, lambda c: c.member_promote(member_id))
            except MembersBusy:
                raise
            except RendezvousError as e:
                if not any(sign in e.message for sign in NOT_YET) or loop.time() > deadline:
                    raise
            else:
                return
            await asyncio.sleep(PROMOTE_POLL_S)

    async def _undo(self, session: EtcdSession, added: MemberInfo | None) -> None:
        """A join that failed half-way: remove the learner, stop its etcd (best effort, never raises)."""
        server, self.server = self.server, None
        if server is not None:
            server.leaving()
        if added is not None:
            with contextlib.suppress(RendezvousError):
                await session.call(removal(added.id))
        if server is not None:
            await server.stop()

    async def leave(self, session: EtcdSession) -> bool:
        """Remove this node's member while other voting members remain; True when removed (its etcd then stops).

        False: no member here, the others are gone, or etcd refused (too few started members would be left).
        """
        if self.server is None or self.server.peer is None:
            return False
        members = await session.call(lambda c: c.members())
        mine = next((m for m in members if self._mine(m)), None)
        if mine is None:
            return False
        # A member whose node is neither live nor finished was lost: removed first, else this node's leaving could
        # leave the rest without a quorum (etcd 3.5.1 let it: a host cut off, then a member left, seen here).
        _, (states, finals) = await session.call(lambda c: c.snapshot([prefix_range(self.keys.states),
                                                                      prefix_range(self.keys.finals)]))
        known = {JobKeys.leaf(kv.key) for kv in (*states, *finals)} | {self.node}
        unknown = [m for m in members if m.name and m.name not in known]
        up = await serving(unknown)
        for m in [m for m in unknown if m.id not in up]:
            if (refused := await self._remove(session, m.id, patient=True)) is not None:
                self._log.info("rendezvous_member_stays", reason=f"member {m.name} is lost: {refused}")
                return False
            self._log.warning("rendezvous_member_removed", member=m.name, reason=f"node {m.name} is lost")
            members.remove(m)
        if not any(m.id != mine.id and not m.learner and m.name for m in members):
            return False
        self.server.leaving()  # etcd exits once it applied its removal: that is no crash to restart from
        try:
            await session.call(removal(mine.id))
        except RendezvousError as e:
            self._log.info("rendezvous_member_stays", reason=e.message)
            return False
        self._log.info("rendezvous_member_left", member=self.node, members=len(members) - 1)
        return True
