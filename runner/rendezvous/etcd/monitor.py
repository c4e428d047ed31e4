"""While a round runs: one watch that turns etcd changes into agent events.

- a member's join key vanishes (lease expired) without a clean final state -> PeerLost
- a member publishes state FAILED for this round -> PeerLost
- a node joins the next round while this one is below max nodes -> MembershipChanged
- the control key says "stopping" -> StopRequested(signum=0)
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from runner.errors import RendezvousError
from runner.events import MembershipChanged, PeerLost, StopRequested
from runner.rendezvous.base import RendezvousResult
from runner.rendezvous.etcd.client import EtcdSession, cancel_task, key_range, prefix_end
from runner.rendezvous.etcd.keys import JobKeys, load
from runner.rendezvous.etcd.watch import PUT, Event, Watch

RETRY_S = 1.0


class RoundMonitor:
    """Watches one running round; events go to the agent's queue, each at most once."""

    def __init__(self, session: EtcdSession, keys: JobKeys, result: RendezvousResult, max_nodes: int,
                 events: asyncio.Queue[Any] | None, log: Any = None, *, since: int = 0) -> None:
        self._s, self._k, self._res, self._max = session, keys, result, max_nodes
        self._since = since  # the leader's view revision (record "rev"): replay changes from there
        self._events = events
        self._log = log or structlog.get_logger("runner.rendezvous.etcd.backend")
        self._members = set(result.nodes) - {result.node}
        self._states: dict[str, Any] = {}
        self._waiting: set[str] = set()
        self._reported: set[tuple[str, str]] = set()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Watch from the revision at which the round's leader saw the joins.

        What changed since (a member gone, a FAILED state, a next-round join, a stop) is replayed first, then
        followed. Every relevant change comes after that revision: a node gone before it is not a member, states
        name this round and next-round joins exist only once the result was written. O(1) reads per node.
        """
        r, k = self._res.round, self._k
        ranges = [(k.states, prefix_end(k.states)), (k.round_nodes(r), prefix_end(k.round_nodes(r))),
                  (k.round_nodes(r + 1), prefix_end(k.round_nodes(r + 1))), (k.control, None)]
        if not self._since:  # no leader revision (record from an older runner): from now, after a read
            rev, (control,) = await self._s.call(lambda c: c.snapshot([key_range(k.control)]))
            if control:
                self._on_control(load(control[0].value))
            self._since = rev + 1
        watch = await Watch(self._s, ranges, self._since, self._log).start()
        self._task = asyncio.get_running_loop().create_task(self._run(watch), name="etcd-round-monitor")

    async def _run(self, watch: Watch) -> None:
        register = False
        try:
            while True:
                try:
                    if register:
                        await watch.start()  # resumes from the last revision seen
                        register = False
                    await self._dispatch(await watch.next())
                except RendezvousError as exc:  # etcd unreachable past connect_timeout: retry
                    self._log.warning("etcd_monitor_retry", error=exc.message)
                    await asyncio.sleep(RETRY_S)
                    register = True
        finally:
            await watch.cancel()

    async def _dispatch(self, ev: Event) -> None:
        key, put, r = ev.key, ev.kind == PUT, self._res.round
        if key == self._k.control and put:
            self._on_control(load(ev.value))
        elif key.startswith(self._k.states) and put:
            self._on_state(JobKeys.leaf(key), load(ev.value))
        elif key.startswith(self._k.round_nodes(r)) and not put:
            node = JobKeys.leaf(key)
            last = self._states.get(node) or {}
            if last.get("outcome") != "succeeded" and node in self._members and not await self._stopping():
                self._lost(node, "lease expired or node left" if not last.get("outcome")
                           else f"node ended ({last['outcome']})")
        elif key.startswith(self._k.round_nodes(r + 1)) and put:
            self._on_waiting(JobKeys.leaf(key))

    async def _stopping(self) -> bool:
        """Whether the job is being stopped (the control key says so; then StopRequested is emitted).

        Read when a member leaves: the watches of the control key and of the join keys are separate, so a node
        leaving because of a stop may be seen before the stop itself. The stop, not a lost peer, is then the news.
        """
        try:
            raw = await self._s.call(lambda c: c.get(self._k.control))
        except RendezvousError:
            return False
        control = load(raw.value) if raw is not None else None
        self._on_control(control)
        return isinstance(control, dict) and control.get("state") == "stopping"

    def _on_state(self, node: str, state: Any) -> None:
        if not isinstance(state, dict):
            return
        self._states[node] = state
        if state.get("state") == "FAILED" and state.get("round") == self._res.round:
            self._lost(node, "reported FAILED")

    def _on_waiting(self, node: str) -> None:
        if node in self._members or node == self._res.node or node in self._waiting:
            return
        self._waiting.add(node)
        if self._res.group_world_size < self._max:
            self._emit(("waiting", node), MembershipChanged(tuple(sorted(self._waiting))))

    def _on_control(self, control: Any) -> None:
        if isinstance(control, dict) and control.get("state") == "stopping":
            self._emit(("stop", ""), StopRequested(signum=0, graceful=bool(control.get("graceful", True))))

    def _lost(self, node: str, why: str) -> None:
        if node in self._members:
            self._emit(("lost", node), PeerLost(node, why))

    def _emit(self, tag: tuple[str, str], event: Any) -> None:
        if tag in self._reported or self._events is None:
            return
        self._reported.add(tag)
        self._log.info("rendezvous_event", kind=type(event).__name__, detail=tag[1], round=self._res.round)
        self._events.put_nowait(event)

    async def stop(self) -> None:
        """Stop watching."""
        if self._task is not None:
            await cancel_task(self._task)
            self._task = None
