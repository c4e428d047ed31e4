"""The etcd rendezvous at scale, against a real etcd: O(1) watch events and RPCs per node, the ring of round
monitors (a loss reaches every member, a cleanly ended neighbour is skipped), the leader key handed on, and
Watch.add / per-range resume across an etcd restart."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rdzv_helpers import WAIT_S, Node, close_all, lifecycle, make_spec, open_nodes, rounds, run

from runner.events import PeerLost
from runner.rendezvous.etcd.client import Unavailable, translate
from runner.rendezvous.etcd.keys import JobKeys, dump
from runner.rendezvous.etcd.round import RoundResult, decode_closed, encode_closed
from runner.rendezvous.etcd.watch import Watch
from runner.testing.etcd_server import EtcdServer

pytestmark = pytest.mark.integration


def test_watch_events_and_rpcs_per_node_do_not_grow_with_nodes(etcd: EtcdServer) -> None:
    """From 4 to 32 nodes, each node costs the same few watch events, RPCs and watchers, states published or not.

    (Each node watching every member's state made the events per node grow with the nodes.)
    """
    async def body() -> list[dict[str, float]]:
        return [await lifecycle([etcd.endpoint], n, f"scale{n}") for n in (4, 32)]
    small, large = run(body)
    # etcd's metric names are its own (etcd_debugging_* may change in any release): a name that is gone would count
    # 0 and pass every bound below, so each count must have been seen.
    assert all(small[what] > 0 for what in small), ("etcd no longer exports a counter this test reads", small)
    # per node: the result, perhaps the leader key, its ring neighbour's states (2 published, final, gone); each
    # state published by every node reaching every node would be 2 * 32 events per node from the publishes alone
    assert large["events"] <= 8 and large["events"] <= small["events"] + 2, (small, large)
    # lease grant, admission, join, the first joiner's claim, 2 publishes
    assert large["unary"] <= 8 and large["unary"] <= small["unary"] + 1, (small, large)
    assert large["watches"] <= 2.2, (small, large)  # the news range and the ring neighbour's state


def test_a_lost_member_reaches_every_member_not_only_its_ring_neighbour(etcd: EtcdServer) -> None:
    """Four nodes; one loses its lease: the three others all get PeerLost for it."""
    async def body() -> None:
        nodes = await open_nodes(make_spec(etcd.endpoint, nmin=4, nmax=4), ["a", "b", "c", "d"])
        await rounds(nodes)
        await nodes[2].rdzv.lease.stop(revoke=True)
        for other in (nodes[0], nodes[1], nodes[3]):
            assert (await other.event(PeerLost)).node == "c"
        await close_all(nodes, "failed")
    run(body)


def test_a_cleanly_ended_neighbour_is_skipped(etcd: EtcdServer) -> None:
    """a watches b, b watches c: b ends (succeeded), then c is lost: a, watching c now, reports it."""
    async def body() -> None:
        nodes = await open_nodes(make_spec(etcd.endpoint, nmin=3, nmax=3), ["a", "b", "c"])
        res = await rounds(nodes)
        assert [r.nodes for r in res] == [("a", "b", "c")] * 3
        await nodes[1].rdzv.close("succeeded")
        await nodes[2].rdzv.lease.stop(revoke=True)
        lost = await nodes[0].event(PeerLost)
        assert (lost.node, lost.why) == ("c", "lease expired or node left")
        await close_all([nodes[0], nodes[2]], "failed")
    run(body)


def test_a_leader_that_leaves_before_the_round_closes_is_replaced(etcd: EtcdServer) -> None:
    """The first joiner leads; it leaves before max nodes joined: another node takes the leader key and closes."""
    async def body() -> None:
        spec = make_spec(etcd.endpoint, nmin=3, nmax=3)
        keys = JobKeys(spec.rendezvous.prefix, spec.name)
        early = dict(zip("ab", await open_nodes(spec, ["a", "b"]), strict=True))
        waits = {name: asyncio.ensure_future(n.rdzv.next_round(0)) for name, n in early.items()}
        leader = await until_leader(early["a"], keys)
        stays = "b" if leader == "a" else "a"
        waits[leader].cancel()
        await early[leader].rdzv.lease.stop(revoke=True)  # its join and leader keys vanish
        late = await open_nodes(spec, ["c", "d"])
        results = await asyncio.gather(waits[stays], *(n.rdzv.next_round(0) for n in late))
        assert {r.nodes for r in results} == {(stays, "c", "d")}
        assert await until_leader(early[stays], keys) != leader
        await close_all([early[stays], *late])
        await early[leader].rdzv.close("failed")
    run(body)


async def until_leader(node: Node, keys: JobKeys) -> str:
    """The node id in round 0's leader key, once someone holds it."""
    async def read() -> Any:
        return await node.rdzv.session.call(lambda c: c.get(keys.leader(0)))
    for _ in range(int(WAIT_S / 0.05)):
        kv = await read()
        if kv is not None:
            return str(bytes(kv.value).decode().strip('"'))
        await asyncio.sleep(0.05)
    msg = "no leader"
    raise AssertionError(msg)


def test_watch_add_replays_a_range_and_resumes_each_range_after_etcd_restarts(etcd: EtcdServer) -> None:
    """A range added with an older start revision replays its history; after etcd restarts, each range
    resumes after its own last event: nothing is missed, nothing repeated."""
    async def body() -> None:
        (node,) = await open_nodes(make_spec(etcd.endpoint, nmin=1, nmax=1, lease_ttl=30.0), ["w"])
        session = node.rdzv.session
        first = await session.call(lambda c: c.put(b"/t/b", b"b1"))
        await session.call(lambda c: c.put(b"/t/a", b"a1"))
        watch = await Watch(session, [(b"/t/a", None)], first).start()
        assert (await asyncio.wait_for(watch.next(), WAIT_S)).value == b"a1"
        await watch.add(b"/t/b", None, first)  # older than what the first range delivered: b1 is replayed
        assert (await asyncio.wait_for(watch.next(), WAIT_S)).value == b"b1"
        await asyncio.to_thread(etcd.restart)
        await session.call(lambda c: c.put(b"/t/b", b"b2"))
        await session.call(lambda c: c.put(b"/t/a", b"a2"))
        seen = [(await asyncio.wait_for(watch.next(), WAIT_S)).value for _ in range(2)]
        assert sorted(seen) == [b"a2", b"b2"]
        await watch.cancel()
        await node.rdzv.close("succeeded")
    run(body)


@given(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=40),
       st.integers(0, 65535), st.integers(1, 9), st.integers(0, 1 << 40))
