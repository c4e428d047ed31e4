"""The fence (runner/rendezvous/etcd/fence.py): a node cut off from etcd and every peer stops its workers before its
lease lapses; a node whose peers answer while etcd is silent keeps training.

The rule itself is checked here with an injected clock and probe (no time passes); the real thing, a host's link
cut while a 3-node job trains, is tests/rendezvous/test_fencing_hosts.py.
"""

from __future__ import annotations

import asyncio
import socket

import structlog
from hypothesis import given
from hypothesis import strategies as st

from runner.rendezvous.etcd.fence import Fence, Peer, reachable

PEER = Peer("b", "10.0.0.2", 29500)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fence(ttl: float, until: float, answers: dict[str, bool], peers: tuple[Peer, ...] = (PEER,),
          answered_at: float = 0.0) -> tuple[Fence, Clock, list[str], list[str]]:
    clock, fired, asked = Clock(), [], []

    async def probe(peer: Peer, timeout: float) -> bool:
        assert timeout == ttl / 6
        asked.append(peer.node)
        return answers[peer.node]
    return Fence(ttl, lambda: until, peers, fired.append, structlog.get_logger(), clock=clock, probe=probe,
                 answered_at=lambda: answered_at), clock, fired, asked


def test_a_renewed_lease_asks_nobody() -> None:
    f, clock, fired, asked = fence(9.0, 100.0 + 6.5, {"b": False})
    assert not asyncio.run(f.check()) and asked == [] and fired == []


def test_cut_off_from_etcd_and_every_peer_fires_once_with_the_reason() -> None:
    f, clock, fired, asked = fence(9.0, 100.0 + 2.0, {"b": False, "c": False}, (PEER, Peer("c", "h3", 29500)))
    assert asyncio.run(f.check())
    assert asked == ["b", "c"] and len(fired) == 1
    assert "cut off" in fired[0] and "lease_ttl 9 s" in fired[0] and "b at 10.0.0.2:29500" in fired[0]
    assert not asyncio.run(f.check()) and len(fired) == 1  # once


def test_a_peer_that_answers_means_etcd_is_away_for_everyone_and_the_workers_keep_running() -> None:
    f, clock, fired, asked = fence(9.0, 100.0 + 1.0, {"b": False, "c": True}, (PEER, Peer("c", "h3", 29500)))
    assert not asyncio.run(f.check()) and fired == [] and asked == ["b", "c"]


def test_an_etcd_that_answers_is_no_cut_even_when_the_lease_is_not_renewed() -> None:
    """etcd came back without its data (the chaos soak's etcd_wipe, seed 1): the lease is gone, but etcd answers;
    that is the data-loss path's, and the fence asks nobody."""
    f, clock, fired, asked = fence(9.0, 100.0 - 5.0, {"b": False}, answered_at=100.0 - 0.5)
    assert not asyncio.run(f.check()) and fired == [] and asked == []


def test_a_round_without_peers_is_never_fenced() -> None:
    f, clock, fired, asked = fence(9.0, 0.0, {}, ())
    assert not asyncio.run(f.check()) and fired == [] and asked == []


@given(st.floats(2, 120), st.floats(-200, 200), st.booleans())
def test_fires_iff_less_than_a_third_of_the_ttl_is_left_and_no_peer_answers(ttl: float, left: float,
                                                                              answers: bool) -> None:
    f, clock, fired, asked = fence(ttl, 100.0 + left, {"b": answers})
    assert asyncio.run(f.check()) == (left < ttl / 3 and not answers)
    assert bool(asked) == (left < ttl / 3)


def test_reachable_says_yes_for_a_listener_and_for_a_refusal() -> None:
    with socket.socket() as listener, socket.socket() as closed:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        closed.bind(("127.0.0.1", 0))  # bound, not listening: the kernel refuses connections
        port, refused = listener.getsockname()[1], closed.getsockname()[1]
        assert asyncio.run(reachable(Peer("x", "127.0.0.1", port), 2.0))
        assert asyncio.run(reachable(Peer("x", "127.0.0.1", refused), 2.0))


def test_reachable_says_no_for_a_name_nobody_knows() -> None:
    """(A path that carries nothing, a host's cut link, is tests/rendezvous/test_fencing_hosts.py's.)"""
    assert not asyncio.run(reachable(Peer("x", "no-such-host.invalid", 29500), 0.3))
