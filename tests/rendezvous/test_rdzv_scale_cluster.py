"""The etcd rendezvous on a 3-member etcd, the production shape (each member on a simulated host of its own): what
each node costs etcd stays the same from 4 to 32 nodes, per round as in tests/rendezvous/test_rdzv_scale.py on one member, and in
steady state; the agents spread over the members. bench/rdzv_scale.py prices the same counts at thousands of nodes (docs/scale.md). Counts only: no
timing target."""

from __future__ import annotations

import asyncio
import time

import pytest
from rdzv_helpers import close_all, counters, lifecycle, make_spec, open_nodes, rounds, run

from runner.testing.etcd_cluster import etcd_on_hosts
from runner.testing.hosts import Lab

pytestmark = pytest.mark.integration

LEASE_TTL_S = 3.0  # a keep-alive every TTL / 3 = 1 s
STEADY_S = 3.0


async def steady(endpoints: list[str], n: int, name: str) -> tuple[float, list[float]]:
    """n nodes in a running round: gRPC messages etcd received per node per keep-alive period (TTL / 3), and the
    messages each member received."""
    nodes = await open_nodes(make_spec(endpoints, nmin=n, nmax=n, name=name, last_call=0.0, lease_ttl=LEASE_TTL_S),
                             [f"s{i:02d}" for i in range(n)])
    await rounds(nodes)
    before, start = [counters([e]) for e in endpoints], time.monotonic()
    await asyncio.sleep(STEADY_S)  # the steady state is time passing: what etcd receives meanwhile is measured
    after, elapsed = [counters([e]) for e in endpoints], time.monotonic() - start
    await close_all(nodes)
    each = [a["messages"] - b["messages"] for a, b in zip(after, before, strict=True)]
    return sum(each) / n / (elapsed / (LEASE_TTL_S / 3)), each


def test_per_node_counts_on_three_members_do_not_grow_with_nodes(lab: Lab) -> None:
    """4 and 32 nodes on 3 members: the same few watch events, RPCs and watchers per node and round, and about one
    message (its lease keep-alive) per node and keep-alive period while the round runs; summed over the members."""
    with etcd_on_hosts(lab, ["e1", "e2", "e3"]) as cluster:
        async def body() -> tuple[list[dict[str, float]], list[tuple[float, list[float]]]]:
            per_round = [await lifecycle(cluster.endpoints, n, f"scale{n}") for n in (4, 32)]
            return per_round, [await steady(cluster.endpoints, n, f"steady{n}") for n in (4, 32)]
        (small, large), ((steady_small, _), (steady_large, members)) = run(body)
    # a counter etcd stopped exporting would count 0 and pass every bound below: each must have been seen
    assert all(small[what] > 0 for what in small), ("etcd no longer exports a counter this test reads", small)
    assert steady_small > 0, "no keep-alive reached etcd"
    # the bounds of tests/rendezvous/test_rdzv_scale.py: raft between the members adds nothing a client sends or receives; one
    # event more for 32 nodes closing at once under load (CI 2026-12-02: 4.03 against 1.75 for 4 nodes), where a
    # watcher whose member ended moves on to the next and hears its end too: still a constant, never n
    assert large["events"] <= 8 and large["events"] <= small["events"] + 3, (small, large)
    assert large["unary"] <= 8 and large["unary"] <= small["unary"] + 1, (small, large)
    assert large["watches"] <= 2.2, (small, large)
    # steady state: the keep-alive and nothing else (a node polling, or watching every member, would grow with n)
    assert steady_large <= 1.5 and steady_large <= steady_small + 0.25, (steady_small, steady_large)
    # each agent starts at a random endpoint: 32 agents leave no member without clients (all on one: 3 * (2/3)**32)
    assert all(m > 0 for m in members), members
