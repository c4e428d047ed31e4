"""Any node id works with the etcd rendezvous: ids are percent-encoded in keys and decoded when read back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rdzv_helpers import Node, close_all, make_spec, open_nodes, rounds, run

from runner.errors import RendezvousError
from runner.rendezvous.etcd.admin import read_status
from runner.rendezvous.etcd.keys import MAX_NODE_ID_BYTES, JobKeys, check_node_id, decode_node, encode_node
from runner.testing.etcd_server import EtcdServer

ANY_TEXT = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF))


@given(ANY_TEXT)
def test_any_node_id_round_trips_through_the_key_encoding(node: str) -> None:
    """decode(encode(id)) == id, and the encoded part never contains '/'."""
    part = encode_node(node)
    assert "/" not in part
    assert decode_node(part) == node


@given(ANY_TEXT.filter(lambda s: 0 < len(s.encode("utf-8", "surrogatepass")) <= MAX_NODE_ID_BYTES),
       st.integers(min_value=0, max_value=10**6))
def test_node_keys_give_the_node_id_back(node: str, round_: int) -> None:
    """Join, state and final keys are one level below their prefix, and leaf() returns the id."""
    keys = JobKeys("/runner", "job")
    for key, prefix in ((keys.join(round_, node), keys.round_nodes(round_)), (keys.state(node), keys.states),
                        (keys.final(node), keys.finals)):
        assert key.startswith(prefix)
        assert b"/" not in key[len(prefix):]
        assert JobKeys.leaf(key) == node


@given(ANY_TEXT, ANY_TEXT)
def test_distinct_ids_get_distinct_keys(a: str, b: str) -> None:
    """Encoding is injective: two different ids never share a key ('a/b' vs 'a%2Fb' included)."""
    keys = JobKeys("/runner", "job")
    assert (keys.state(a) == keys.state(b)) == (a == b)
    assert keys.state("a/b") != keys.state("a%2Fb")


def test_plain_ids_stay_readable() -> None:
    """Ordinary host names are unchanged in the keys (etcdctl output stays readable)."""
    assert encode_node("node-1.cluster_a~x") == "node-1.cluster_a~x"
    assert encode_node("rack1/n1") == "rack1%2Fn1"


def test_empty_and_huge_ids_are_refused_clearly() -> None:
    """The only ids refused: empty, or longer than MAX_NODE_ID_BYTES, each with a fix naming --node."""
    with pytest.raises(RendezvousError, match="empty") as empty:
        check_node_id("")
    assert "--node" in empty.value.fix
    with pytest.raises(RendezvousError, match="bytes long") as huge:
        check_node_id("x" * (MAX_NODE_ID_BYTES + 1))
    assert "--node" in huge.value.fix
    check_node_id("x" * MAX_NODE_ID_BYTES)


def test_ids_with_slashes_and_unicode_form_a_round(etcd: EtcdServer) -> None:
    """Nodes 'rack 1/gpu-a' and 'rack 1/gpü-b' (the ids that used to wait out the join timeout) form a round,
    and status shows their ids as given."""
    async def body() -> None:
        spec = make_spec(etcd.endpoint, join_timeout=20.0)
        names = ["rack 1/gpu-a", "rack 1/gpü-b"]
        nodes = await open_nodes(spec, names)
        results = await rounds(nodes)
        assert [r.nodes for r in results] == [tuple(names)] * 2
        assert [r.group_rank for r in results] == [0, 1]
        await nodes[1].rdzv.publish({"state": "RUNNING"})
        status = await read_status(spec)
        assert [n["node"] for n in status["nodes"]] == names
        assert status["nodes_in_round"] == names
        await close_all(nodes)
    run(body)


def test_empty_node_id_is_refused_at_open(etcd: EtcdServer) -> None:
    """open() refuses an empty id before touching etcd."""
    async def body() -> None:
        with pytest.raises(RendezvousError, match="node id is empty"):
            await Node(make_spec(etcd.endpoint), "").open()
    run(body)
