"""The embedded `local` backend: one node, no external service.

A fresh free MASTER_PORT every round, unless the spec fixes one (as torchrun's --master-port does).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from runner.rendezvous.base import RendezvousResult, RoundCharge
from runner.rendezvous.node_ledger import LocalLedger, Mark, NodeRecord
from runner.rendezvous.ports import free_port
from runner.system.soft_io import warn_once

if TYPE_CHECKING:
    from collections.abc import Callable

    from runner.events import Event, StopRequested
    from runner.hangs import RankRecord
    from runner.outcomes import FailureClass


class LocalRendezvous:
    """Every round completes at once with this node alone; restarts are counted in memory."""

    def __init__(
        self, node: str, nproc_per_node: int, master_addr: str = "127.0.0.1", master_port: int | None = None,
        ledger: LocalLedger | None = None,
    ) -> None:
        self.node = node
        self.ledger = ledger  # the node ledger's file (none for a replica group's own rendezvous)
        self.master_port = master_port  # fixed (torchrun's --master-port), else a free one every round
        self.nproc_per_node = nproc_per_node
        self.master_addr = master_addr
        self.restarts = 0
        self.class_restarts: dict[FailureClass, int] = {}  # restarts charged per failure class
        self.state: dict[str, object] = {}
        self._last_port: int | None = None

    async def open(self, events: asyncio.Queue[Event]) -> None:
        """Nothing to connect to."""

    def on_stop(self, sink: Callable[[StopRequested], None]) -> None:
        """Never called back: one node's `runner stop` signals its agent (runner.runs.control)."""

    async def next_round(self, attempt: int) -> RendezvousResult:
        """Round `attempt`: this node is group rank 0 on a port not used by the previous round."""
        port = self.master_port or free_port(self.master_addr, avoid=(self._last_port,) if self._last_port else ())
        self._last_port = port
        return RendezvousResult(
            round=attempt,
            node=self.node,
            group_rank=0,
            group_world_size=1,
            nproc_per_node=self.nproc_per_node,
            master_addr=self.master_addr,
            master_port=port,
            nodes=(self.node,),
        )

    async def charge_restart(
        self, max_restarts: int, failure_class: FailureClass | None = None, class_limit: int | None = None, *,
        charged: bool = True, defer: float = 0.0,  # noqa: ARG002 - moot on one node: there is no peer to wait for
    ) -> RoundCharge:
        """One more restart (count None when max_restarts, if `charged`, or the class's limit are used up).

        The charge is this node's own: there is no other node to decide the round, and `defer` is moot.
        """
        used = self.class_restarts.get(failure_class, 0) if failure_class is not None else 0
        if (charged and self.restarts >= max_restarts) or (class_limit is not None and used >= class_limit):
            return RoundCharge(None, failure_class, charged, self.node)
        if failure_class is not None:
            self.class_restarts[failure_class] = used + 1
        if charged:
            self.restarts += 1
        return RoundCharge(self.restarts, failure_class, charged, self.node)

    async def share_hang(self, local: list[RankRecord], *, timeout: float) -> list[RankRecord]:  # noqa: ARG002
        """One node: its own records are every record."""
        return local

    async def note_node(self, mark: Mark | None) -> None:
        """Into the ledger's file (a warning when the state folder refuses it)."""
        if self.ledger is None:
            return
        try:
            self.ledger.note(self.node, mark)
        except OSError as e:
            warn_once("node_ledger_write_failed", self.ledger.path, e)

    async def node_ledger(self) -> dict[str, NodeRecord]:
        """From the ledger's file."""
        return self.ledger.read() if self.ledger is not None else {}

    async def publish(self, state: dict[str, object]) -> None:
        """Keep the latest state (the agent also writes it to <run dir>/status.json)."""
        self.state = state

    async def stopping(self) -> None:
        """No other node to tell."""

    def recovering(self) -> bool:
        """No store to mend."""
        return False

    async def progress_of_nodes(self) -> dict[str, float]:
        """One node: no other node's progress to know of."""
        return {}

    async def close(self, outcome: str, *, alone: bool = False) -> None:
        """Nothing to leave."""
