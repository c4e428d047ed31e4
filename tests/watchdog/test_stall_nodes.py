"""The stall detector across nodes (watchdog.stall_timeout, docs/hangs.md): a node whose ranks are all still, while a
rank of another node works (rank 0 writing a checkpoint that the others wait for in a barrier), is not hung.

Each node publishes `progress_at` (when a rank of it last moved) in its live status; a still node asks the others'
before it acts. Units on a virtual clock and the etcd records' parser (any value), then two simulated hosts with real
gloo workers: the checkpoint on host a, the barrier on host b, for longer than twice the bound.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import structlog
from aetcd import rpc
from hosted_helpers import hosted_cluster, hosted_spec, port_of, start_host
from hypothesis import given
from hypothesis import strategies as st
from multinode_helpers import Cluster
from test_stall_units import IDLE_TICKS_PER_S, FakeGroup, FakeWorker

from runner.events import TimerExpired
from runner.rendezvous.etcd.keys import progress_of
from runner.watchdog.clock import AutojumpClock
from runner.watchdog.stall import Reading, StallWatch

BOUND_S = 60.0


def watch_with(seconds: float, elsewhere: Callable[[float], float] | None) -> tuple[list[float], list[str]]:
    """A StallWatch (bound 60 s) over two idle fake workers for `seconds` of virtual time; `elsewhere(t)`: how long ago
    another node moved, t s into the run. (The virtual times the stall events came at; the log's event names.)"""
    clock = AutojumpClock()
    events: list[float] = []
    said: list[str] = []
    began = [0.0]

    class Sink:
        def put_nowait(self, item: TimerExpired) -> None:
            assert item.scope == "stall"
            events.append(clock.monotonic() - began[0])

    def log_event(_logger: object, _name: str, event: dict[str, Any]) -> dict[str, Any]:
        said.append(str(event["event"]))
        raise structlog.DropEvent

    log: Any = structlog.wrap_logger(None, processors=[log_event])

    async def main() -> None:
        group = FakeGroup([FakeWorker(0, 1000), FakeWorker(1, 1001)])
        start = began[0] = clock.monotonic()

        def sample(w: Any) -> Reading:
            return Reading(10 + int(IDLE_TICKS_PER_S * (clock.monotonic() - start)), 0, None)

        async def ask() -> float:
            assert elsewhere is not None
            return elsewhere(clock.monotonic() - start)

        watch = StallWatch(BOUND_S, events=Sink(), log=log, group=lambda: group,  # type: ignore[arg-type,return-value]
                           capture=False, clock=clock, sample=sample, elsewhere=ask if elsewhere else None)
        watch.start()
        await asyncio.sleep(seconds)
        assert watch.moved_at_wall() is not None
        await watch.stop()

    clock.run(main())
    return events, said


def test_a_still_node_waits_while_another_node_moves_then_acts_a_bound_after_it_stopped() -> None:
    """Another node moves for the first 300 s (its checkpoint), then stops: this node, still from the start, acts
    only once the other node has been still for the bound too, and says once why it waited."""
    def other(t: float) -> float:
        return 1.0 if t < 300 else t - 300

    events, said = watch_with(500.0, other)
    (came_at,) = events
    assert said.count("stall_elsewhere_moving") == 1
    assert 300 + BOUND_S <= came_at <= 300 + BOUND_S + 20, came_at


def test_without_other_nodes_or_news_of_them_a_still_node_acts_at_its_bound() -> None:
    for elsewhere in (None, lambda _t: math.inf):
        events, said = watch_with(200.0, elsewhere)
        (came_at,) = events
        assert BOUND_S <= came_at <= BOUND_S + 2 * 15  # the bound, the first sample's and one more interval
        assert "stall_elsewhere_moving" not in said


def test_another_node_that_keeps_moving_keeps_this_one_alive() -> None:
    events, _ = watch_with(1000.0, lambda _t: 2.0)
    assert events == []


def kv(value: bytes) -> rpc.KeyValue:
    return rpc.KeyValue(key=b"/runner/job/states/n", value=value, mod_revision=1, lease=0)


def test_progress_of_reads_each_nodes_published_time_and_leaves_out_the_rest() -> None:
    good = {"node": "a", "state": "RUNNING", "progress_at": 1795845053.25}
    records = [json.dumps(good).encode(), json.dumps({"node": "b", "state": "RUNNING"}).encode(), b"\xff{",
               json.dumps({"node": "c", "progress_at": "soon"}).encode(), json.dumps({"node": 3, "progress_at": 1}).encode(),
               json.dumps({"node": "d", "progress_at": True}).encode(), b'{"node": "e", "progress_at": NaN}']
    assert progress_of([kv(r) for r in records]) == {"a": 1795845053.25}


@given(st.lists(st.binary(max_size=300) | st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["node", "progress_at", "x"]), inner,
                                                                max_size=3),
    max_leaves=10).map(lambda v: json.dumps(v).encode()), max_size=8))
def test_progress_of_any_values_is_a_table_of_finite_times(values: list[bytes]) -> None:
    found = progress_of([kv(v) for v in values])
    assert all(isinstance(n, str) and isinstance(t, float) and math.isfinite(t) for n, t in found.items())


# -- two hosts, real gloo workers -------------------------------------------------------------------------------------

cluster = pytest.fixture(hosted_cluster, name="cluster")
WORKER = Path(__file__).resolve().parents[1] / "fixtures" / "workers" / "stall_worker.py"
HOSTS_BOUND_S = 6.0
SLOW_S = 15.0


@pytest.mark.integration
def test_a_checkpoint_on_one_host_while_the_other_waits_in_a_barrier_is_not_a_hang(cluster: Cluster) -> None:
    """Rank 0 (host a) writes a checkpoint for 15 s; rank 1 (host b) waits in a barrier, still, for 2.5 bounds: b
    waits on a's published progress and the job ends well on both (with each node judging alone, b killed its
    rank after 6 s)."""
    stamp = cluster.tmp / "stamp"
    args = ", ".join(json.dumps(a) for a in ["checkpoint", "--seconds", str(SLOW_S), "--stamp", str(stamp)])
    spec = hosted_spec(port_of(cluster), args=args, restart="max_restarts: 0").replace(
        "script: ", f"script: {WORKER}\n  #", 1).replace("  preload: []", "  #") + \
        f"watchdog:\n  stall_timeout: {HOSTS_BOUND_S:g}s\n"
    cluster.write(spec)
    a, _ = start_host(cluster)
    b = cluster.start("b")
    assert cluster.wait_all(timeout=150) == {"a": 0, "b": 0}, a.output()[-3000:] + b.output()[-3000:]
    assert '"event": "stall"' not in a.output() + b.output()
    waited = [line for line in b.output().splitlines() if '"stall_elsewhere_moving"' in line]
    assert len(waited) == 1, b.output()[-3000:]
    assert stamp.exists()
