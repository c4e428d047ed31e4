"""Waiting for one rendezvous round to close.

The node that holds the round's leader key (`rounds/{r}/result/leader`, put if absent on the leader's lease by
a node that finds none after joining) leads it: it watches every join record (and, in a round after a
first one, the nodes' live states) and writes `rounds/{r}/result` once (txn on create revision 0)
when max nodes joined, or when min joined, every still-alive node of the previous round re-joined and
last_call passed. A round that only re-forms the previous one (every node that joined was in it: a restart,
or survivors of a lost node) closes without last_call: last_call is there for newcomers, and a newcomer
that comes later still joins, through membership_changed.
Other nodes only watch the job's news (`JobKeys.news`: the control key and the rounds' annex keys under it, the
leader key and a copy of the result among them, so a leader that leaves is seen and replaced): one watcher, O(1)
events per follower and round, O(N) in all. No read is O(N) but the leader's one snapshot of the joins.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from runner.errors import RendezvousError
from runner.json_types import JSON, JSONObject
from runner.observe.progress import Progress
from runner.rendezvous.etcd.client import (
    EtcdSession,
    LeaseNotFound,
    TxnResult,
    absent,
    key_range,
    prefix_end,
    prefix_range,
    put_op,
    range_op,
)
from runner.rendezvous.etcd.keys import JobKeys, decode_closed, dump, encode_closed, load
from runner.rendezvous.etcd.lease import LeaseKeeper
from runner.rendezvous.etcd.messages import KeyValue, RangeRequest
from runner.rendezvous.etcd.round_result import RoundResult, parse_result, result_of
from runner.rendezvous.etcd.watch import DELETE, PUT, Event, Watch
from runner.rendezvous.ranks import assign_ranks

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

TERMINAL = "SHUTDOWN"
MAX_SHOWN = 16  # node ids named in one `waiting` event, at most


@dataclass(frozen=True)
class RoundRules:
    """What closes a round."""

    min_nodes: int
    max_nodes: int
    last_call: float
    join_timeout: float | None = None  # only shown while waiting (the backend enforces it)
    started: float = field(default_factory=time.monotonic)  # when joining began (the join timeout's start)


def is_gone(state: JSONObject | None) -> bool:
    """True when a node's live state is absent or says it has ended."""
    return state is None or state.get("state") == TERMINAL or bool(state.get("outcome"))


def stays_out(state: JSONObject | None) -> bool:
    """True when a node is gone, or says it stays out of rounds until its health checks pass (docs/health.md)."""
    return is_gone(state) or bool(state and state.get("unhealthy"))


def pending(previous: Sequence[str], joined: Mapping[str, object], states: Mapping[str, JSONObject]) -> list[str]:
    """Nodes of the previous round that are still alive, not out for their health, and have not joined yet."""
    return [n for n in previous if n not in joined and not stays_out(states.get(n))]


def reforms_previous(previous: Sequence[str], joined: Mapping[str, object]) -> bool:
    """Whether the round only re-forms the previous one: there was one, and no node joined that was not in it."""
    return bool(previous) and all(n in previous for n in joined)


def build_result(joined: Mapping[str, object], previous: Sequence[str], max_nodes: int, rev: int = 0) -> RoundResult:
    """The result: nodes in group-rank order, master = group rank 0's address and port.

    `joined` maps node -> join record, decoded or raw JSON bytes (only group rank 0's is decoded). A record of
    group rank 0 without an address, port and process count is refused (RendezvousError naming the node).
    """
    nodes = assign_ranks(joined, previous)[:max_nodes]
    master = joined[nodes[0]]
    if isinstance(master, bytes):
        master = load(master)
    fields = master if isinstance(master, dict) else {}
    addr, port, nproc = fields.get("addr"), fields.get("port"), fields.get("nproc")
    if not isinstance(addr, str) or type(port) is not int or type(nproc) is not int:
        msg = f"the join record of node '{nodes[0]}' (group rank 0) is not one runner writes: {str(master)[:120]!r}"
        raise RendezvousError(msg, fix="something other than runner wrote under this job's etcd prefix: give the "
                                       "job a new name, or forget its state (runner reset --force job.yaml)")
    return RoundResult(nodes, addr, port, nproc, time.time(), rev)


