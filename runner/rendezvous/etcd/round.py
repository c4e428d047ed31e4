"""Waiting for one rendezvous round to close.

The first node to join a round (smallest create revision of its join key) leads it: it watches every
join record and the nodes' live states and writes `rounds/{r}/result` once (txn on create revision 0)
when max nodes joined, or when min joined, every still-alive node of the previous round re-joined and
last_call passed. Other nodes only watch the result key, the leader's join key (to take over when the
leader leaves) and the control key, so a round costs O(N) watch events in all.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from runner.progress import Progress
from runner.rendezvous.etcd.client import (
    EtcdSession,
    absent,
    key_range,
    prefix_end,
    prefix_range,
    put_op,
    range_op,
)
from runner.rendezvous.etcd.keys import JobKeys, dump, load
from runner.rendezvous.etcd.watch import DELETE, PUT, Event, Watch
from runner.rendezvous.ranks import assign_ranks

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


def is_gone(state: dict[str, Any] | None) -> bool:
    """True when a node's live state is absent or says it has ended."""
    return state is None or state.get("state") == TERMINAL or bool(state.get("outcome"))


def pending(previous: Sequence[str], joined: dict[str, Any], states: dict[str, Any]) -> list[str]:
    """Nodes of the previous round that are still alive but have not joined yet."""
    return [n for n in previous if n not in joined and not is_gone(states.get(n))]


def build_result(joined: dict[str, Any], previous: Sequence[str], max_nodes: int) -> dict[str, Any]:
    """The result record: nodes in group-rank order, master = group rank 0's address and port.

    `joined` maps node -> join record, decoded or raw JSON bytes (only group rank 0's is decoded).
    """
    nodes = assign_ranks(joined, previous)[:max_nodes]
    master = joined[nodes[0]]
    if isinstance(master, bytes):
        master = load(master)
    return {"nodes": list(nodes), "master_addr": master["addr"], "master_port": master["port"],
            "nproc": master["nproc"], "closed_at": time.time()}


