"""A round's result record as etcd holds it (`rounds/{r}/result` and its news copy), parsed once where it is read.

The leader writes it once; every node reads it (from the result key, the join transaction, or the news copy) and
gets a RoundResult, or None when the value is not a result record (garbage, or a value some other program wrote).
Where the result key holds such a value the round cannot be read: `result_of` refuses it with a RendezvousError
that says so, never a traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from runner.errors import RendezvousError
from runner.json_types import JSONObject

MAX_RESULT_NODES = 1 << 20  # far above any real round: a longer list is not a result


@dataclass(frozen=True)
class RoundResult:
    """Who is in the round (group-rank order), where group rank 0 listens, and up to where its leader saw joins."""

    nodes: tuple[str, ...]
    master_addr: str
    master_port: int
    nproc: int
    closed_at: float = 0.0  # wall clock, when the leader closed the round
    rev: int = 0  # the revision up to which the leader saw the joins (watch members from there)

    def record(self) -> JSONObject:
        """The JSON record etcd holds."""
        return {"nodes": list(self.nodes), "master_addr": self.master_addr, "master_port": self.master_port,
                "nproc": self.nproc, "closed_at": self.closed_at, "rev": self.rev}


def _integer(value: object) -> int | None:
    """An integer of the record (an integral float too, as int() took it), never a boolean."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def parse_result(value: object) -> RoundResult | None:
    """The RoundResult a decoded JSON value holds, or None when it is not one (never raises)."""
    if not isinstance(value, dict):
        return None
    nodes = value.get("nodes")
    if not isinstance(nodes, (list, tuple)) or len(nodes) > MAX_RESULT_NODES:
        return None
    if not all(isinstance(node, str) for node in nodes):
        return None
    return result_with(value, tuple(nodes))


def result_with(head: Mapping[str, object], nodes: tuple[str, ...]) -> RoundResult | None:
    """The RoundResult of a record's other fields and `nodes` (read as text already), or None (never raises)."""
    addr, closed_at = head.get("master_addr"), head.get("closed_at", 0.0)
    port, nproc, rev = _integer(head.get("master_port")), _integer(head.get("nproc")), _integer(head.get("rev", 0))
    if not isinstance(addr, str) or port is None or nproc is None or rev is None or len(nodes) > MAX_RESULT_NODES:
        return None
    if isinstance(closed_at, bool) or not isinstance(closed_at, (int, float)):
        return None
    return RoundResult(nodes, addr, port, nproc, float(closed_at), rev)


def result_of(value: object, round_: int) -> RoundResult:
    """The RoundResult of round `round_` read from its result key; RendezvousError when the key holds another value."""
    result = parse_result(value)
    if result is None:
        msg = f"the result of rendezvous round {round_} in etcd is not a result record: {str(value)[:120]!r}"
        raise RendezvousError(msg, fix="something other than runner wrote under this job's etcd prefix: give the "
                                       "job a new name, or forget its state (runner reset --force job.yaml)")
    return result
