"""etcd that comes back without the job's keys: every node notices and they meet again in a new round.

ClusterIdentity (the header check) is tested on its own; the rest runs nodes against a real etcd restarted on an
EMPTY data dir (same ports, so the same cluster id: the revision going back and the missing epoch are the signs).
"""

from __future__ import annotations

import asyncio

import pytest
import structlog.testing
from aetcd import rpc
from hypothesis import given
from hypothesis import strategies as st
from rdzv_helpers import Node, close_all, make_spec, open_nodes, rounds, run

from runner.events import PeerLost
from runner.rendezvous.etcd.admin import read_status
from runner.rendezvous.etcd.client import ClusterIdentity
from runner.rendezvous.etcd.keys import JobKeys, load
from runner.testing.etcd_server import EtcdServer

pytestmark = pytest.mark.integration


def header(cluster: int, revision: int) -> object:
    return rpc.ResponseHeader(cluster_id=cluster, revision=revision)


class TestClusterIdentity:
    def test_first_reply_sets_the_baseline(self) -> None:
        """Nothing is lost before anything was seen."""
        seen = ClusterIdentity()
        assert seen.check(header(7, 40), floor=0) is None
        assert (seen.cluster_id, seen.revision) == (7, 40)

    def test_cluster_id_change_is_a_loss(self) -> None:
        """Another cluster answering is reported once, to every listener, and becomes the new baseline."""
        seen, told = ClusterIdentity(), []
        seen.on_loss(told.append)
        seen.check(header(7, 40), floor=0)
        reason = seen.check(header(9, 50), floor=None)
        assert reason is not None and "cluster id" in reason and told == [reason]
        assert seen.check(header(9, 51), floor=50) is None and len(told) == 1

    def test_revision_below_the_floor_is_a_loss(self) -> None:
        """A reply older than what was seen before the request was sent means etcd forgot its history."""
        seen, told = ClusterIdentity(), []
        seen.on_loss(told.append)
        seen.check(header(7, 40), floor=0)
        reason = seen.check(header(7, 3), floor=seen.revision)
        assert reason is not None and "went back from 40 to 3" in reason
        assert seen.revision == 3 and seen.check(header(7, 4), floor=3) is None

    @given(st.lists(st.integers(min_value=1, max_value=10**9), min_size=2, max_size=30))
    def test_replies_of_concurrent_requests_are_never_a_loss(self, revisions: list[int]) -> None:
        """Requests in flight together may be answered in any order: each is only compared with the revision
        seen before it was sent, so a slower, older reply is not mistaken for a loss."""
        seen = ClusterIdentity()
        seen.check(header(7, min(revisions)), floor=0)
        floor = seen.revision  # every request below was sent before any of their replies came back
        assert all(seen.check(header(7, r), floor=floor) is None for r in revisions)
        assert seen.revision == max(revisions)

    def test_lease_replies_check_only_the_cluster(self) -> None:
        """floor=None (lease replies, not linearizable): a low revision is not a loss."""
        seen = ClusterIdentity()
        seen.check(header(7, 40), floor=0)
        assert seen.check(header(7, 2), floor=None) is None


async def epoch(node: Node) -> bytes:
    """The job's epoch key as this node's session reads it (b"" when absent)."""
    keys = JobKeys("/runner", "job")  # make_spec's prefix and name
    kv = await node.rdzv.session.call(lambda c: c.get(keys.epoch))
    return bytes(kv.value) if kv is not None else b""


