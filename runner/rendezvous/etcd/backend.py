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
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from runner.config.spec import JobSpec
from runner.errors import RendezvousError, RendezvousTimeout
from runner.events import Fenced, PeerLost
from runner.rendezvous.base import RendezvousResult, RoundCharge
from runner.rendezvous.etcd.admin import write_control
from runner.rendezvous.etcd.admission import admit, job_intact
from runner.rendezvous.etcd.budget import Charge, charge_round
from runner.rendezvous.etcd.client import (
    EtcdSession,
    EtcdUnreachable,
    LeaseNotFound,
    key_range,
    prefix_range,
)
from runner.rendezvous.etcd.connect import new_session
from runner.rendezvous.etcd.fence import Fence, Peer
from runner.rendezvous.etcd.joining import RoundJoiner
from runner.rendezvous.etcd.keys import JobKeys, check_node_id, dump, ledger_of, load, progress_of
from runner.rendezvous.etcd.lease import LeaseKeeper, revoke_ticket
from runner.rendezvous.etcd.lease_revoke import LeaseListener
from runner.rendezvous.etcd.monitor import RoundMonitor, share
from runner.rendezvous.etcd.round import RoundWaiter
from runner.rendezvous.node_ledger import Mark, NodeRecord, record_of

if TYPE_CHECKING:
    from collections.abc import Callable

    from structlog.typing import FilteringBoundLogger

    from runner.events import Event, StopRequested
    from runner.hangs import RankRecord
    from runner.outcomes import FailureClass

T = TypeVar("T")
FINAL_STATE_TTL_S = 3600
LEDGER_BUDGET_S = 2.0  # the node ledger's write, at most (runner/rendezvous/node_ledger.py)
LOST_PEER = "etcd"  # the PeerLost.node of a data loss
FENCE_PEERS = 3  # how many peers of the round the fence asks before it decides this node is the one cut off


class DataLost(Exception):
    """etcd lost the job's data while this node waited in a round (internal: next_round joins again)."""


