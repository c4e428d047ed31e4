"""The etcd v3 rendezvous backend: per-node keys on a lease, watches, one result per round.

Key layout: runner.rendezvous.etcd.keys. Round closing: runner.rendezvous.etcd.round.
While a round runs, one watch turns etcd changes into agent events (PeerLost, MembershipChanged,
StopRequested): runner.rendezvous.etcd.monitor. `runner status/stop/reset`: runner.rendezvous.etcd.admin.

etcd that lost the job's data (data dir wiped, cluster replaced: the cluster id changes, the revision goes back,
or our lease is gone together with the job's epoch key) is noticed within the lease TTL. The node then:
- while its workers run: gets PeerLost("etcd", ...) on its event queue, so the attempt fails like any lost peer
  (charged to the restart budget) and the next rendezvous happens in the new etcd;
- while it waits in next_round: leaves the round it waited for and joins again in the new etcd (join timeout
  restarted);
- in every case: re-admits itself first (fresh lease, spec digest and epoch written again or adopted, restart count
  seeded from what this node knew), so every node meets in the new etcd's round 0 and nobody keeps a stale world.

A node cut off from etcd and from every peer of its round fences itself before its lease lapses
(runner.rendezvous.etcd.fence): the agent gets Fenced, stops its workers and leaves; nothing is written to etcd
after that (this node's keys vanish with its lease, and the others go on without it).

Side calls (publish, charge_restart, close) return or raise RendezvousError within the connect timeout, whatever
etcd does.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from runner.config.spec import JobSpec
from runner.errors import RendezvousError, RendezvousTimeout
from runner.events import Fenced, PeerLost
from runner.rendezvous.base import RendezvousResult
from runner.rendezvous.etcd.admin import write_control
from runner.rendezvous.etcd.admission import admit, job_intact
from runner.rendezvous.etcd.budget import Charge, charge_round
from runner.rendezvous.etcd.client import (
    Connection,
    EtcdSession,
    LeaseNotFound,
    absent,
    key_range,
    prefix_range,
    put_op,
    range_op,
    value_is,
)
from runner.rendezvous.etcd.connect import new_session
from runner.rendezvous.etcd.fence import Fence, Peer
from runner.rendezvous.etcd.hang_exchange import share
from runner.rendezvous.etcd.keys import JobKeys, check_node_id, dump, ledger_of, load
from runner.rendezvous.etcd.lease import LeaseKeeper, revoke_ticket
from runner.rendezvous.etcd.lease_revoke import LeaseListener
from runner.rendezvous.etcd.monitor import RoundMonitor
from runner.rendezvous.etcd.round import RoundRules, RoundWaiter
from runner.rendezvous.node_ledger import Mark, NodeRecord, record_of
from runner.rendezvous.ports import free_port

if TYPE_CHECKING:
    from collections.abc import Callable

    from structlog.typing import FilteringBoundLogger

    from runner.events import Event, StopRequested
    from runner.hangs import RankRecord

T = TypeVar("T")
FINAL_STATE_TTL_S = 3600
LEDGER_BUDGET_S = 2.0  # the node ledger's write, at most (runner/rendezvous/node_ledger.py)
LOST_PEER = "etcd"  # the PeerLost.node of a data loss


class DataLost(Exception):
    """etcd lost the job's data while this node waited in a round (internal: next_round joins again)."""


