"""A member found lost, as etcd holds it: arbitrary JSON gives a LostRecord with bounded one-line texts, or None."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from runner.rendezvous.etcd.monitor import CAUSE_CHARS, LostRecord, parse_lost

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)
TEXT = st.text(max_size=400)
LOSTISH = st.fixed_dictionaries({}, optional={"node": TEXT | JSONISH, "why": TEXT | JSONISH, "by": TEXT | JSONISH,
                                              "cause": TEXT | JSONISH})


@given(JSONISH | LOSTISH)
def test_any_json_parses_to_a_lost_record_or_none(value: object) -> None:
    lost = parse_lost(value, why="lost")
    if lost is None:
        assert not isinstance(value, dict) or not isinstance(value.get("node"), str)
        return
    assert isinstance(value, dict) and lost.node == value["node"]
    for text in (lost.why, lost.by, lost.cause):
        assert isinstance(text, str) and len(text) <= CAUSE_CHARS and "\n" not in text and "\r" not in text
    assert lost.why  # the default when the record gives none


@given(st.text(min_size=1, max_size=20), st.text(max_size=300).map(lambda t: " ".join(t.splitlines())),
       st.text(max_size=20).map(lambda t: " ".join(t.splitlines())),
       st.text(max_size=300).map(lambda t: " ".join(t.splitlines())))
def test_a_lost_record_round_trips_through_etcd(node: str, why: str, by: str, cause: str) -> None:
    record = LostRecord(node, why or "lost", by, cause)
    assert parse_lost(json.loads(json.dumps(record.record())), why="lost") == record


def test_a_waiter_s_lost_field_names_the_peer_and_its_cause() -> None:
    """The `lost` field agent/services.py publishes with a FAILED state reads back as the same record."""
    lost = parse_lost({"node": "b", "why": "lease expired or node left", "cause": "rank 3: OOM\nTraceback ..."})
    assert lost == LostRecord("b", "lease expired or node left", "", "rank 3: OOM")
