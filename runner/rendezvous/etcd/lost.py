"""A member found lost, as etcd holds it: the round's `lost` key, or the `lost` field of a waiter's FAILED state.

Both are written by runner (monitor.py writes the key; agent/services.py publishes the field) and read by every
member, so both are input: `parse_lost` turns one into a LostRecord, its texts bounded to one line, or None when the
value is not one (then it is ignored, as before). A leaf module but for json_types.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from runner.json_types import JSONObject

CAUSE_CHARS = 300  # a published reason or root cause, at most (what etcd holds is input: bounded here)


@dataclass(frozen=True)
class LostRecord:
    """Who was found lost, why (node_lost's words), the member that found it, and the lost one's root cause."""

    node: str
    why: str
    by: str = ""
    cause: str = ""

    def record(self) -> JSONObject:
        """The JSON record etcd holds (no `by` or `cause` when empty)."""
        return {"node": self.node, "why": self.why, **({"by": self.by} if self.by else {}),
                **({"cause": self.cause} if self.cause else {})}


def one_line(value: object) -> str:
    """A text of the record as one bounded line ('' for anything that is not text)."""
    if not isinstance(value, str):
        return ""
    line = value.splitlines()[0] if value else ""
    return line[:CAUSE_CHARS]


def cause_of(record: Mapping[str, object]) -> str:
    """The root cause a peer published (its FAILED state's, or a `lost` record's `cause`): one bounded line, or ''."""
    return one_line(record.get("cause"))


def parse_lost(value: object, *, why: str = "") -> LostRecord | None:
    """The LostRecord `value` holds (None when it names no node as text; `why` when it gives none), never raising."""
    if not isinstance(value, dict):
        return None
    node = value.get("node")
    if not isinstance(node, str):
        return None
    return LostRecord(node, one_line(value.get("why")) or why, one_line(value.get("by")), cause_of(value))