def test_running_nodes_get_peer_lost_and_meet_in_the_new_etcd(etcd: EtcdServer) -> None:
    """Both nodes of a running round get PeerLost('etcd'); after charging the failure they form round 0 of the
    new etcd together, under one new epoch, on a new master port, with the restart count kept."""
    async def body() -> None:
        spec = make_spec(etcd.endpoint, lease_ttl=2.0)
        nodes = await open_nodes(spec, ["a", "b"])
        first = await rounds(nodes)
        assert [c.count for c in await asyncio.gather(*(n.rdzv.charge_restart(5) for n in nodes))] == [1, 1]
        first = await rounds(nodes, attempt=1)
        old_epoch = await epoch(nodes[0])
        await asyncio.to_thread(etcd.restart_empty)
        lost = await asyncio.gather(*(n.event(PeerLost) for n in nodes))
        assert {e.node for e in lost} == {"etcd"} and all("lost the job's keys" in e.why for e in lost)
        assert [c.count for c in await asyncio.gather(*(n.rdzv.charge_restart(5) for n in nodes))] == [2, 2]
        again = await rounds(nodes, attempt=2)
        assert [r.round for r in again] == [0, 0]
        assert again[0].nodes == again[1].nodes == ("a", "b")
        assert again[0].master_port == again[1].master_port != first[0].master_port
        assert await epoch(nodes[0]) == await epoch(nodes[1]) not in (b"", old_epoch)
        status = await read_status(spec)
        assert status["status"] == "running" and status["restarts"] == 2
        assert {n["node"] for n in status["nodes"] if n["live"]} == {"a", "b"}
        await close_all(nodes)
    run(body)


def test_node_waiting_in_a_round_joins_again_in_the_new_etcd(etcd: EtcdServer) -> None:
    """A node waiting for its partner when etcd loses everything joins again in the new etcd, where the partner
    (started afterwards) finds it: one round, both in it."""
    async def body() -> None:
        spec = make_spec(etcd.endpoint, lease_ttl=2.0)
        (a,) = await open_nodes(spec, ["a"])
        waiting = asyncio.ensure_future(a.rdzv.next_round(0))
        await asyncio.sleep(1.0)  # a leads round 0 and waits for b
        assert not waiting.done()
        await asyncio.to_thread(etcd.restart_empty)
        await asyncio.sleep(3.0)  # past the lease TTL: a has noticed and joined again
        (b,) = await open_nodes(spec, ["b"])
        result_b = await b.rdzv.next_round(0)
        result_a = await asyncio.wait_for(waiting, 30)
        assert result_a.nodes == result_b.nodes == ("a", "b") and result_a.round == result_b.round == 0
        assert await epoch(a) == await epoch(b) != b""
        await close_all([a, b])
    run(body)



def test_only_the_holder_of_the_leader_key_writes_the_rounds_result(etcd: EtcdServer) -> None:
    """a leads round 0 (2 to 4 nodes, last call 3 s); b and c join. In the last call a's leader key vanishes (as
    when a's lease lapsed while it was cut off, or when etcd came back without its data; the CI soak found the
    latter: a leader back from a partition wrote its stale table, with a node long gone, into a wiped etcd). b or
    c claims the round and leads it. a must not write the result from its table when its last call ends: the
    holder of the key does, and every node gets that one result."""
    async def body() -> None:
        spec = make_spec(etcd.endpoint, nmin=2, nmax=4, last_call=3.0)
        a, b, c = await open_nodes(spec, ["a", "b", "c"])
        keys = JobKeys("/runner", "job")
        with structlog.testing.capture_logs() as logs:
            waiting_a = asyncio.ensure_future(a.rdzv.next_round(0))
            await asyncio.sleep(0.5)  # a joins first: it leads
            waiting = [waiting_a, *(asyncio.ensure_future(n.rdzv.next_round(0)) for n in (b, c))]
            await asyncio.sleep(1.0)  # b and c joined: the last call runs
            assert not any(w.done() for w in waiting)
            assert await c.rdzv.session.call(lambda cl: cl.delete(keys.leader(0))) == 1
            results = await asyncio.wait_for(asyncio.gather(*waiting), 30)
        holder = await c.rdzv.session.call(lambda cl: cl.get(keys.leader(0)))
        assert holder is not None and load(holder.value) in ("b", "c")
        writers = [e["node"] for e in logs if e["event"] == "rendezvous_round_closed" and e["written"]]
        assert writers == [load(holder.value)], logs
        assert [r.nodes for r in results] == [("a", "b", "c")] * 3
        assert len({r.master_port for r in results}) == 1
        await close_all([a, b, c])
    run(body)
