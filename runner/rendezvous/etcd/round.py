"""Waiting for one rendezvous round to close, and its result (RoundResult: parsed once, where it is read).

The node that holds the round's leader key (`rounds/{r}/result/leader`, put if absent on the leader's lease by
a node that finds none after joining) leads it: it watches every join record (and, in a round after a
first one, the nodes' live states) and writes `rounds/{r}/result` once (txn on create revision 0, and only
while it still holds the leader key: a leader whose lease lapsed, or whose etcd lost its data, writes nothing)
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
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from runner.errors import RendezvousError
from runner.json_types import JSON, JSONObject
from runner.observe.progress import Progress
from runner.rendezvous.etcd.client import (
    EtcdSession,
    KeyValue,
    LeaseNotFound,
    RangeRequest,
    TxnResult,
    absent,
    key_range,
    prefix_end,
    prefix_range,
    put_op,
    range_op,
    value_is,
)
from runner.rendezvous.etcd.keys import JobKeys, decode_node, dump, encode_node, load
from runner.rendezvous.etcd.lease import LeaseKeeper
from runner.rendezvous.etcd.watch import DELETE, PUT, Event, Watch
from runner.rendezvous.ranks import assign_ranks

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

TERMINAL = "SHUTDOWN"
MAX_SHOWN = 16  # node ids named in one `waiting` event, at most
CLOSED_ZLIB = "nodes_zlib"  # in a news copy's head: its node list is zlib-compressed
MAX_CLOSED_BYTES = 64 << 20  # a news copy's node list, decompressed, at most (far above any real round)


# A round's result record as etcd holds it (`rounds/{r}/result` and its news copy), parsed once where it is read.
#
# The leader writes it once; every node reads it (from the result key, the join transaction, or the news copy) and
# gets a RoundResult, or None when the value is not a result record (garbage, or a value some other program wrote).
# Where the result key holds such a value the round cannot be read: `result_of` refuses it with a RendezvousError
# that says so, never a traceback.

MAX_RESULT_NODES = 1 << 20  # far above any real round: a longer list is not a result


@dataclass(frozen=True)
class RoundResult:
    """Who is in the round (group-rank order), where group rank 0 listens, and up to where its leader saw joins."""

    nodes: tuple[str, ...]
    master_addr: str
    master_port: int
    nproc: int
    closed_at: float = 0.0  # wall clock, when the leader closed the round
    rev: int = 0  # the revision up to which the leader saw the joins (watch members from there)

    def record(self) -> JSONObject:
        """The JSON record etcd holds."""
        return {"nodes": list(self.nodes), "master_addr": self.master_addr, "master_port": self.master_port,
                "nproc": self.nproc, "closed_at": self.closed_at, "rev": self.rev}


def _integer(value: object) -> int | None:
    """An integer of the record (an integral float too, as int() took it), never a boolean."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def parse_result(value: object) -> RoundResult | None:
    """The RoundResult a decoded JSON value holds, or None when it is not one (never raises)."""
    if not isinstance(value, dict):
        return None
    nodes = value.get("nodes")
    if not isinstance(nodes, (list, tuple)) or len(nodes) > MAX_RESULT_NODES:
        return None
    if not all(isinstance(node, str) for node in nodes):
        return None
    return result_with(value, tuple(nodes))


def result_with(head: Mapping[str, object], nodes: tuple[str, ...]) -> RoundResult | None:
    """The RoundResult of a record's other fields and `nodes` (read as text already), or None (never raises)."""
    addr, closed_at = head.get("master_addr"), head.get("closed_at", 0.0)
    port, nproc, rev = _integer(head.get("master_port")), _integer(head.get("nproc")), _integer(head.get("rev", 0))
    if not isinstance(addr, str) or port is None or nproc is None or rev is None or len(nodes) > MAX_RESULT_NODES:
        return None
    if isinstance(closed_at, bool) or not isinstance(closed_at, (int, float)):
        return None
    return RoundResult(nodes, addr, port, nproc, float(closed_at), rev)


