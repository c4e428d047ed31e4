"""The rendezvous protocol every backend implements, and the result of one round."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from runner.outcomes import FailureClass

if TYPE_CHECKING:
    from collections.abc import Callable

    from runner.events import Event, StopRequested
    from runner.hangs import RankRecord
    from runner.rendezvous.node_ledger import Mark, NodeRecord


@dataclass(frozen=True)
class RendezvousResult:
    """What one completed round tells this node."""

    round: int
    node: str  # this node's id
    group_rank: int  # this node's rank among nodes (0 = master node)
    group_world_size: int  # number of nodes in the round
    nproc_per_node: int
    master_addr: str
    master_port: int
    nodes: tuple[str, ...] = ()  # node ids in group-rank order
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        """Total number of workers in the job."""
        return self.group_world_size * self.nproc_per_node

    def global_rank(self, local_rank: int) -> int:
        """Global rank of this node's worker `local_rank`."""
        return self.group_rank * self.nproc_per_node + local_rank


@dataclass(frozen=True)
class RoundCharge:
    """A round's restart charge as the first node to charge it decided it, for every node of the round.

    `count`: the job's restarts after it (None: refused: a budget spent, or a node stopped the round).
    `failure_class`: the class it was charged under (None: none: a membership change's claim, a node's refusal).
    `charged`: whether restart.max_restarts paid for it; None when the charge does not say (a marker of an older
    runner): the spec's budget for the class decides (runner/core/restart_policy.py `counted_as`).
    `by`: the node that charged it ("" when not known).
    """

    count: int | None
    failure_class: FailureClass | None = None
    charged: bool | None = True
    by: str = ""


class Rendezvous(Protocol):
    """A rendezvous backend. Methods are called only from the agent's event loop.

    Events the backend observes while the job runs (a peer lost, a node waiting to join, a stop request)
    are put on the `events` queue given to `open`, as instances of runner.events classes.
    """

    async def open(self, events: asyncio.Queue[Event]) -> None:
        """Connect (retrying up to the connect timeout) and start background watches."""

    def on_stop(self, sink: Callable[[StopRequested], None]) -> None:
        """Give the job-wide stop requests this backend sees (`runner stop` through etcd) to `sink`.

        Not to the events queue: `sink` is the job's stop scope, so the stop reaches the job above replica groups,
        once.
        """

    async def next_round(self, attempt: int) -> RendezvousResult:
        """Join the next round and wait until it closes. Raises RendezvousTimeout or JobClosed."""

    async def charge_restart(
        self, max_restarts: int, failure_class: FailureClass | None = None, class_limit: int | None = None, *,
        charged: bool = True, defer: float = 0.0,
    ) -> RoundCharge:
        """Charge one restart to the job-wide budget: the round's charge (its count None if the budget is spent).

        With `failure_class`, the restart also counts for that class, job-wide, and is refused once `class_limit`
        of them were used (None: no limit); `charged=False` leaves the job-wide count as it is (the count returned
        is the current one). The first node to charge a round decides for all: the charge returned is that node's,
        its class and whether it was charged included, whatever this node asked.
        `defer`: seconds to wait for a peer's own charge of this round first (a peer that reported its own
        failure charges it with its own class; the one that merely saw it should not decide for it).
        """

    async def share_hang(self, local: list[RankRecord], *, timeout: float) -> list[RankRecord]:
        """This node's flight-recorder records given to the round's other nodes, and theirs (docs/hangs.md).

        Every rank of the round within `timeout` (a node that did not answer: its ranks `silent`); one node: `local`.
        Never raises: an unreachable etcd leaves this node's own records.
        """

    async def note_node(self, mark: Mark | None) -> None:
        """Mark this node seen in the node ledger, with one failure of its own if given (docs/hangs.md).

        Never raises: a ledger that cannot be written is a warning.
        """

    async def node_ledger(self) -> dict[str, NodeRecord]:
        """Every node's ledger record ({} when it cannot be read)."""

    async def publish(self, state: dict[str, object]) -> None:
        """Publish this node's live state (machine state, attempt, worker pids/exit codes) for `runner status`."""

    def recovering(self) -> bool:
        """Whether the rendezvous is mending its own store now (a hosted etcd's founder going on alone).

        News of a lost peer, which the store carries, may then come later than a lease_ttl (runner.states.running).
        """

    async def progress_of_nodes(self) -> dict[str, float]:
        """When each node's workers last made progress, as the nodes published it (`progress_at`, epoch seconds).

        The stall detector of a node that sees none of its own ranks move asks before it acts: another node's ranks
        may be working (rank 0 writing a checkpoint) while this node's wait for them. {} when it cannot be read.
        """

    async def stopping(self) -> None:
        """This node was stopped by a signal of its own, and stops its workers next.

        A rendezvous that leaves with this node (a hosted etcd it alone holds) asks the other nodes to stop now,
        before its workers stop: they would otherwise read its going as a lost peer. Never raises; bounded by the
        caller.
        """

    async def close(self, outcome: str, *, alone: bool = False) -> None:
        """Leave the rendezvous; `outcome` is the job's final outcome as this node saw it.

        `alone`: only this node leaves (kept out of the next round, or given up on its own health) while the others
        go on; its outcome never closes the job, whatever its rank.
        """