class EtcdRendezvous:
    """Rendezvous through etcd v3. No I/O until open()."""

    def __init__(self, spec: JobSpec, node: str, *, advertise_addr: str,
                 log: FilteringBoundLogger | None = None, keys: JobKeys | None = None) -> None:
        """`keys`: where the job's keys live (default `{prefix}/{name}/`; a replica group's are its own)."""
        self._spec, self._node, self._addr = spec, node, advertise_addr
        self._keys = keys or JobKeys(spec.rendezvous.prefix, spec.name)
        self._log = log or structlog.get_logger("runner.rendezvous.etcd.backend").bind(node=node)
        self._session: EtcdSession | None = None
        self._lease: LeaseKeeper | None = None
        self._events: asyncio.Queue[Event] | None = None
        self._monitor: RoundMonitor | None = None
        self._stop_sink: Callable[[StopRequested], None] | None = None  # None: onto the events queue
        self._result: RendezvousResult | None = None
        self._state: dict[str, Any] = {}
        self._admitted = False  # open() passed the spec and closed-job checks: this node belongs to the job
        self._round_hint = 0  # the round this node expects to be open (checked, not trusted)
        self._joined_at: dict[int, int] = {}  # round -> revision of this process's first join record in it
        self._joined_lease: dict[int, int] = {}  # round -> the lease this process's last join record in it went on
        self._epoch = b""  # the job's epoch token this node was admitted under
        self._lost: str | None = None  # why etcd's data is considered lost, until this node re-admitted itself
        self._lost_event = asyncio.Event()
        self._restarts_known = 0  # the job-wide restart count this node last saw (seeds a recreated job)
        self._lease_listener: LeaseListener | None = None  # the guard: revokes our lease if this agent dies
        self._fence: Fence | None = None  # while a round runs: fires when this node is the one cut off
        self.fenced: str | None = None  # why this node fenced itself (then nothing more goes to etcd)
        self._side_calls: set[asyncio.Future[Any]] = set()  # bounded side calls in flight: the fence cancels them

    @property
    def session(self) -> EtcdSession:
        """The open session."""
        if self._session is None:
            msg = "EtcdRendezvous.open() was not called"
            raise RendezvousError(msg)
        return self._session

    @property
    def lease(self) -> LeaseKeeper:
        """This node's lease."""
        if self._lease is None:
            msg = "EtcdRendezvous.open() was not called"
            raise RendezvousError(msg)
        return self._lease

    async def open(self, events: asyncio.Queue[Event]) -> None:
        """Connect, grant the lease, check the spec and that the job is still open."""
        check_node_id(self._node)
        self._events = events
        self._session = new_session(self._spec, self._log, probe=False)  # the lease grant is the probe
        self._session.identity.on_loss(self._on_data_lost)
        await self._session.connect()
        self._lease = LeaseKeeper(self._session, self._spec.rendezvous.lease_ttl, self._log,
                                  job_intact=self._job_intact, on_data_lost=self._on_data_lost)
        if self._lease_listener is not None:
            self._lease.watch(self._lease_listener, revoke_ticket(self._spec))
        await self._lease.grant()
        await self._admit()
        self._admitted = True

    def on_stop(self, sink: Callable[[StopRequested], None]) -> None:
        """`runner stop` (the control key's "stopping"), seen by this round's monitor, goes to `sink`."""
        self._stop_sink = sink
        if self._monitor is not None:
            self._monitor.stops = sink

    def on_lease(self, listener: LeaseListener) -> None:
        """Tell `listener` how to revoke this node's lease whenever it is granted or replaced (None: given up).

        The agent passes its guard's (runner.system.shepherd), so that a dead agent's lease is revoked at once.
        """
        self._lease_listener = listener
        if self._lease is not None:
            self._lease.watch(listener, revoke_ticket(self._spec))

    async def _admit(self) -> None:
        """Join the job (runner/rendezvous/etcd/admission.py): its epoch, and the round this node tries first."""
        admitted = await admit(self.session, self._keys, self._spec, restarts_known=self._restarts_known)
        self._epoch, self._round_hint = admitted.epoch, admitted.round_hint

    async def _job_intact(self) -> bool:
        return await job_intact(self.session, self._keys, self._epoch)

    def _on_data_lost(self, reason: str) -> None:
        """Etcd lost the job's keys: remember it (the next call re-admits this node) and fail a running attempt."""
        if not self._admitted or self._lost is not None:
            return
        self._lost = reason
        self._lost_event.set()
        self._log.warning("etcd_data_lost", reason=reason)
        if self._monitor is not None and self._events is not None:
            self._events.put_nowait(PeerLost(LOST_PEER, f"etcd lost the job's keys: {reason}; rendezvous again"))

    async def _recover(self) -> None:
        """After a data loss: a fresh lease and admission in the new etcd, rounds counted from 0 again."""
        if self._lost is None:
            return
        reason, self._lost = self._lost, None  # a loss seen while re-admitting is handled by the next call
        self._lost_event.clear()
        await self._stop_monitor()
        self.lease.forget_all()
        await self.lease.grant()
        self._round_hint = 0
        self._joined_at.clear()  # the new etcd counts revisions from 1 again
        self._joined_lease.clear()
        await self._admit()
        self._log.warning("etcd_job_readmitted", reason=reason, restarts=self._restarts_known)

    async def next_round(self, attempt: int) -> RendezvousResult:
        """Join the next round and wait for it to close."""
        await self._stop_monitor()
        started = time.monotonic()
        waiter: list[RoundWaiter] = []
        while True:
            await self._recover()
            try:
                async with asyncio.timeout(self._spec.rendezvous.join_timeout):
                    result, since = await self._unless_lost(self._join(attempt, waiter))
                break
            except TimeoutError:
                joined = waiter[-1].joined_seen if waiter else 0
                raise RendezvousTimeout(self._spec.name, time.monotonic() - started, joined,
                                        self._spec.nodes.min) from None
            except DataLost:
                self._log.warning("rendezvous_again_after_data_loss", attempt=attempt)
                started, waiter = time.monotonic(), []
        self._result = result
        self._monitor = RoundMonitor(self.session, self._keys, result, self._spec.nodes.max, self._events, self._log,
                                     since=since)
        self._monitor.stops = self._stop_sink
        await self._monitor.start(waiter[-1].take_watch())  # a follower's stream goes on watching for it
        session = self.session
        self._fence = Fence(self.lease.ttl, lambda: self.lease.confirmed_until, await self._fence_peers(result),
                            self._on_fenced, self._log, answered_at=lambda: session.answered_at)
        self._fence.start()
        self._log.info("rendezvous_complete", round=result.round, group_rank=result.group_rank,
                       nodes=result.group_world_size, master_addr=result.master_addr, master_port=result.master_port)
        return result

    async def _unless_lost(self, work: Awaitable[T]) -> T:
        """`work`'s result, or DataLost as soon as etcd's data is found lost (work is then cancelled)."""
        task = asyncio.ensure_future(work)
        lost = asyncio.ensure_future(self._lost_event.wait())
        try:
            await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not task.done():
                task.cancel()
                await asyncio.wait({task})
        if task.cancelled() or (self._lost is not None and isinstance(task.exception(), RendezvousError)):
            raise DataLost  # cancelled because of the loss, or failed by it (a write on the forgotten lease)
        return task.result()

    async def _join(self, attempt: int, waiter: list[RoundWaiter]) -> tuple[RendezvousResult, int]:
        """Join the open round; (result, revision from which the round's members are watched)."""
        rules = RoundRules(self._spec.nodes.min, self._spec.nodes.max, self._spec.rendezvous.last_call,
                           self._spec.rendezvous.join_timeout)  # the join timeout, for the waiting line
        last_port = self._result.master_port if self._result is not None else 0
        k = self._keys
        while True:
            r = self._round_hint
            join_key = k.join(r, self._node)
            record = dump({"addr": self._addr, "nproc": self._spec.nproc_per_node,
                           "port": self._spec.rendezvous.master_port or free_port(avoid=(last_port,)),
                           "joined": time.time(), "attempt": attempt})
            waiter.append(RoundWaiter(self.session, k, self._node, r, rules, lease=self.lease, record=record,
                                      log=self._log))
            state = self._state_record({**self._state, "state": "RENDEZVOUS", "attempt": attempt, "joining": r})
            # one transaction: live state, join record and the round's ticket on the lease; the round key, what the
            # waiter reads first, and the ticket read back (version 1: this join was the round's first)
            rev, (round_kv, *first, ticket) = await self.lease.put_and_read(
                {k.state(self._node): dump(state), join_key: record, k.ticket(r): b""},
                [key_range(k.round), *waiter[-1].reads(), key_range(k.ticket(r))])
            self._joined_at.setdefault(r, rev)
            self._joined_lease[r] = self.lease.lease_id
            k.check_open(first[2][0].value if first[2] else None)
            closed = load(first[1][0].value) if first[1] else None
            if closed is not None or await self._round_open(r, _round_of(round_kv)):
                if closed is None:
                    self._log.info("rendezvous_joined", round=r, attempt=attempt)
                    closed = await waiter[-1].wait((rev, first), first_joiner=bool(ticket) and ticket[0].version == 1)
                result = self._to_result(r, closed)
                if result is not None and await self._round_left(r):
                    result = None
                if result is not None:
                    self._round_hint = r + 1
                    return result, int(closed.get("rev", 0))
                self._log.info("rendezvous_round_missed", round=r)
                watch = waiter[-1].take_watch()
                if watch is not None:
                    await watch.cancel()
            self.lease.forget(join_key)  # a round that closed without this node, or no open round (a wrong hint)
            self.lease.forget(k.ticket(r))
            await self.session.call(partial(Connection.delete, key=join_key))
            self._round_hint = await self._open_round(r)

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
        _, (round_kv, mine) = await self.session.call(lambda c: c.snapshot(
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
        await self.session.call(partial(Connection.txn, compare=[_round_is(k, r)], success=bump))

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
            done = await self.session.call(partial(Connection.txn, compare=[guard], success=reads[:2],
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

    def _to_result(self, r: int, record: dict[str, Any]) -> RendezvousResult | None:
        """This node's result of round `r` (None when the round closed without this agent).

        The round names nodes, not agents: an agent started again under the node's name (its host lost, or the
        agent killed) while the round its predecessor was in still stands finds its name in it. The seat is
        this agent's only when the leader counted this agent's join record: the leader saw the joins up to the
        record's "rev", so this agent's first join into the round must be at or before it. Otherwise it would
        start workers of a world whose other members are gone or run workers of it already.
        """
        nodes = tuple(record["nodes"])
        try:
            rank = nodes.index(self._node)
        except ValueError:
            return None
        if self._joined_at.get(r, 0) > int(record.get("rev", 0)) or r not in self._joined_at:
            self._log.warning("rendezvous_seat_of_predecessor", round=r, joined_at=self._joined_at.get(r),
                              seen_up_to=record.get("rev"),
                              detail="the round closed with this node's name but a join record written before "
                                     "this agent started: it joins the next round")
            return None
        return RendezvousResult(round=r, node=self._node, group_rank=rank,
                                group_world_size=len(nodes), nproc_per_node=int(record["nproc"]),
                                master_addr=str(record["master_addr"]), master_port=int(record["master_port"]),
                                nodes=nodes, extra={"backend": "etcd"})

    async def _bounded(self, what: str, work: Awaitable[T]) -> T:
        """`work` within the connect timeout; any failure becomes a RendezvousError.

        Side calls (publish, charge_restart, close) go through here: they never hang and never raise anything else.
        """
        try:
            limit = self.session.connect_timeout
        except RendezvousError:
            if isinstance(work, Coroutine):
                work.close()  # never started: no "coroutine was never awaited" warning
            raise
        task = asyncio.ensure_future(work)
        self._side_calls.add(task)
        task.add_done_callback(self._side_calls.discard)
        try:
            async with asyncio.timeout(limit):
                return await task
        except RendezvousError:
            raise
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if self.fenced is None or (me is not None and me.cancelling()):
                raise  # this call itself was cancelled, not by the fence
            msg = f"etcd {what} given up: this node fenced itself (cut off from etcd and its peers)"
            raise RendezvousError(msg) from None
        except TimeoutError:
            msg = f"etcd did not answer {what} within {limit:g} s (rendezvous.connect_timeout)"
            raise RendezvousError(msg, fix="check that etcd is up and reachable from this node") from None
        except Exception as exc:  # boundary: the agent must get a RendezvousError, whatever failed below
            self._log.warning("etcd_call_failed", call=what, error=repr(exc))
            msg = f"etcd {what} failed: {type(exc).__name__}: {exc}"
            raise RendezvousError(msg) from exc

    async def charge_restart(
        self, max_restarts: int, failure_class: str = "", class_limit: int | None = None, *, charged: bool = True,
        defer: float = 0.0,
    ) -> int | None:
        """Charge the failure of the current round once, job-wide; the new count or None when spent.

        A class's count is one more key, `restarts/<class>`, moved in the same transaction as the job's.
        """
        return await self._bounded("charge_restart",
                                   self._charge(max_restarts, failure_class, class_limit, charged, defer))

    async def _charge(self, max_restarts: int, cls: str, class_limit: int | None, job_wide: bool,
                      defer: float = 0.0) -> int | None:
        await self._recover()
        r = self._result.round if self._result else -1
        done = await charge_round(self.session, self._keys, self._node, r, Charge(max_restarts, cls, class_limit,
                                                                                 job_wide), defer=defer, log=self._log)
        self._restarts_known = max(self._restarts_known, done.seen)
        return done.count

    async def share_hang(self, local: list[RankRecord], *, timeout: float) -> list[RankRecord]:
        """Every member's flight-recorder records of this round's hang (runner/rendezvous/etcd/hang_exchange.py)."""
        result = self._result
        if result is None or len(result.nodes) < 2 or self._lost is not None:
            return local
        return await share(self.session, self._keys, result, local, timeout=timeout, log=self._log)

    async def note_node(self, mark: Mark | None) -> None:
        """This node's ledger record, read, noted and put back (only this node writes it); a warning on failure.

        Bounded by LEDGER_BUDGET_S, not the connect timeout: it is bookkeeping on the recovery path (FAILED), and an
        etcd that is down must not delay the restart by it; nothing of it once the job's keys are lost.
        """
        if self._lost is not None:
            return
        key = self._keys.ledger(self._node)

        async def note() -> None:
            raw = await self.session.call(lambda c: c.get(key), budget=LEDGER_BUDGET_S)
            old = record_of(load(raw.value)) if raw is not None else None
            new = (old or NodeRecord(self._node)).noted(mark, time.time())
            await self.session.call(lambda c: c.put(key, dump(new.to_json())), budget=LEDGER_BUDGET_S)

        try:
            async with asyncio.timeout(LEDGER_BUDGET_S):
                await note()
        except TimeoutError:
            self._log.warning("node_ledger_write_failed", error=f"etcd did not answer within {LEDGER_BUDGET_S:g} s")
        except RendezvousError as e:
            self._log.warning("node_ledger_write_failed", error=e.message)

    async def node_ledger(self) -> dict[str, NodeRecord]:
        """Every node's record under the job's keys ({} when etcd does not answer)."""
        try:
            _, (kvs,) = await self._bounded("node_ledger", self.session.call(
                lambda c: c.snapshot([prefix_range(self._keys.ledgers)])))
        except RendezvousError as e:
            self._log.warning("node_ledger_read_failed", error=e.message)
            return {}
        return ledger_of(kvs)

    async def publish(self, state: dict[str, Any]) -> None:
        """Put this node's live state (plus node, round, time) on the lease; bounded by the connect timeout.

        Before open() (the agent ended in INIT: no etcd binary, a refused spec) there is nothing to publish to: the
        state is only remembered (status.json has it), not a warning on top of the error that ended the run.
        """
        if self._session is None or self.fenced is not None:
            self._state_record(state)
            return
        await self._bounded("publish", self._publish(state))

    async def _publish(self, state: dict[str, Any]) -> None:
        record = self._state_record(state)
        if not self._admitted or self._lost is not None:
            return  # refused, never connected, or etcd lost the job (re-admission publishes again)
        try:
            await self.lease.put(self._keys.state(self._node), dump(record))
        except LeaseNotFound:
            if self._lost is None:
                raise

    def _state_record(self, state: dict[str, Any]) -> dict[str, Any]:
        """`state` plus node, round, time; remembered as this node's last state."""
        r = self._result.round if self._result else None
        self._state = {**state, "node": self._node, "round": r, "time": time.time()}
        return self._state

    async def close(self, outcome: str, *, alone: bool = False) -> None:
        """Publish the final state, close the job when this node decides it (not `alone`), revoke the lease.

        Bounded by the connect timeout; etcd unreachable is a RendezvousError (after everything local was
        released), never a hang.
        """
        if self._session is None:
            return
        if self.fenced is not None:  # cut off: etcd is not waited for; the lease lapses and the others go on
            await self._stop_monitor()
            if self._lease is not None:
                await self._lease.stop(revoke=False)
            await self._session.close()
            self._log.info("rendezvous_closed", outcome=outcome, fenced=True)
            return
        try:
            await self._bounded("close", self._leave(outcome, alone=alone))
        finally:
            await self._stop_monitor()
            if self._lease is not None:
                await self._lease.stop(revoke=False)
            await self._session.close()
            self._log.info("rendezvous_closed", outcome=outcome)

    async def _leave(self, outcome: str, *, alone: bool) -> None:
        await self._stop_monitor()
        if not self._admitted or self._lost is not None:
            return
        final = {**self._state, "state": "SHUTDOWN", "outcome": outcome}
        await self._publish(final)
        # Only the job's end closes it. A node stopped by a signal, kept out or given up on its own health just
        # leaves: the others go on with the nodes left (elastic), and a scheduler's requeue can rejoin (a kept-out
        # node once the next round formed). `runner stop` closes it.
        if outcome != "stopped" and not alone and self._result is not None and self._result.group_rank == 0:
            await write_control(self.session, self._keys, {"state": outcome, "by": self._node})
        long = await self.session.call(lambda c: c.lease_grant(FINAL_STATE_TTL_S))
        await self.session.call(lambda c: c.put(self._keys.final(self._node), dump(self._state), lease=long))
        await self.lease.stop(revoke=True)

    async def _stop_monitor(self) -> None:
        if self._fence is not None:
            fence, self._fence = self._fence, None
            await fence.stop()
        if self._monitor is not None:
            monitor, self._monitor = self._monitor, None
            await monitor.stop()

    async def _fence_peers(self, result: RendezvousResult) -> list[Peer]:
        """The peer the fence asks: the master node's (group rank 0) address; for the master, group rank 1's.

        Read and resolved now, while etcd and the name service answer; none for a round of one node. Any port does
        (a refused connection proves the path): the round's master port.
        """
        if len(result.nodes) < 2:
            return []
        node, host = result.nodes[0], result.master_addr
        if result.group_rank == 0:
            node = result.nodes[1]
            try:
                raw = await self._bounded("fence_peer", self.session.call(
                    lambda c: c.get(self._keys.join(result.round, node))))
                record = load(raw.value) if raw is not None else None
            except (RendezvousError, ValueError) as e:
                self._log.warning("fence_peer_unknown", node=node, error=str(e))
                return []
            if not isinstance(record, dict) or not isinstance(record.get("addr"), str):
                return []
            host = record["addr"]
        return [Peer(node, await resolved(host, self._log), result.master_port)]

    def _on_fenced(self, reason: str) -> None:
        """Cut off: nothing more goes to etcd; the agent stops its workers (Fenced)."""
        self.fenced = reason
        for call in list(self._side_calls):  # a status publish waiting out the connect timeout would hold SHUTDOWN
            call.cancel()
        if self._events is not None:
            self._events.put_nowait(Fenced(reason))


async def resolved(host: str, log: FilteringBoundLogger, timeout: float = 2.0) -> str:
    """`host`'s first address (a name is resolved once, while the name service answers); `host` itself if not."""
    try:
        async with asyncio.timeout(timeout):
            infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, TimeoutError) as e:
        log.warning("fence_peer_unresolved", host=host, error=str(e) or type(e).__name__)
        return host
    return str(infos[0][4][0]) if infos else host


def _round_of(kvs: list[Any]) -> int:
    """The round number in a read of the round key (0 when the key does not exist yet)."""
    return int(kvs[0].value) if kvs else 0


def _round_is(keys: JobKeys, r: int) -> Any:
    """Comparison: the round key says `r` (round 0: the key does not exist yet)."""
    return value_is(keys.round, str(r).encode()) if r > 0 else absent(keys.round)