def test_the_result_news_copy_round_trips_any_node_ids(nodes: list[str], port: int, nproc: int, rev: int) -> None:
    result = RoundResult(tuple(nodes), "10.0.0.1", port, nproc, 1.5, rev)
    assert decode_closed(encode_closed(result)) == result


@given(st.binary(max_size=200) | st.binary(max_size=30).map(lambda b: b"{}\n" + "".join(f"%{x:02x}" for x in b).encode()))
def test_any_bytes_decode_to_a_result_or_none(raw: bytes) -> None:
    decoded = decode_closed(raw)
    assert decoded is None or isinstance(decoded, RoundResult)


def test_a_restart_round_forms_when_the_live_states_outgrow_a_default_grpc_reply(etcd: EtcdServer) -> None:
    """The leader of a restart round reads every node's live state in one reply. Five states of 1 MiB (4096 real
    ones of about 1 KiB each) outgrow gRPC's default 4 MiB reply limit: the round must still form."""
    async def body() -> None:
        spec = make_spec(etcd.endpoint, nmin=5, nmax=5, last_call=0.0, lease_ttl=10.0)
        nodes = await open_nodes(spec, [f"big{i}" for i in range(5)])
        await rounds(nodes)
        await asyncio.gather(*(n.rdzv.publish({"state": "RUNNING", "pad": "x" * (1 << 20)}) for n in nodes))
        again = await rounds(nodes, attempt=1)
        assert {r.round for r in again} == {1}
        await close_all(nodes)
    run(body)