def result_of(value: object, round_: int) -> RoundResult:
    """The RoundResult of round `round_` read from its result key; RendezvousError when the key holds another value."""
    result = parse_result(value)
    if result is None:
        msg = f"the result of rendezvous round {round_} in etcd is not a result record: {str(value)[:120]!r}"
        raise RendezvousError(msg, fix="something other than runner wrote under this job's etcd prefix: give the "
                                       "job a new name, or forget its state (runner reset --force job.yaml)")
    return result


def encode_closed(result: RoundResult) -> bytes:
    """A round's result record as its news copy (JobKeys.closed): what every waiting node decodes.

    The record without its node list as one JSON line (with CLOSED_ZLIB set), then the node ids percent-encoded
    (encode_node: never a newline) one per line, zlib-compressed. Splitting lines is several times cheaper than
    decoding a JSON list of N strings, and a round of N nodes has N nodes decoding it. Compressed because every
    node of the round receives the copy: N copies of N ids, the one cost of a round that grows as N squared
    (docs/scale.md); node ids of real clusters (hostnames sharing a prefix and a numbering) shrink 3-12 times, for
    well under 1 ms of decompression per node at 16,384 nodes.
    """
    head = {key: value for key, value in result.record().items() if key != "nodes"}
    body = "\n".join(map(encode_node, result.nodes)).encode()
    return dump({**head, CLOSED_ZLIB: True}) + b"\n" + zlib.compress(body, 1)


def decode_closed(raw: bytes) -> RoundResult | None:
    """The result from its news copy (None when `raw` is not one).

    A copy without CLOSED_ZLIB (written by an older runner) has its ids uncompressed.
    """
    head, sep, body = raw.partition(b"\n")
    record = load(head)
    if not sep or not isinstance(record, dict):
        return None
    if record.pop(CLOSED_ZLIB, None) is True:
        inflate = zlib.decompressobj()
        try:
            body = inflate.decompress(body, MAX_CLOSED_BYTES)
        except zlib.error:
            return None
        if inflate.unconsumed_tail or not inflate.eof:
            return None  # truncated, or larger than any real round
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return None
    ids = text.split("\n") if text else []
    try:
        nodes = tuple(ids) if "%" not in text else tuple(map(decode_node, ids))
    except UnicodeDecodeError:  # an escaped id that is no UTF-8 text: not a copy runner wrote
        return None
    return result_with(record, nodes)


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
                if (done := await self._lead()) is not None:
                    return done
                claim = True  # it led no more (its leader key gone): read the round again
                continue
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

    async def _lead(self) -> RoundResult | None:
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

    async def _lead_loop(self, watch: Watch, roster: Roster) -> RoundResult | None:
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

    async def _write_result(self, roster: Roster) -> RoundResult | None:
        """Write the round's result if none is and this node still leads; the result, None if it leads no more.

        The leader key is compared too: a leader cut off long enough for its lease to lapse (another node may lead
        now), or one whose etcd restarted without its data (the key is gone with the job's), must not close a
        round from its stale table of joins; it reads the round again instead.
        """
        result = build_result(roster.joined, roster.previous, self._rules.max_nodes, self._view)
        key = self._result
        puts = [put_op(key, dump(result.record())), put_op(self._closed, encode_closed(result))]
        compare = [absent(key), value_is(self._leader, dump(self._node))]
        done = await self._s.call(lambda c: c.txn(compare, puts, [range_op(key_range(key))]))
        if not done.succeeded:
            if not done.kvs[0]:
                self._log.warning("rendezvous_lead_lost", round=self._r,
                                  detail="this node's leader key is gone: the round is read again")
                return None
            result = result_of(load(done.kvs[0][0].value), self._r)
        self._log.info("rendezvous_round_closed", round=self._r, nodes=len(result.nodes), written=done.succeeded)
        return result
