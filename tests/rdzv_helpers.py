"""Rendezvous test helpers: N EtcdRendezvous participants in one event loop against a real etcd, a spec with short
test timings. Imported as `rdzv_helpers` (tests/ is on the path) by every rendezvous test that needs them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from runner.config.spec import Entrypoint, JobSpec, Nodes, Rendezvous
from runner.rendezvous.etcd.backend import EtcdRendezvous

WAIT_S = 30.0


def make_spec(endpoint: str, *, nmin: int = 2, nmax: int = 2, name: str = "job", **rdzv: Any) -> JobSpec:
    """A job spec for the etcd backend with short test timings."""
    opts: dict[str, Any] = {"last_call": 0.5, "lease_ttl": 2.0, "join_timeout": WAIT_S, "connect_timeout": 10.0}
    opts.update(rdzv)
    return JobSpec(name=name, entrypoint=Entrypoint(script="train.py"), nodes=Nodes(nmin, nmax),
                   rendezvous=Rendezvous(backend="etcd", endpoints=(endpoint,), **opts))


def run(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
    """Run an async test body with an overall limit."""
    async def bounded() -> Any:
        return await asyncio.wait_for(coro_fn(), 120)
    return asyncio.run(bounded())


class Node:
    """One rendezvous participant and its event queue."""

    def __init__(self, spec: JobSpec, name: str) -> None:
        self.events: asyncio.Queue[Any] = asyncio.Queue()
        self.rdzv = EtcdRendezvous(spec, name, advertise_addr="127.0.0.1")

    async def open(self) -> Node:
        await self.rdzv.open(self.events)
        return self

    async def event(self, kind: type) -> Any:
        """The next event of `kind` (others are skipped)."""
        while True:
            ev = await asyncio.wait_for(self.events.get(), WAIT_S)
            if isinstance(ev, kind):
                return ev


async def open_nodes(spec: JobSpec, names: list[str]) -> list[Node]:
    return list(await asyncio.gather(*(Node(spec, n).open() for n in names)))


async def rounds(nodes: list[Node], attempt: int = 0) -> list[Any]:
    return list(await asyncio.gather(*(n.rdzv.next_round(attempt) for n in nodes)))


async def close_all(nodes: list[Node], outcome: str = "succeeded") -> None:
    await asyncio.gather(*(n.rdzv.close(outcome) for n in nodes))
