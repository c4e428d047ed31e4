"""Rendezvous test helpers: N EtcdRendezvous participants in one event loop against a real etcd, a spec with short
test timings. Imported as `rdzv_helpers` (tests/ is on the path) by every rendezvous test that needs them.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from runner.config.spec import Entrypoint, JobSpec, Nodes, Rendezvous
from runner.rendezvous.etcd.backend import EtcdRendezvous

WAIT_S = 30.0


def make_spec(endpoint: str | Sequence[str], *, nmin: int = 2, nmax: int = 2, name: str = "job",
              **rdzv: Any) -> JobSpec:
    """A job spec for the etcd backend with short test timings (`endpoint`: one, or every member's)."""
    opts: dict[str, Any] = {"last_call": 0.5, "lease_ttl": 2.0, "join_timeout": WAIT_S, "connect_timeout": 10.0}
    opts.update(rdzv)
    endpoints = (endpoint,) if isinstance(endpoint, str) else tuple(endpoint)
    return JobSpec(name=name, entrypoint=Entrypoint(script="train.py"), nodes=Nodes(nmin, nmax),
                   rendezvous=Rendezvous(backend="etcd", endpoints=endpoints, **opts))


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


def counters(endpoints: Sequence[str]) -> dict[str, float]:
    """etcd's own counts, summed over labels and over the members at `endpoints`: watch events sent, unary RPCs
    answered, watchers created, gRPC messages received (unary calls and every stream message: keep-alives too)."""
    out = {"events": 0.0, "unary": 0.0, "watches": 0.0, "messages": 0.0}
    for endpoint in endpoints:
        with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        for name, labels, value in re.findall(r"^(\w+)(\{[^}]*\})? (\S+)$", text, re.MULTILINE):
            if name == "etcd_debugging_mvcc_events_total":
                out["events"] += float(value)
            elif name == "grpc_server_handled_total" and 'grpc_type="unary"' in labels:
                out["unary"] += float(value)
            elif name == "grpc_server_msg_received_total":
                out["messages"] += float(value)
                if 'grpc_method="Watch"' in labels:
                    out["watches"] += float(value)  # the client ends watches by cancelling: every message creates
    return out


async def lifecycle(endpoints: Sequence[str], n: int, name: str) -> dict[str, float]:
    """n nodes: open, one round, every node publishes two states (as agents do), close; etcd's counts per node.

    Watch events are counted to the close; RPCs and watchers to the last publish.
    """
    before = counters(endpoints)
    nodes = await open_nodes(make_spec(endpoints, nmin=n, nmax=n, name=name, last_call=0.0),
                             [f"n{i:02d}" for i in range(n)])
    await rounds(nodes)
    for state in ("RUNNING", "RUNNING"):
        await asyncio.gather(*(x.rdzv.publish({"state": state, "attempt": 0}) for x in nodes))
    at_round = counters(endpoints)
    await close_all(nodes)
    after = counters(endpoints)
    return {"events": (after["events"] - before["events"]) / n, "unary": (at_round["unary"] - before["unary"]) / n,
            "watches": (at_round["watches"] - before["watches"]) / n}
