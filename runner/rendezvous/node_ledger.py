"""The node ledger: which node failed how often, across runs, kept where the job's state lives (docs/hangs.md).

One record per node: its last MAX_MARKS failures that were its own (a worker of it failed, the watchdog timed out a
rank of it with no other culprit named, or it held up a hang), each with its class, and when it was last seen. A
failure a node merely saw (a peer lost, a rendezvous timeout) is not its own and is not marked. The local backend
keeps the ledger in a file of the per-user state folder (`$XDG_STATE_HOME/runner/ledger/<job>-<identity>.json`,
JobSpec.identity(): two jobs of one name in two folders keep two ledgers), the etcd
backend under the job's keys (`<prefix>/<job>/ledger/<node>`, no lease: it outlives runs; `runner reset` clears it).
`runner status` shows it; `health.max_failures` keeps out a node whose own failures reached that many within
`health.failure_window`.

Every record is read back validated and bounded: a damaged one is left out, never raised.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from runner.system.private_files import write_private

MAX_MARKS = 50  # per node: its last failures
MAX_NODES = 1024
MAX_REASON = 200
MAX_FILE_BYTES = 4 << 20


@dataclass(frozen=True)
class Mark:
    """One failure that was the node's own."""

    at: float  # epoch seconds
    failure_class: str  # a FailureClass value
    reason: str
    culprit: bool = False  # it held up a hang (docs/hangs.md)

    def to_json(self) -> dict[str, object]:
        """The JSON boundary."""
        return {"at": round(self.at, 3), "class": self.failure_class, "reason": self.reason[:MAX_REASON],
                "culprit": self.culprit}


@dataclass(frozen=True)
class NodeRecord:
    """What the ledger knows of one node."""

    node: str
    marks: tuple[Mark, ...] = ()
    last_seen: float = 0.0

    def noted(self, mark: Mark | None, now: float) -> NodeRecord:
        """This record seen at `now`, with `mark` added (the oldest beyond MAX_MARKS dropped)."""
        marks = (*self.marks, mark)[-MAX_MARKS:] if mark is not None else self.marks
        return replace(self, marks=marks, last_seen=max(self.last_seen, now))

    def counts(self, since: float = 0.0) -> dict[str, int]:
        """Failures by class since `since` (epoch seconds)."""
        out: dict[str, int] = {}
        for m in self.marks:
            if m.at >= since:
                out[m.failure_class] = out.get(m.failure_class, 0) + 1
        return out

    def to_json(self) -> dict[str, object]:
        """The JSON boundary (what the ledger stores, and `runner status --json` shows)."""
        return {"node": self.node, "last_seen": round(self.last_seen, 3), "marks": [m.to_json() for m in self.marks],
                "counts": self.counts()}


def record_of(value: object) -> NodeRecord | None:
    """A record read back (JSON already parsed); None when it is not one."""
    if not isinstance(value, dict):
        return None
    node, seen, marks = value.get("node"), value.get("last_seen"), value.get("marks")
    if not isinstance(node, str) or not isinstance(seen, (int, float)) or isinstance(seen, bool):
        return None
    kept = []
    for m in marks[-MAX_MARKS:] if isinstance(marks, list) else ():
        if not isinstance(m, dict):
            continue
        at, cls, reason = m.get("at"), m.get("class"), m.get("reason")
        if isinstance(at, (int, float)) and not isinstance(at, bool) and isinstance(cls, str) and len(cls) <= 40:
            kept.append(Mark(float(at), cls, reason[:MAX_REASON] if isinstance(reason, str) else "",
                             m.get("culprit") is True))
    return NodeRecord(node[:256], tuple(kept), float(seen))


def records_of(value: object) -> dict[str, NodeRecord]:
    """Every valid record of a list (the local file's content), by node; at most MAX_NODES."""
    out: dict[str, NodeRecord] = {}
    for item in value[:MAX_NODES] if isinstance(value, list) else ():
        rec = record_of(item)
        if rec is not None:
            out[rec.node] = rec
    return out


class LocalLedger:
    """The ledger of a one-node job: a private file (0600) of the per-user state folder."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, NodeRecord]:
        """Every record ({} when there is no file, or it cannot be read)."""
        try:
            if self.path.stat().st_size > MAX_FILE_BYTES:
                return {}
            return records_of(json.loads(self.path.read_text(encoding="utf-8")))
        except (OSError, ValueError, RecursionError):
            return {}

    def note(self, node: str, mark: Mark | None, now: float | None = None) -> None:
        """Mark `node` seen now, with `mark` if given (OSError: the state folder refused it)."""
        records = self.read()
        now = time.time() if now is None else now
        records[node] = records.get(node, NodeRecord(node)).noted(mark, now)
        kept = sorted(records.values(), key=lambda r: r.last_seen)[-MAX_NODES:]
        os.makedirs(self.path.parent, mode=0o700, exist_ok=True)
        write_private(self.path, json.dumps([r.to_json() for r in kept]))