class Roster:
    """The leader's table of a round: who joined, and which nodes of the previous round it still waits for.

    Kept up to date event by event in O(1) (a restart round of N nodes must not cost O(N) per join).
    """

    def __init__(self, previous: Sequence[str]) -> None:
        self.previous = tuple(previous)
        self._before = frozenset(self.previous)
        self.joined: dict[str, object] = {}  # node -> join record (raw JSON bytes)
        self.live: dict[str, JSONObject] = {}  # node of the previous round -> its live state (decoded)
        self.waiting_for: set[str] = set()  # previous nodes alive (a live state says so) and not joined yet
        self.newcomers = 0  # joined nodes that were not in the previous round

    @property
    def watches_states(self) -> bool:
        """Whether live states matter (only those of the previous round's nodes do)."""
        return bool(self.previous)

    def join(self, node: str, record: object) -> None:
        """`node` joined (record) or left (None) the round."""
        if record is None:
            if self.joined.pop(node, None) is not None and node not in self._before:
                self.newcomers -= 1
        else:
            if node not in self.joined and node not in self._before:
                self.newcomers += 1
            self.joined[node] = record
        self._recheck(node)

    def state(self, node: str, raw: bytes | None) -> None:
        """`node`'s live state changed (raw JSON) or vanished (None); ignored for nodes not in the previous round."""
        if node not in self._before:
            return
        state = load(raw) if raw else None
        if isinstance(state, dict):  # anything else, as no state: the node is gone
            self.live[node] = state
        else:
            self.live.pop(node, None)
        self._recheck(node)

    def _recheck(self, node: str) -> None:
        if node in self._before and node not in self.joined and not stays_out(self.live.get(node)):
            self.waiting_for.add(node)
        else:
            self.waiting_for.discard(node)

    def reforms_previous(self) -> bool:
        """Whether the round only re-forms the previous one (the module function's answer, in O(1))."""
        return bool(self.previous) and self.newcomers == 0

    def waiting_list(self) -> list[str]:
        """The nodes waited for, in the previous round's order."""
        return [n for n in self.previous if n in self.waiting_for]


