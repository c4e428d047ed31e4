"""Group-rank assignment for a closed round: pure, deterministic, no I/O."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def assign_ranks(joined: Iterable[str], previous: Sequence[str] = ()) -> tuple[str, ...]:
    """Node ids in group-rank order.

    Nodes of the previous round keep their previous relative order and come first (so group rank 0,
    the master node, stays put across restarts when it can); newcomers follow, sorted by node id.
    """
    members = set(joined)
    kept = [node for node in dict.fromkeys(previous) if node in members]
    newcomers = sorted(members.difference(kept))
    return (*kept, *newcomers)


def leader_of(joined: Iterable[str], previous: Sequence[str] = ()) -> str | None:
    """The node that would get group rank 0 (None when nobody joined)."""
    order = assign_ranks(joined, previous)
    return order[0] if order else None