def test_the_news_copy_of_a_large_round_is_compressed_and_an_older_plain_copy_still_decodes() -> None:
    """Every member receives the copy: N copies of N ids per round. Hostname-like ids shrink several times; a copy
    written by an older runner (ids in plain lines, no marker) decodes as before; a damaged one is refused."""
    nodes = [f"gpu-r{i // 32:03d}-n{i % 32:02d}.cluster.example.com" for i in range(4096)]
    result = RoundResult(tuple(nodes), "10.0.0.1", 29500, 8, 0.0, 7)
    head = {"master_addr": "10.0.0.1", "master_port": 29500, "nproc": 8, "rev": 7}  # an older copy: no closed_at
    plain = dump(head) + b"\n" + "\n".join(nodes).encode()
    packed = encode_closed(result)
    assert len(packed) * 5 < len(plain), (len(packed), len(plain))
    assert decode_closed(packed) == decode_closed(plain) == result
    assert decode_closed(packed[:-10]) is None  # truncated


def watch_on(stream: object, timeout: float) -> Watch:
    """A Watch whose session hands it `stream` (a gRPC watch stream that misbehaves as etcd's did at scale) on a
    connection with call timeout `timeout`."""
    class Conn:
        def __init__(self) -> None:
            self.timeout = timeout

        def watch_stream(self) -> object:
            return stream

    class Session:
        generation = 1

        async def call(self, op: Any) -> Any:
            return await op(Conn())

    return Watch(Session(), [(b"/t/a", None)], 1)  # type: ignore[arg-type]


def test_a_watch_stream_that_ends_before_its_first_write_is_a_reconnect_not_a_crash() -> None:
    """At 4096 nodes etcd may end a new Watch stream before its create requests are written (grpc.aio raises
    InvalidStateError: "RPC already finished"). Registering the watch must fail as a broken connection (the
    session reconnects and registers again), not with an error that ends the agent's rendezvous."""
    class Finished:
        cancelled = False

        async def write(self, _request: object) -> None:
            raise asyncio.InvalidStateError("RPC already finished.")

        def cancel(self) -> None:
            self.cancelled = True

    stream = Finished()

    async def body() -> None:
        with pytest.raises(Unavailable, match="watch stream ended"):
            await watch_on(stream, 1.0).start()
    run(body)
    assert stream.cancelled


def test_an_etcd_too_busy_to_apply_is_retried_not_a_refusal() -> None:
    """etcd answers "too many requests" (code UNKNOWN) while its apply lags its commits by more than 5000 entries, as
    when 8192 agents join at once: the call is retried (Unavailable), not failed as a refused request. So is the
    server's "context deadline exceeded" (code UNKNOWN): the call's own deadline, met while etcd held it."""
    busy = grpc.aio.AioRpcError(grpc.StatusCode.UNKNOWN, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                details="etcdserver: too many requests")
    assert isinstance(translate(busy), Unavailable)
    for details in ("context deadline exceeded", "context canceled"):  # the call's own deadline, ended server-side
        late = grpc.aio.AioRpcError(grpc.StatusCode.UNKNOWN, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)
        assert isinstance(translate(late), Unavailable), details
    refused = grpc.aio.AioRpcError(grpc.StatusCode.PERMISSION_DENIED, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                   details="etcdserver: permission denied")
    assert not isinstance(translate(refused), Unavailable)


def test_a_watch_whose_stream_never_connects_is_given_up_within_the_call_timeout() -> None:
    """A write on a new Watch stream waits for its connection; 4096 agents reconnecting at once left some waiting
    60 s (the whole connect timeout) with no error. Registering gives up after the connection's call timeout (a
    reconnect), as a create request that is never confirmed does."""
    class NeverConnected:
        cancelled = False

        async def write(self, _request: object) -> None:
            await asyncio.Event().wait()

        def cancel(self) -> None:
            self.cancelled = True

    stream = NeverConnected()

    async def body() -> None:
        with pytest.raises(Unavailable, match="not created in time"):
            await asyncio.wait_for(watch_on(stream, 0.2).start(), 5)
    run(body)
    assert stream.cancelled
