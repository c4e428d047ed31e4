"""Types for the etcd protobuf messages this package builds and reads (aetcd's `rpc` module ships no types).

The messages built (range requests, transaction ops, comparisons) are opaque here: distinct types, so that a
comparison cannot be passed where an op goes, made only by the helpers of runner.rendezvous.etcd.client. The
messages read (a KeyValue) are Protocols naming the fields read. A leaf module: it imports nothing from runner.
"""

from __future__ import annotations

from typing import NewType, Protocol

RangeRequest = NewType("RangeRequest", object)
"""An rpc.RangeRequest: one key, or a range of keys."""

RequestOp = NewType("RequestOp", object)
"""An rpc.RequestOp: one read, put or delete of a transaction."""

Compare = NewType("Compare", object)
"""An rpc.Compare: one condition of a transaction."""


class KeyValue(Protocol):
    """An rpc.KeyValue: one key as read, with its revisions and lease."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int
