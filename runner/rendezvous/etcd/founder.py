"""The founding member goes on alone when the other of two voting members is lost.

Why: etcd 3.5 admits one learner at a time, so a hosted etcd grows 1 -> 2 -> 3 members, and while it has two voters
(the growth window; or three members after one was lost and removed, with no free node to take its place) the two
need each other: the second voter's host lost would end a rendezvous that one member alone survives. Here the
cluster's founder (the member the cluster started from, on the first endpoint's host: unique for the job's life)
starts its etcd again as a cluster of one on its own data (`etcd --force-new-cluster`): every key, lease and revision
stays, the lost voter is no member any more, and the members grow again as nodes join (members.py).

Partition-safe, by rule: only with exactly two voters, only the founder, and only when its etcd has had no leader for
NO_LEADER_S and the other voter's etcd does not accept a connection (members.serving). On the other side of a cut
link the other voter is one of two: it can never make progress alone and never forces (it is no founder), so the
job never has two rendezvous. With three voters or more nobody forces: two of them may be live together behind a cut.

Read without the job's credentials: etcd answers Status and a non-linearizable MemberList from the member itself,
without a quorum or a token (getting a token needs a quorum).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from runner.errors import RendezvousError
from runner.rendezvous.etcd.client import ClusterIdentity, Connection, Credentials, Endpoint, MemberInfo
from runner.rendezvous.etcd.members import serving

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

POLL_S = 1.0  # between two looks at the founder's own etcd
NO_LEADER_S = 3.0  # etcd elects a leader within about a second (its election timeout); three without one is a loss
CALL_S = 1.0  # each local read


@dataclass(frozen=True)
class Look:
    """What the founder's own etcd says: its leader (0: none), and the members it knows."""

    leader: int
    members: tuple[MemberInfo, ...]


def alone_with(look: Look, me: str, up: set[int]) -> MemberInfo | None:
    """The lost voter the founder `me` may go on without, or None (the rule of the module's docstring).

    `up`: the ids of the members whose etcd accepts a connection.
    """
    if look.leader:
        return None
    voting = [m for m in look.members if not m.learner]
    if len(voting) != 2 or me not in {m.name for m in voting}:
        return None
    other = next(m for m in voting if m.name != me)
    return None if other.id in up else other


async def look_at(conn: Connection) -> Look:
    """Status and the member list, from the member `conn` reaches itself; RendezvousError when it does not answer."""
    return Look(await conn.leader(), tuple(await conn.members()))


async def watch(url: str, creds: Credentials, me: str, go_alone: Callable[[MemberInfo], Awaitable[None]],
                log: FilteringBoundLogger, *, clock: Callable[[], float] | None = None,
                leaderless: Callable[[bool], None] = lambda _: None) -> None:
    """Look at the founder's etcd each POLL_S while the job runs (cancelled at its end), on one connection.

    After NO_LEADER_S without a leader, go on alone when the rule allows (`go_alone(lost)`: etcd started again as a
    cluster of one, the lost voter's node let go). Only the one voter the rule could go on without is dialled. A
    failed try is said, and tried again at the next look that finds the same. `leaderless` hears each look's
    verdict: no leader (True), or one (False).
    """
    now = clock or asyncio.get_running_loop().time
    conn = Connection(Endpoint.parse(url), Credentials(ca=creds.ca, cert=creds.cert, key=creds.key),
                      ClusterIdentity(), CALL_S)  # no user: a token needs a quorum (the module's docstring)
    try:
        leaderless_since: float | None = None
        while True:
            await asyncio.sleep(POLL_S)
            try:
                look = await look_at(conn)
            except RendezvousError:
                continue  # its own etcd restarting (its supervisor), or too loaded to answer: look again
            leaderless(not look.leader)
            if look.leader:
                leaderless_since = None
                continue
            leaderless_since = leaderless_since if leaderless_since is not None else now()
            if now() - leaderless_since < NO_LEADER_S:
                continue
            candidate = alone_with(look, me, set())  # the rule, whoever answers
            lost = alone_with(look, me, await serving([candidate])) if candidate is not None else None
            if lost is None:
                continue
            log.warning("rendezvous_member_alone", lost=lost.name, peer_urls=list(lost.peer_urls),
                        message=f"the other voting member ({lost.name}) is lost and etcd has had no leader for "
                                f"{NO_LEADER_S:g} s: this member, the cluster's first, goes on as a cluster of one on "
                                "its data (etcd --force-new-cluster); the members grow again as nodes join")
            try:
                await go_alone(lost)
            except RendezvousError as exc:
                log.warning("rendezvous_member_alone_failed", reason=exc.message,
                            message=f"this member could not go on alone: {exc.message}; tried again at the next "
                                    "look")
                continue
            leaderless_since = None
    finally:
        await conn.close()