class RoundWaiter:
    """Waits for round `r` to close (leading it when this node joined first)."""

    def __init__(self, session: EtcdSession, keys: JobKeys, node: str, round_: int, rules: RoundRules,
                 previous: Sequence[str], log: Any = None) -> None:
        self._s, self._k, self._node, self._r = session, keys, node, round_
        self._rules, self._previous = rules, tuple(previous)
        self._log = log or structlog.get_logger("runner.rendezvous.etcd.backend")
        self.joined_seen = 1
        self._view = 0  # leader: revision up to which its table of joins is complete
        self.progress: dict[str, Any] = {}  # what a waiting node shows (runner/progress.py), besides the round

    def reads(self) -> list[Any]:
        """What wait() needs to know first: the round's first joiner, its result, the control key."""
        return [prefix_range(self._k.round_nodes(self._r), first_created=True),
                key_range(self._k.result(self._r)), key_range(self._k.control)]

    async def wait(self, first: tuple[int, list[list[Any]]] | None = None) -> dict[str, Any]:
        """The round's result record (which may not include this node).

        `first`: (revision, kvs per range of reads()) already read, e.g. in the join transaction.
        The record's "rev" is the revision at which its leader saw the joins (watch members from there).
        """
        while True:
            if first is None:
                first = await self._s.call(lambda c: c.snapshot(self.reads()))
            rev, (first_kv, result, control) = first
            first = None
            if result:
                return dict(load(result[0].value))
            self._k.check_open(control[0].value if control else None)
            leader = JobKeys.leaf(first_kv[0].key) if first_kv else self._node
            if leader == self._node:
                return await self._lead()
            self.progress = {"role": "follower", "leader": leader}
            with Progress(self._log, "rendezvous", self.waiting):
                done = await self._follow(rev, leader)
            if done is not None:
                return done

    async def _follow(self, rev: int, leader: str) -> dict[str, Any] | None:
        """Result, or None when the leader left (then someone else leads)."""
        self._log.debug("rendezvous_following", round=self._r, leader=leader)
        ranges = [(self._k.result(self._r), None), (self._k.join(self._r, leader), None), (self._k.control, None)]
        watch = await Watch(self._s, ranges, rev + 1, self._log).start()
        try:
            while True:
                ev = await watch.next()
                if ev.key == self._k.control and ev.kind == PUT:
                    self._k.check_open(ev.value)
                elif ev.key == self._k.result(self._r) and ev.kind == PUT:
                    return dict(load(ev.value))
                elif ev.kind == DELETE:
                    return None
        finally:
            await watch.cancel()

    async def _lead(self) -> dict[str, Any]:
        rev, (joins, states, result, control) = await self._s.call(lambda c: c.snapshot(
            [prefix_range(self._k.round_nodes(self._r)), prefix_range(self._k.states),
             key_range(self._k.result(self._r)), key_range(self._k.control)]))
        if result:
            return dict(load(result[0].value))
        self._k.check_open(control[0].value if control else None)
        joined = {JobKeys.leaf(kv.key): kv.value for kv in joins}  # raw: only the master's is decoded
        self._view = rev
        live = {JobKeys.leaf(kv.key): load(kv.value) for kv in states}
        self._log.info("rendezvous_leading", round=self._r, joined=len(joined))
        ranges = [(self._k.round_nodes(self._r), prefix_end(self._k.round_nodes(self._r))),
                  (self._k.states, prefix_end(self._k.states)),
                  (self._k.result(self._r), None), (self._k.control, None)]
        watch = await Watch(self._s, ranges, rev + 1, self._log).start()
        self.progress = {"role": "leader", "joined": joined}
        try:
            with Progress(self._log, "rendezvous", self.waiting):
                return await self._lead_loop(watch, joined, live)
        finally:
            await watch.cancel()

    async def _lead_loop(self, watch: Watch, joined: dict[str, Any], live: dict[str, Any]) -> dict[str, Any]:
        min_at: float | None = None
        while True:
            self.joined_seen = len(joined)
            ready = len(joined) >= self._rules.min_nodes and not pending(self._previous, joined, live)
            if not ready:
                min_at = None
            elif min_at is None:
                min_at = time.monotonic()
            self.progress = {"role": "leader", "joined": joined, "waiting_for": pending(self._previous, joined, live),
                             "last_call_ends": None if min_at is None else min_at + self._rules.last_call}
            if len(joined) >= self._rules.max_nodes or (
                    min_at is not None and time.monotonic() - min_at >= self._rules.last_call):
                return await self._write_result(joined)
            wait = None if min_at is None else self._rules.last_call - (time.monotonic() - min_at)
            try:
                ev = await asyncio.wait_for(watch.next(), wait)
            except TimeoutError:
                continue
            self._view = max(self._view, ev.mod_revision)
            done = self._apply(ev, joined, live)
            if done is not None:
                return done

    def waiting(self) -> dict[str, Any]:
        """This round's wait as `waiting` fields: joined nodes (the leader knows them), min..max, time left."""
        now, rules, info = time.monotonic(), self._rules, self.progress
        fields: dict[str, Any] = {"round": self._r, "min": rules.min_nodes, "max": rules.max_nodes,
                                  **{k: v for k, v in info.items() if k not in ("joined", "last_call_ends")}}
        if "joined" in info:
            fields["joined"], fields["joined_count"] = sorted(info["joined"])[:MAX_SHOWN], len(info["joined"])
            fields["waiting_for"] = list(info.get("waiting_for", []))[:MAX_SHOWN]
        if info.get("last_call_ends") is not None:
            fields["last_call_s"] = round(max(0.0, info["last_call_ends"] - now), 1)
        if rules.join_timeout is not None:
            fields["left_s"] = round(max(0.0, rules.started + rules.join_timeout - now), 1)
        return fields

    def _apply(self, ev: Event, joined: dict[str, Any], live: dict[str, Any]) -> dict[str, Any] | None:
        key, put = ev.key, ev.kind == PUT
        if key == self._k.control and put:
            self._k.check_open(ev.value)
        elif key == self._k.result(self._r) and put:
            return dict(load(ev.value))
        elif key.startswith(self._k.round_nodes(self._r)):
            _set(joined, JobKeys.leaf(key), ev.value if put else None)
        elif key.startswith(self._k.states):
            _set(live, JobKeys.leaf(key), load(ev.value) if put else None)
        return None

    async def _write_result(self, joined: dict[str, Any]) -> dict[str, Any]:
        record = {**build_result(joined, self._previous, self._rules.max_nodes), "rev": self._view}
        key = self._k.result(self._r)
        done = await self._s.call(lambda c: c.txn([absent(key)], [put_op(key, dump(record))],
                                                   [range_op(key_range(key))]))
        if not done.succeeded:
            record = dict(load(done.kvs[0][0].value))
        self._log.info("rendezvous_round_closed", round=self._r, nodes=len(record["nodes"]), written=done.succeeded)
        return record


def _set(table: dict[str, Any], name: str, value: Any) -> None:
    if value is None:
        table.pop(name, None)
    else:
        table[name] = value
