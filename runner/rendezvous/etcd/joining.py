"""This node's way into the job's rounds: join the open round, wait for its result, take its seat in it.

The round key names the round open for joining; a node joins with one transaction (live state, join record, the
round's ticket) that also reads what waiting needs, then waits for the round's result (runner.rendezvous.etcd.round:
leading or following). A result names nodes, not agents, so a seat is taken only when it is this agent's (the
leader counted this agent's own join record) and the job has not left the round without this node (its lease
lapsed while a later round was opened). A round that closed without this node, or a wrong hint, moves it on to the
round that is open (opening the next one when the current one closed: the news of a newcomer for its members).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from runner.config.spec import JobSpec
from runner.rendezvous.base import RendezvousResult
from runner.rendezvous.etcd.client import (
    Compare,
    Connection,
    EtcdSession,
    KeyValue,
    absent,
    key_range,
    put_op,
    range_op,
    value_is,
)
from runner.rendezvous.etcd.keys import JobKeys, dump, load
from runner.rendezvous.etcd.lease import LeaseKeeper
from runner.rendezvous.etcd.round import RoundResult, RoundRules, RoundWaiter, result_of
from runner.rendezvous.ports import free_port

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger


class RoundJoiner:
    """Joins rounds for one node (one agent process): the round it tries next, and its own join records."""

    def __init__(self, session: EtcdSession, lease: LeaseKeeper, keys: JobKeys, spec: JobSpec, node: str, *,
                 addr: str, state_record: Callable[[dict[str, object]], dict[str, object]],
                 log: FilteringBoundLogger) -> None:
        """`state_record`: this node's live state record, its last state updated with the fields given."""
        self._s, self._lease, self._keys, self._spec = session, lease, keys, spec
        self._node, self._addr, self._state_record, self._log = node, addr, state_record, log
        self.hint = 0  # the round this node expects to be open (checked, not trusted)
        self._joined_at: dict[int, int] = {}  # round -> revision of this process's first join record in it
        self._joined_lease: dict[int, int] = {}  # round -> the lease this process's last join record in it went on

    def restart(self, hint: int) -> None:
        """Count rounds from `hint`, forgetting this node's joins (admission, or a new etcd after a data loss).

        A new etcd counts revisions from 1 again: an old join's revision would refuse every seat.
        """
        self.hint = hint
        self._joined_at.clear()
        self._joined_lease.clear()

    async def join(self, attempt: int, waiter: list[RoundWaiter], last_port: int = 0) -> tuple[RendezvousResult, int]:
        """Join the open round; (result, revision from which the round's members are watched).

        `waiter` collects each round's waiter (the caller reads the last one's counts and watch); `last_port`: the
        previous round's MASTER_PORT, not offered again.
        """
        rules = RoundRules(self._spec.nodes.min, self._spec.nodes.max, self._spec.rendezvous.last_call,
                           self._spec.rendezvous.join_timeout)  # the join timeout, for the waiting line
        k = self._keys
        while True:
            r = self.hint
            join_key = k.join(r, self._node)
            record = dump({"addr": self._addr, "nproc": self._spec.nproc_per_node,
                           "port": self._spec.rendezvous.master_port or free_port(avoid=(last_port,)),
                           "joined": time.time(), "attempt": attempt})
            waiter.append(RoundWaiter(self._s, k, self._node, r, rules, lease=self._lease, record=record,
                                      log=self._log))
            state = self._state_record({"state": "RENDEZVOUS", "attempt": attempt, "joining": r})
            # one transaction: live state, join record and the round's ticket on the lease; the round key, what the
            # waiter reads first, and the ticket read back (version 1: this join was the round's first)
            rev, (round_kv, *first, ticket) = await self._lease.put_and_read(
                {k.state(self._node): dump(state), join_key: record, k.ticket(r): b""},
                [key_range(k.round), *waiter[-1].reads(), key_range(k.ticket(r))])
            self._joined_at.setdefault(r, rev)
            self._joined_lease[r] = self._lease.lease_id
            k.check_open(first[2][0].value if first[2] else None)
            closed = result_of(load(first[1][0].value), r) if first[1] else None
            if closed is not None or await self._round_open(r, _round_of(round_kv)):
                if closed is None:
                    self._log.info("rendezvous_joined", round=r, attempt=attempt)
                    closed = await waiter[-1].wait((rev, first), first_joiner=bool(ticket) and ticket[0].version == 1)
                result = self._to_result(r, closed)
                if result is not None and await self._round_left(r):
                    result = None
                if result is not None:
                    self.hint = r + 1
                    return result, closed.rev
                self._log.info("rendezvous_round_missed", round=r)
                watch = waiter[-1].take_watch()
                if watch is not None:
                    await watch.cancel()
            self._lease.forget(join_key)  # a round that closed without this node, or no open round (a wrong hint)
            self._lease.forget(k.ticket(r))
            await self._s.call(partial(Connection.delete, key=join_key))
            self.hint = await self._open_round(r)

    async def _round_left(self, r: int) -> bool:
        """Whether the job has left round `r`, whose result includes this node, without this node.

        A node that read the result late (cut off, or frozen, between its join and the close, while its lease lapsed
        and the others formed the next round without it) would otherwise start workers of a world nobody else is in
        any more, beside the next round's; it joins the round that is open instead. The job left it without this
        node when a later round was opened and this node's join record of round `r` is no longer the one it put (its
        lease lapsed: the record vanished, or the lease keeper put it again on a new lease). A later round opened
        while this node's record stands is the usual news of a newcomer: this node takes its seat in `r` and its
        round monitor reports the change (MembershipChanged), as for every member.
        """
        _, (round_kv, mine) = await self._s.call(lambda c: c.snapshot(
            [key_range(self._keys.round), key_range(self._keys.join(r, self._node))]))
        current = _round_of(round_kv)
        lapsed = not mine or int(mine[0].lease) != self._joined_lease.get(r)
        if current <= r or not lapsed:
            return False
        self._log.warning("rendezvous_round_left", round=r, current=current,
                          detail="this node's lease lapsed and the job opened a later round before this node read "
                                 "this one's result: it joins the open round instead of starting workers of one the "
                                 "others left")
        return True

    async def _round_open(self, r: int, current: int) -> bool:
        """Whether round `r`, which has no result yet, is the one open for joining, the round key being `current`.

        It is when the key says `r`, or `r - 1` (the round this node was in closed and it comes back first: it
        moves the key on, recording itself as the opener of round `r`).
        """
        if current == r:
            return True
        if current != r - 1:
            return False
        await self._bump(r - 1)
        return True

    async def _bump(self, r: int) -> None:
        """Move the round key from `r` to `r + 1` unless someone did, naming this node as the next round's opener.

        A newcomer opening the next round is what tells the running round's members about a membership change.
        """
        k = self._keys
        bump = [put_op(k.round, str(r + 1).encode()), put_op(k.opened(r), dump(self._node))]
        await self._s.call(partial(Connection.txn, compare=[_round_is(k, r)], success=bump))

    async def _open_round(self, hint: int) -> int:
        """The round open for joining; JobClosed when the job is closed.

        The round open for joining is the current one, or the next, bumped, when it already closed. One
        transaction when the hint is right: it reads the control key and the round's result if the round key
        holds the hint.
        """
        k, r = self._keys, hint
        while True:
            guard = _round_is(k, r)
            reads = [range_op(key_range(k.control)), range_op(key_range(k.result(r))), range_op(key_range(k.round))]
            done = await self._s.call(partial(Connection.txn, compare=[guard], success=reads[:2],
                                                   failure=[reads[0], reads[2]]))
            kvs = done.kvs
            k.check_open(kvs[0][0].value if kvs[0] else None)
            if not done.succeeded:  # the hint was wrong: now we know the round
                r = _round_of(kvs[1])
                continue
            if not kvs[1]:
                return r
            await self._bump(r)
            r += 1

    def _to_result(self, r: int, record: RoundResult) -> RendezvousResult | None:
        """This node's result of round `r` (None when the round closed without this agent).

        The round names nodes, not agents: an agent started again under the node's name (its host lost, or the
        agent killed) while the round its predecessor was in still stands finds its name in it. The seat is
        this agent's only when the leader counted this agent's join record: the leader saw the joins up to the
        record's `rev`, so this agent's first join into the round must be at or before it. Otherwise it would
        start workers of a world whose other members are gone or run workers of it already.
        """
        nodes = record.nodes
        try:
            rank = nodes.index(self._node)
        except ValueError:
            return None
        if self._joined_at.get(r, 0) > record.rev or r not in self._joined_at:
            self._log.warning("rendezvous_seat_of_predecessor", round=r, joined_at=self._joined_at.get(r),
                              seen_up_to=record.rev,
                              detail="the round closed with this node's name but a join record written before "
                                     "this agent started: it joins the next round")
            return None
        return RendezvousResult(round=r, node=self._node, group_rank=rank,
                                group_world_size=len(nodes), nproc_per_node=record.nproc,
                                master_addr=record.master_addr, master_port=record.master_port,
                                nodes=nodes, extra={"backend": "etcd"})


def _round_of(kvs: list[KeyValue]) -> int:
    """The round number in a read of the round key (0 when the key does not exist yet)."""
    return int(kvs[0].value) if kvs else 0


def _round_is(keys: JobKeys, r: int) -> Compare:
    """Comparison: the round key says `r` (round 0: the key does not exist yet)."""
    return value_is(keys.round, str(r).encode()) if r > 0 else absent(keys.round)
