"""A round's result record, parsed once where it is read: arbitrary JSON gives a RoundResult or None, never raises."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.errors import RendezvousError
from runner.rendezvous.etcd.round import RoundResult, decode_closed, encode_closed, parse_result, result_of

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=40,
)
RESULTS = st.builds(
    RoundResult,
    nodes=st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=20).map(tuple),
    master_addr=st.text(max_size=20),
    master_port=st.integers(0, 65535),
    nproc=st.integers(1, 64),
    closed_at=st.floats(0, 2e9),
    rev=st.integers(0, 1 << 40),
)
# Records shaped like a result, with any field possibly missing or of another type.
RESULTISH = st.fixed_dictionaries({}, optional={
    "nodes": st.lists(st.text(max_size=5), max_size=4) | JSONISH,
    "master_addr": st.text(max_size=8) | JSONISH,
    "master_port": st.integers() | JSONISH,
    "nproc": st.integers() | JSONISH,
    "closed_at": st.floats(allow_nan=False) | JSONISH,
    "rev": st.integers() | JSONISH,
})


@given(JSONISH | RESULTISH)
def test_any_json_parses_to_a_result_or_none(value: object) -> None:
    parsed = parse_result(value)
    if parsed is not None:
        assert isinstance(value, dict)
        assert all(isinstance(n, str) for n in parsed.nodes)
        assert type(parsed.master_port) is int and type(parsed.nproc) is int and type(parsed.rev) is int
        assert parsed.nodes == tuple(value["nodes"]) and parsed.master_addr == value["master_addr"]


@given(RESULTS)
def test_a_result_round_trips_through_its_record_and_its_news_copy(result: RoundResult) -> None:
    assert parse_result(json.loads(json.dumps(result.record()))) == result
    assert decode_closed(encode_closed(result)) == result


def test_integral_floats_are_integers_but_booleans_are_not() -> None:
    """As int() took them before: 29500.0 is a port; true is not a port, a count or a revision."""
    base = {"nodes": ["a"], "master_addr": "h", "master_port": 29500.0, "nproc": 2, "closed_at": 1}
    assert parse_result(base) == RoundResult(("a",), "h", 29500, 2, 1.0, 0)
    for key in ("master_port", "nproc", "rev", "closed_at"):
        assert parse_result({**base, key: True}) is None, key
    assert parse_result({**base, "master_port": 1.5}) is None


@given(JSONISH)
def test_a_result_key_that_holds_no_result_is_refused_with_the_round_named(value: object) -> None:
    if parse_result(value) is None:
        with pytest.raises(RendezvousError, match="round 3 "):
            result_of(value, 3)