class RoundWaiter:
    """Waits for round `r` to close (leading it when this node holds the round's leader key).

    `lease` is this node's lease (the leader key is put on it); `record` its join record, put again through the
    lease keeper when etcd no longer knows the lease (which re-grants it, or reports that etcd lost the job).
    """

    def __init__(self, session: EtcdSession, keys: JobKeys, node: str, round_: int, rules: RoundRules, *,
                 lease: LeaseKeeper, record: bytes, log: FilteringBoundLogger | None = None) -> None:
        self._s, self._k, self._node, self._r = session, keys, node, round_
        self._rules, self._lease, self._record = rules, lease, record
        self._log = log or structlog.get_logger("runner.rendezvous.etcd.backend")
        self.joined_seen = 1
        self._view = 0  # leader: revision up to which its table of joins is complete
        self._roster = Roster(())
        # what a waiting node shows (runner/observe/progress.py), besides the round: its role, the leader it follows,
        # and (leading) when the last call ends
        self._role: str | None = None
        self._following: str | None = None
        self._last_call_ends: float | None = None
        self._nodes_prefix, self._result = keys.round_nodes(round_), keys.result(round_)
        self._leader, self._closed = keys.leader(round_), keys.closed(round_)
        self._watch: Watch | None = None  # a follower's stream, once the result came on it

    def reads(self) -> list[RangeRequest]:
        """What wait() needs to know first: the round's leader key, its result, the control key."""
        return [key_range(self._leader), key_range(self._result), key_range(self._k.control)]

    async def wait(self, first: tuple[int, list[list[KeyValue]]] | None = None, *,
                   first_joiner: bool = False) -> RoundResult:
        """The round's result (which may not include this node).

        `first`: (revision, kvs per range of reads()) already read, e.g. in the join transaction.
        `first_joiner`: this node's join was the round's first (the round's ticket read back at version 1): it
        claims the leader key at once. A node that finds no leader otherwise waits for one to appear, and claims
        only once a leader left, or after one lease TTL without any (the first joiner died before claiming): so
        a round sees one claim, not one per node that joined before the first claim landed.
        Its `rev` is the revision at which its leader saw the joins (watch members from there).
        """
        claim = first_joiner
        while True:
            if first is None:
                first = await self._s.call(lambda c: c.snapshot(self.reads()))
            rev, (leader_kv, result, control) = first
            first = None
            if result:
                return result_of(load(result[0].value), self._r)
            self._k.check_open(control[0].value if control else None)
            leader = load(leader_kv[0].value) if leader_kv else None
            if leader is None and claim:
                rev, leader = await self._claim()
                if leader is None:
                    continue  # the leader key vanished between two reads: look again
            if leader == self._node:
                return await self._lead()
            self._role, self._following = "follower", leader if isinstance(leader, str) else None
            with Progress(self._log, "rendezvous", self.waiting):
                done = await self._follow(rev, leader)
            if done is not None:
                return done
            claim = True  # the leader left, or none came

    def take_watch(self) -> Watch | None:
        """The stream a follower saw the result on (the job's news), now the caller's."""
        watch, self._watch = self._watch, None
        return watch

    async def _claim(self) -> tuple[int, JSON]:
        """Become the round's leader unless someone is: (revision, leader's node id, None if none any more)."""
        key = self._leader

        async def claim() -> TxnResult:
            put = put_op(key, dump(self._node), self._lease.lease_id)
            return await self._s.call(lambda c: c.txn([absent(key)], [put], [range_op(key_range(key))]))
        try:
            done = await claim()
        except LeaseNotFound:  # the keeper re-grants (join keys put again) or reports etcd's data loss
            await self._lease.put(self._k.join(self._r, self._node), self._record)
            done = await claim()
        if done.succeeded:
            return done.revision, self._node
        return done.revision, load(done.kvs[0][0].value) if done.kvs[0] else None

    async def _follow(self, rev: int, leader: object) -> RoundResult | None:
        """Result, or None when the leader left (its key on its lease vanished) or none came within the lease TTL.

        `leader`: the leader's node id, None while unknown. The stream is kept (take_watch) when the result comes.
        """
        self._log.debug("rendezvous_following", round=self._r, leader=leader)
        watch: Watch | None = await Watch(self._s, [self._k.news()], rev + 1, self._log).start()
        try:
            while watch is not None:
                try:
                    ev = await asyncio.wait_for(watch.next(), None if leader is not None else self._lease.ttl)
                except TimeoutError:
                    return None
                if ev.key == self._k.control and ev.kind == PUT:
                    self._k.check_open(ev.value)
                elif ev.key == self._closed and ev.kind == PUT and (closed := decode_closed(ev.value)) is not None:
                    self._watch, watch = watch, None
                    return closed
                elif ev.key == self._leader:
                    if ev.kind == DELETE:
                        return None
                    leader = load(ev.value)
                    self._following = leader if isinstance(leader, str) else None
            return None
        finally:
            if watch is not None:
                await watch.cancel()

    async def _lead(self) -> RoundResult:
        r, k = self._r, self._k
        rev, (joins, states, result, control, before) = await self._s.call(lambda c: c.snapshot(
            [prefix_range(self._nodes_prefix), prefix_range(k.states), key_range(self._result),
             key_range(k.control), key_range(k.result(r - 1))]))
        if result:
            return result_of(load(result[0].value), r)
        k.check_open(control[0].value if control else None)
        previous = parse_result(load(before[0].value)) if before and r > 0 else None
        roster = self._roster = Roster(previous.nodes if previous is not None else ())
        ranges = [(self._nodes_prefix, prefix_end(self._nodes_prefix)), (self._result, None), (k.control, None)]
        if roster.watches_states:  # liveness of the previous round's nodes (other states are not decoded)
            ranges.append((k.states, prefix_end(k.states)))
            for kv in states:
                roster.state(JobKeys.leaf(kv.key), kv.value)
        for kv in joins:
            roster.join(JobKeys.leaf(kv.key), kv.value)  # raw: only the master's record is decoded
        self._view = rev
        self._log.info("rendezvous_leading", round=r, joined=len(roster.joined))
        watch = await Watch(self._s, ranges, rev + 1, self._log).start()
        self._role = "leader"
        try:
            with Progress(self._log, "rendezvous", self.waiting):
                return await self._lead_loop(watch, roster)
        finally:
            await watch.cancel()

    async def _lead_loop(self, watch: Watch, roster: Roster) -> RoundResult:
        min_at: float | None = None
        rules = self._rules
        while True:
            self.joined_seen = len(roster.joined)
            ready = len(roster.joined) >= rules.min_nodes and not roster.waiting_for
            if not ready:
                min_at = None
            elif min_at is None:
                min_at = time.monotonic()
            self._last_call_ends = None if min_at is None else min_at + rules.last_call
            if len(roster.joined) >= rules.max_nodes or (min_at is not None and (
                    roster.reforms_previous() or time.monotonic() - min_at >= rules.last_call)):
                return await self._write_result(roster)
            wait = None if min_at is None else rules.last_call - (time.monotonic() - min_at)
            try:
                ev = await asyncio.wait_for(watch.next(), wait)
            except TimeoutError:
                continue
            self._view = max(self._view, ev.mod_revision)
            done = self._apply(ev, roster)
            if done is not None:
                return done

    def waiting(self) -> dict[str, object]:
        """This round's wait as `waiting` fields: joined nodes (the leader knows them), min..max, time left."""
        now, rules = time.monotonic(), self._rules
        fields: dict[str, object] = {"round": self._r, "min": rules.min_nodes, "max": rules.max_nodes}
        if self._role == "follower":
            fields.update(role=self._role, leader=self._following)
        elif self._role == "leader":
            joined = self._roster.joined
            fields.update(role=self._role, joined=sorted(joined)[:MAX_SHOWN], joined_count=len(joined),
                          waiting_for=self._roster.waiting_list()[:MAX_SHOWN])
        if self._last_call_ends is not None:
            fields["last_call_s"] = round(max(0.0, self._last_call_ends - now), 1)
        if rules.join_timeout is not None:
            fields["left_s"] = round(max(0.0, rules.started + rules.join_timeout - now), 1)
        return fields

    def _apply(self, ev: Event, roster: Roster) -> RoundResult | None:
        key, put = ev.key, ev.kind == PUT
        if key == self._k.control and put:
            self._k.check_open(ev.value)
        elif key == self._result and put:
            return result_of(load(ev.value), self._r)
        elif key.startswith(self._nodes_prefix):
            roster.join(JobKeys.leaf(key), ev.value if put else None)
        elif key.startswith(self._k.states):
            roster.state(JobKeys.leaf(key), ev.value if put else None)
        return None

    async def _write_result(self, roster: Roster) -> RoundResult:
        result = build_result(roster.joined, roster.previous, self._rules.max_nodes, self._view)
        key = self._result
        puts = [put_op(key, dump(result.record())), put_op(self._closed, encode_closed(result))]
        done = await self._s.call(lambda c: c.txn([absent(key)], puts, [range_op(key_range(key))]))
        if not done.succeeded:
            result = result_of(load(done.kvs[0][0].value), self._r)
        self._log.info("rendezvous_round_closed", round=self._r, nodes=len(result.nodes), written=done.succeeded)
        return result
