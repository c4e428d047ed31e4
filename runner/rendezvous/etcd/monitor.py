"""While a round runs: one watch per node that turns etcd changes into agent events, with O(1) events per node.

The round's members form a ring in group-rank order, and each watches the live state of the next one only (the
state key is on that node's lease, so it vanishes with the node):
- the watched node's state vanishes without a clean final state, or says FAILED for this round, or is put by another
  run of the node (one started again under its name while this run's lease still ran: its state key is then on the
  new run's lease and never vanishes; a state naming no round, or another, is checked against the lease of the
  member's join record of this round, one read) -> PeerLost here,
  and the watcher writes the round's `lost` key once (a transaction: the first finder wins); a FAILED state that
  names the peer it failed of (`lost`) is a waiter's: the PeerLost names that peer, the culprit;
- the round's `lost` key (in JobKeys.news, watched by every member) -> PeerLost for the node it names;
- the round's `next` key names a node that opened the next round without being a member, while this round is
  below max nodes -> MembershipChanged (a newcomer opens the next round: it finds this one closed);
- the control key says "stopping" -> StopRequested(signum=0).
A watched node that ended cleanly (succeeded) is skipped: the watcher moves on to the member after it. Whatever set
of members is lost, a still-running member watches one of them, so a loss is seen as before (when the lease
expires, or at once when the node's guard revokes it) plus one write and one event; every node receives O(1)
events per round instead of one per member (states of every member, published on every transition).

Also here: the LostRecord a member found lost is read as, and a hang's records shared by every member (`share`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import structlog

from runner.errors import RendezvousError
from runner.events import PEER_REPORTED, HangQuery, MembershipChanged, PeerLost, StopRequested
from runner.hangs import Answer, RankRecord, from_wire, to_wire
from runner.json_types import JSONObject
from runner.outcomes import FailureClass
from runner.rendezvous.base import RendezvousResult
from runner.rendezvous.etcd.client import EtcdSession, absent, cancel_task, key_range, prefix_range, put_op
from runner.rendezvous.etcd.keys import JobKeys, dump, load
from runner.rendezvous.etcd.watch import PUT, Event, Watch

if TYPE_CHECKING:
    from collections.abc import Callable

    from structlog.typing import FilteringBoundLogger

    from runner.events import Event as AgentEvent

RETRY_S = 1.0
REPLACED = "started again under its name: its run in this round is gone"  # why, for a member another run replaced
E = TypeVar("E", HangQuery, MembershipChanged, PeerLost, StopRequested)  # what a monitor reports


# A member found lost, as etcd holds it: the round's `lost` key, or the `lost` field of a waiter's FAILED state.
#
# Both are written by runner (RoundMonitor writes the key; agent/services.py publishes the field) and read by every
# member, so both are input: `parse_lost` turns one into a LostRecord, its texts bounded to one line, or None when the
# value is not one (then it is ignored, as before).

CAUSE_CHARS = 300  # a published reason or root cause, at most (what etcd holds is input: bounded here)


@dataclass(frozen=True)
class LostRecord:
    """Who was found lost, why (node_lost's words), the member that found it, and the lost one's root cause."""

    node: str
    why: str
    by: str = ""
    cause: str = ""
    failure_class: FailureClass | None = None  # the lost one's own failure's class, when it published one

    def record(self) -> JSONObject:
        """The JSON record etcd holds (no `by`, `cause` or `class` when empty)."""
        return {"node": self.node, "why": self.why, **({"by": self.by} if self.by else {}),
                **({"cause": self.cause} if self.cause else {}),
                **({"class": self.failure_class.value} if self.failure_class is not None else {})}


def one_line(value: object) -> str:
    """A text of the record as one bounded line ('' for anything that is not text)."""
    if not isinstance(value, str):
        return ""
    line = value.splitlines()[0] if value else ""
    return line[:CAUSE_CHARS]


def cause_of(record: Mapping[str, object]) -> str:
    """The root cause a peer published (its FAILED state's, or a `lost` record's `cause`): one bounded line, or ''."""
    return one_line(record.get("cause"))


CLASSES = {c.value: c for c in FailureClass}


def class_of(record: Mapping[str, object]) -> FailureClass | None:
    """The failure class a peer published with its cause (`class`), or None (none, or not a class's name)."""
    value = record.get("class")
    return CLASSES.get(value) if isinstance(value, str) else None


def parse_lost(value: object, *, why: str = "") -> LostRecord | None:
    """The LostRecord `value` holds (None when it names no node as text; `why` when it gives none), never raising."""
    if not isinstance(value, dict):
        return None
    node = value.get("node")
    if not isinstance(node, str):
        return None
    return LostRecord(node, one_line(value.get("why")) or why, one_line(value.get("by")), cause_of(value),
                      class_of(value))


class RoundMonitor:
    """Watches one running round; events go to the agent's queue, each at most once.

    One concern over 20 methods: one watch and what each of its keys means (the ring's next member, the round's
    news, the control key), sharing the set of events already reported.
    """

    def __init__(self, session: EtcdSession, keys: JobKeys, result: RendezvousResult, max_nodes: int,
                 events: asyncio.Queue[AgentEvent] | None, log: FilteringBoundLogger | None = None, *,
                 since: int = 0) -> None:
        self._s, self._k, self._res, self._max = session, keys, result, max_nodes
        self._since = since  # the leader's view revision (record "rev"): replay changes from there
        self._events = events
        self.stops: Callable[[StopRequested], None] | None = None  # where `runner stop` goes (None: the queue)
        self._log = log or structlog.get_logger("runner.rendezvous.etcd.backend")
        self._watched = result.group_rank  # ring position of the member watched (itself: nobody)
        self._state: JSONObject = {}  # the watched member's last live state
        self._run_lease = 0  # the lease the watched member's states of this round came on: its run's (0: none yet)
        self._finding: LostRecord | None = None  # a loss found here whose `lost` key is still to be written
        self._reported: set[tuple[str, str]] = set()
        self._task: asyncio.Task[None] | None = None
        self._advance()

    @property
    def watched(self) -> str | None:
        """The member whose live state this node watches (None: no other member is left)."""
        nodes = self._res.nodes
        return None if not nodes or self._watched == self._res.group_rank else nodes[self._watched]

    def _advance(self) -> None:
        """Watch the next member in the ring (none once it is this node again)."""
        self._watched = (self._watched + 1) % max(1, len(self._res.nodes))
        self._state, self._run_lease = {}, 0

    def _ranges(self) -> list[tuple[bytes, bytes | None]]:
        ranges: list[tuple[bytes, bytes | None]] = [self._k.news()]
        if self.watched is not None:
            ranges.append((self._k.state(self.watched), None))
        return ranges

    async def start(self, watch: Watch | None = None) -> None:
        """Watch from the revision at which the round's leader saw the joins.

        What changed since (a member gone, a FAILED state, a newcomer, a stop) is replayed first, then followed.
        Every relevant change comes after that revision: a node gone before it is not a member, states name this
        round and the next round is opened only once the result was written. No read at all.

        `watch`: the stream this node waited for the result on (the job's news, followed since before the
        result): only the watched member's state is added to it, so a node keeps one stream.
        """
        k = self._k
        if not self._since:  # no leader revision (record from an older runner): from now, after a read
            rev, (control,) = await self._s.call(lambda c: c.snapshot([key_range(k.control)]))
            if control:
                self._on_control(load(control[0].value))
            self._since = rev + 1
        if watch is None:
            watch = await Watch(self._s, self._ranges(), self._since, self._log).start()
        elif self.watched is not None:
            await watch.add(k.state(self.watched), None, self._since)
        self._task = asyncio.get_running_loop().create_task(self._run(watch), name="etcd-round-monitor")

    async def _run(self, watch: Watch) -> None:
        register = False
        try:
            while True:
                try:
                    if register:
                        await watch.start()  # resumes from the last revision seen
                        register = False
                    await self._write_finding()
                    ev = await watch.next()
                    if await self._dispatch(ev):
                        await self._move_on(watch, ev.mod_revision)
                except RendezvousError as exc:  # etcd unreachable past connect_timeout: retry
                    self._log.warning("etcd_monitor_retry", error=exc.message)
                    await asyncio.sleep(RETRY_S)
                    register = True
        finally:
            await watch.cancel()

    async def _move_on(self, watch: Watch, revision: int) -> None:
        """The watched member left cleanly at `revision`: watch the next one still running from there on."""
        while (node := self.watched) is not None:
            last = await self._ended(node)
            if last is None or not await self._gone(node, last):
                break  # running (its end, if any, is among the changes replayed), or found lost
        if self.watched is not None:
            await watch.add(self._k.state(self.watched), None, revision + 1)

    async def _ended(self, node: str) -> JSONObject | None:
        """None while `node` has a live state; else its final state ({} when it left none)."""
        k = self._k
        _, (state, final) = await self._s.call(lambda c: c.snapshot([key_range(k.state(node)),
                                                                      key_range(k.final(node))]))
        if state:
            return None
        last = load(final[0].value) if final else None
        return last if isinstance(last, dict) else {}

    async def _dispatch(self, ev: Event) -> bool:
        """Handle one event; True when the watched member changed (the watch must be made again)."""
        k, put = self._k, ev.kind == PUT
        node = self.watched
        if ev.key == k.control:
            if put:
                self._on_control(load(ev.value))
        elif node is not None and ev.key == k.state(node):
            return await self._on_watched(node, load(ev.value) if put else None, ev.lease)
        elif put:
            self._on_news(ev.key, load(ev.value))
        return False

    async def _on_watched(self, node: str, state: object, lease: int = 0) -> bool:
        """The watched member's live state changed; True when it ended cleanly (moved on).

        `state` None: it vanished; `lease`: the lease it was put on.
        """
        if state is None:
            last = self._state
            if last.get("outcome") != "succeeded":  # its last update may not have reached this watch (a resumed
                final = await self._ended(node)  # one): a member writes its final state before it lets go
                last = final if final and final.get("outcome") == "succeeded" else last
            return await self._gone(node, last)
        if isinstance(state, dict):
            if state.get("round") == self._res.round and lease:
                self._run_lease = lease
            # A state on the lease of the member's states of this round is its run's, whatever round it names (a
            # run leaving names none when its join record is already gone: CI read a SIGTERMed peer as replaced);
            # another run of the node has another lease.
            foreign = state.get("round") != self._res.round and ("lost", node) not in self._reported and not (
                lease and lease == self._run_lease)  # once: no re-read
            if foreign and await self._replaced(node, lease):
                self._found(node, REPLACED)
                return False
            self._state = state
            if state.get("state") == "FAILED" and state.get("round") == self._res.round:
                self._found(*self._culprit(node, state))
        return False

    async def _replaced(self, node: str, lease: int) -> bool:
        """Whether a state of `node` put on `lease` comes from another run of it than the one in this round.

        A member publishes states of this round once it has the result; one that names no round (a new agent's first
        state: its join elsewhere), or another, is rare, and read against the member's join record of this round,
        which is on the lease the member joined on and was written before the round closed (at or before the
        leader's revision): gone, on another lease, or written since (a new run that joined the closed round, then
        left it), it is not the same run.
        """
        _, (joined,) = await self._s.call(lambda c: c.snapshot([key_range(self._k.join(self._res.round, node))]))
        kv = joined[0] if joined else None
        return bool(lease) and (kv is None or int(kv.lease) != lease or int(kv.mod_revision) > self._since)

    def _culprit(self, node: str, state: JSONObject) -> tuple[str, str, str, FailureClass | None]:
        """(node, why, cause, class) of a member's FAILED state: the peer it failed of, if it says so, else the member.

        A member that failed because it lost a peer is a waiter: the loss is named after the lost peer, as on the
        member that found it (with that peer's class: a stopped node is preempted, not lost).
        """
        lost = parse_lost(state.get("lost"))
        # A `lost` naming this node (alive: no news to itself) or a non-member: the member's own failure is the news.
        if lost is not None and lost.why and lost.node in self._res.nodes and lost.node != self._res.node:
            return lost.node, lost.why, lost.cause, lost.failure_class
        return node, PEER_REPORTED, cause_of(state), class_of(state)

    def _on_news(self, key: bytes, value: object) -> None:
        """An annex key was written (other rounds', and this round's leader and result, are no news here)."""
        r = self._res.round
        if key == self._k.lost(r) and (lost := parse_lost(value, why="lost")) is not None:
            self._lost(lost.node, lost.why, lost.cause, lost.failure_class)
        elif key == self._k.hang(r) and isinstance(value, dict) and value.get("by") != self._res.node:
            self._emit(("hang", ""), HangQuery(str(value.get("by"))[:200]))
        elif key == self._k.opened(r):
            self._on_opened(value)

    async def _gone(self, node: str, last: JSONObject) -> bool:
        """The watched member's state vanished, `last` its last state; True when it ended cleanly (moved on)."""
        outcome = last.get("outcome")
        if outcome == "succeeded":
            self._advance()
            return True
        if not await self._stopping():
            self._found(node, f"node ended ({outcome})" if outcome else "lease expired or node left")
        return False

    async def _stopping(self) -> bool:
        """Whether the job is being stopped (the control key says so; then StopRequested is emitted).

        Read when a member leaves: the watches of the control key and of the member's state are separate, so a
        node leaving because of a stop may be seen before the stop itself. The stop, not a lost peer, is the news.
        """
        try:
            raw = await self._s.call(lambda c: c.get(self._k.control))
        except RendezvousError:
            return False
        control = load(raw.value) if raw is not None else None
        self._on_control(control)
        return isinstance(control, dict) and control.get("state") == "stopping"

    def _found(self, node: str, why: str, cause: str = "", cls: FailureClass | None = None) -> None:
        """This node found a member lost: PeerLost here, and the round's `lost` key for every other member."""
        self._lost(node, why, cause, cls)
        if self._finding is None:
            self._finding = LostRecord(node, why, self._res.node, cause, cls)

    async def _write_finding(self) -> None:
        """Write the round's `lost` key for the loss found here, unless a member wrote one already."""
        if self._finding is None:
            return
        key, value = self._k.lost(self._res.round), dump(self._finding.record())
        await self._s.call(lambda c: c.txn([absent(key)], [put_op(key, value)]))
        self._finding = None

    def _on_opened(self, opener: object) -> None:
        if not isinstance(opener, str) or opener == self._res.node or opener in self._res.nodes:
            return  # a member moving on to the next round: its own failure or stop is the news
        if self._res.group_world_size < self._max:
            self._emit(("waiting", opener), MembershipChanged((opener,)))

    def _on_control(self, control: object) -> None:
        if isinstance(control, dict) and control.get("state") == "stopping":
            why, by = control.get("why"), control.get("by")  # a stop written by a node, not `runner stop`
            reason = f"stop requested by node {by}: {why}" if isinstance(why, str) and why and by else ""
            stop = StopRequested(signum=0, graceful=bool(control.get("graceful", True)), reason=reason[:300])
            self._emit(("stop", ""), stop, self.stops)

    def _lost(self, node: str, why: str, cause: str = "", cls: FailureClass | None = None) -> None:
        if node != self._res.node and node in self._res.nodes:
            self._emit(("lost", node), PeerLost(node, why, cause, cls))

    def _emit(self, tag: tuple[str, str], event: E, sink: Callable[[E], None] | None = None) -> None:
        """`event` once per tag, to `sink` if given, else onto the events queue."""
        deliver = sink or (self._events.put_nowait if self._events is not None else None)
        if tag in self._reported or deliver is None:
            return
        self._reported.add(tag)
        self._log.info("rendezvous_event", kind=type(event).__name__, detail=tag[1], round=self._res.round)
        deliver(event)

    async def stop(self) -> None:
        """Stop watching."""
        if self._task is not None:
            await cancel_task(self._task)
            self._task = None


# A hang's records from every node of the round, through etcd (docs/hangs.md).
#
# The node that finds a hang writes the round's `hang` key (an annex of the control key: every member's news watch
# carries it, RoundMonitor above turns it into a HangQuery event), then its own answer. Every member
# that hears it reads its own workers' flight recorders and writes its answer under `rounds/<r>/hang/<node>`. Each
# of them then reads the answers until every member of the round answered, or the bound passes: a node that did not
# answer is shown as such (its ranks `silent`), and the analysis goes on with what came. Every node analyses the
# same answers, so every node names the same culprit. Answers are bounded (runner.hangs.to_wire) and read back
# validated (runner.hangs.from_wire).

POLL_S = 0.1
MAX_ANSWER_BYTES = 1 << 20  # one node's answer (etcd's default request limit is 1.5 MiB)


async def share(session: EtcdSession, keys: JobKeys, result: RendezvousResult, local: list[RankRecord], *,
                timeout: float, log: FilteringBoundLogger) -> list[RankRecord]:
    """Ask every member (once per round), give this node's records, and return every member's within `timeout`.

    etcd unreachable: this node's records alone (logged); never raises for etcd, never waits past `timeout`.
    """
    r, me = result.round, result.node
    answer = dump(to_wire(local))
    if len(answer) > MAX_ANSWER_BYTES:
        answer = dump(to_wire([RankRecord(x.rank, x.node, x.answer, x.calls[-8:], x.detail) for x in local]))
    ask, mine = keys.hang(r), keys.hang_answer(r, me)
    answers: dict[str, list[RankRecord]] = {me: local}
    try:
        async with asyncio.timeout(timeout):
            await session.call(lambda c: c.txn([absent(ask)], [put_op(ask, dump({"by": me})), put_op(mine, answer)],
                                               [put_op(mine, answer)]), budget=timeout)
            while not all(n in answers for n in result.nodes):
                _, (kvs,) = await session.call(lambda c: c.snapshot([prefix_range(keys.hang_answers(r))]),
                                               budget=timeout)
                for kv in kvs:
                    node = JobKeys.leaf(kv.key)
                    if node in result.nodes and node != me and len(kv.value) <= MAX_ANSWER_BYTES:
                        answers[node] = [x for x in from_wire(load(kv.value)) if x.node == node]
                if not all(n in answers for n in result.nodes):
                    await asyncio.sleep(POLL_S)
    except (TimeoutError, RendezvousError) as e:
        log.warning("hang_answers_incomplete", round=r, answered=sorted(answers),
                    error=str(e) or f"not every node answered within {timeout:g} s")
    return [x for n in result.nodes for x in answers.get(n, silent(result, n))]


def silent(result: RendezvousResult, node: str) -> list[RankRecord]:
    """The ranks of a member that did not answer (ranks are group rank * nproc_per_node + local rank)."""
    k = result.nodes.index(node)
    return [RankRecord(k * result.nproc_per_node + i, node, Answer.SILENT, detail="its node did not answer")
            for i in range(result.nproc_per_node)]