class EtcdRendezvous:
    """Rendezvous through etcd v3. No I/O until open().

    One concern over 20 methods: the Rendezvous protocol's face over one etcd session. The protocol's parts are
    units of their own (joining.py, admission.py, budget.py, monitor.py, lease.py); what is left here is opening
    and closing them in order and routing each protocol call to its unit.
    """

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
        self._state: dict[str, object] = {}
        # Fields every live state record of this node carries (a hosted node's `member_at`: where its etcd member
        # would serve, so the growth of the members counts machines, not nodes: runner.rendezvous.etcd.members).
        self.always_published: dict[str, str] = {}
        # Endpoints known beyond the spec's before open() (a hosted node's members from its machine's memo): the
        # session tries them after the spec's.
        self.also_known: list[str] = []
        self._admitted = False  # open() passed the spec and closed-job checks: this node belongs to the job
        self._joiner: RoundJoiner | None = None  # once open(): this node's way into the rounds
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
        return opened(self._session)

    @property
    def joiner(self) -> RoundJoiner:
        """This node's way into the rounds (once open)."""
        return opened(self._joiner)

    @property
    def lease(self) -> LeaseKeeper:
        """This node's lease."""
        return opened(self._lease)

    async def open(self, events: asyncio.Queue[Event]) -> None:
        """Connect, grant the lease, check the spec and that the job is still open."""
        check_node_id(self._node)
        self._events = events
        self._session = new_session(self._spec, self._log, probe=False)  # the lease grant is the probe
        if self.also_known:
            self._session.learn(self.also_known)
        self._session.identity.on_loss(self._on_data_lost)
        await self._session.connect()
        self._lease = LeaseKeeper(self._session, self._spec.rendezvous.lease_ttl, self._log,
                                  job_intact=self._job_intact, on_data_lost=self._on_data_lost)
        if self._lease_listener is not None:
            self._lease.watch(self._lease_listener, revoke_ticket(self._spec, final=self._keys.final(self._node)))
        await self._lease.grant()
        self._joiner = RoundJoiner(self._session, self._lease, self._keys, self._spec, self._node, addr=self._addr,
                                   state_record=lambda update: self._state_record({**self._state, **update}),
                                   log=self._log)
        await self._admit()
        self._admitted = True

    def on_stop(self, sink: Callable[[StopRequested], None]) -> None:
        """`runner stop` (the control key's "stopping"), seen by this round's monitor, goes to `sink`."""
        self._stop_sink = sink
        if self._monitor is not None:
            self._monitor.stops = sink

    def learn(self, client_urls: list[str]) -> None:
        """Learn that etcd also serves at `client_urls` (a hosted etcd's members).

        The session fails over to them, and the guard's revoke ticket lists them: a dead agent's lease is revoked
        through any live member.
        """
        session = self.session
        before = session.endpoints
        session.learn(client_urls)
        if session.endpoints != before and self._lease is not None and self._lease_listener is not None:
            self._lease.watch(self._lease_listener, revoke_ticket(self._spec, final=self._keys.final(self._node),
                                                                  endpoints=session.endpoints))

    def on_lease(self, listener: LeaseListener) -> None:
        """Tell `listener` how to revoke this node's lease whenever it is granted or replaced (None: given up).

        The agent passes its guard's (runner.system.shepherd), so that a dead agent's lease is revoked at once.
        """
        self._lease_listener = listener
        if self._lease is not None:
            self._lease.watch(listener, revoke_ticket(self._spec, final=self._keys.final(self._node)))

    async def _admit(self) -> None:
        """Join the job (runner/rendezvous/etcd/admission.py): its epoch, and the round this node tries first."""
        admitted = await admit(self.session, self._keys, self._spec, restarts_known=self._restarts_known)
        self._epoch = admitted.epoch
        self.joiner.restart(admitted.round_hint)

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
        await self._admit()  # rounds counted from the new etcd's round key
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
                    last_port = self._result.master_port if self._result is not None else 0
                    result, since = await self._unless_lost(self.joiner.join(attempt, waiter, last_port))
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
            raise EtcdUnreachable(msg, fix="check that etcd is up and reachable from this node") from None
        except Exception as exc:  # boundary: the agent must get a RendezvousError, whatever failed below
            self._log.warning("etcd_call_failed", call=what, error=repr(exc))
            msg = f"etcd {what} failed: {type(exc).__name__}: {exc}"
            raise RendezvousError(msg) from exc

    async def charge_restart(
        self, max_restarts: int, failure_class: FailureClass | None = None, class_limit: int | None = None, *,
        charged: bool = True, defer: float = 0.0,
    ) -> RoundCharge:
        """Charge the failure of the current round once, job-wide: the round's charge, as its first node decided it.

        A class's count is one more key, `restarts/<class>`, moved in the same transaction as the job's.
        """
        return await self._bounded("charge_restart",
                                   self._charge(max_restarts, failure_class, class_limit, charged, defer))

    async def _charge(self, max_restarts: int, cls: FailureClass | None, class_limit: int | None, job_wide: bool,
                      defer: float = 0.0) -> RoundCharge:
        await self._recover()
        r = self._result.round if self._result else -1
        done = await charge_round(self.session, self._keys, self._node, r, Charge(max_restarts, cls, class_limit,
                                                                                 job_wide), defer=defer, log=self._log)
        self._restarts_known = max(self._restarts_known, done.seen)
        return done.charge

    async def share_hang(self, local: list[RankRecord], *, timeout: float) -> list[RankRecord]:
        """Every member's flight-recorder records of this round's hang (runner/rendezvous/etcd/monitor.py `share`)."""
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

    async def stopping(self) -> None:
        """An etcd this node does not run outlives it: the others hear of its going as of any node's."""

    def recovering(self) -> bool:
        """An etcd this node does not run mends itself: nothing to say (the hosted backend knows its own)."""
        return False

    async def progress_of_nodes(self) -> dict[str, float]:
        """Every live node's published `progress_at` ({} when etcd does not answer: the caller has only its own)."""
        try:
            _, (kvs,) = await self._bounded("progress_of_nodes", self.session.call(
                lambda c: c.snapshot([prefix_range(self._keys.states)])))
        except RendezvousError as e:
            self._log.warning("progress_of_nodes_unread", error=e.message)
            return {}
        return progress_of(kvs)

    async def publish(self, state: dict[str, object]) -> None:
        """Put this node's live state (plus node, round, time) on the lease; bounded by the connect timeout.

        Before open() (the agent ended in INIT: no etcd binary, a refused spec) there is nothing to publish to: the
        state is only remembered (status.json has it), not a warning on top of the error that ended the run.
        """
        if self._session is None or self.fenced is not None:
            self._state_record(state)
            return
        await self._bounded("publish", self._publish(state))

    async def _publish(self, state: dict[str, object]) -> None:
        record = self._state_record(state)
        if not self._admitted or self._lost is not None:
            return  # refused, never connected, or etcd lost the job (re-admission publishes again)
        try:
            await self.lease.put(self._keys.state(self._node), dump(record))
        except LeaseNotFound:
            if self._lost is None:
                raise

    def _state_record(self, state: dict[str, object]) -> dict[str, object]:
        """`state` plus node, round, time; remembered as this node's last state."""
        r = self._result.round if self._result else None
        self._state = {**state, **self.always_published, "node": self._node, "round": r, "time": time.time()}
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
        """The peers the fence asks: the round's first FENCE_PEERS nodes but this one.

        The master node at the master address, the others at their join records' addresses. Several, not one: a
        lost host is often the master's, and etcd's leader with it (a hosted rendezvous's first node); a survivor
        that asked only it would take the election's silence for its own cut. Read and resolved now, while etcd and
        the name service answer; none for a round of one node. Any port does (a refused connection proves the
        path): the round's master port.
        """
        chosen = [n for n in result.nodes if n != self._node][:FENCE_PEERS]
        addrs = await self._peer_addrs(result, [n for n in chosen if n != result.nodes[0]])
        addrs[result.nodes[0]] = result.master_addr
        return [Peer(node, await resolved(addrs[node], self._log), result.master_port) for node in chosen
                if node in addrs]

    async def _peer_addrs(self, result: RendezvousResult, nodes: list[str]) -> dict[str, str]:
        """The addresses in `nodes`' join records of this round, read in one call ({} with a warning when not)."""
        if not nodes:
            return {}
        try:
            _, found = await self._bounded("fence_peer", self.session.call(
                lambda c: c.snapshot([key_range(self._keys.join(result.round, n)) for n in nodes])))
        except RendezvousError as e:
            self._log.warning("fence_peer_unknown", nodes=nodes, error=str(e))
            return {}
        addrs = {}
        for node, kvs in zip(nodes, found, strict=True):
            record = load(kvs[0].value) if kvs else None
            addr = record.get("addr") if isinstance(record, dict) else None
            if isinstance(addr, str):
                addrs[node] = addr
        return addrs

    def give_up(self, reason: str) -> None:
        """The rendezvous is gone (a hosted one whose quorum was lost) and the node ends: nothing more goes to etcd.

        Unlike a fence, nothing is put on the events queue: the caller is already ending this node.
        """
        if self.fenced is None:
            self.fenced = reason
            for call in list(self._side_calls):
                call.cancel()

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


def opened(part: T | None) -> T:
    """A part open() makes (session, lease, joiner); RendezvousError before open()."""
    if part is None:
        msg = "EtcdRendezvous.open() was not called"
        raise RendezvousError(msg)
    return part
