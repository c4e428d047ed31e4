"""The job's restart budget in etcd: one charge per failed round, job-wide, and per failure class.

Keys (runner.rendezvous.etcd.keys): `restarts` (the job's count), `restarts/<class>` (a class's), and one marker per
round, `restart_charge(round)`, which the first node to charge the round writes with the count it decided (None:
spent), the class it charged (`""`: none) and whether max_restarts paid for it. Every other node of the round reads
that marker and gets the same answer, so a round is charged once however many of its nodes failed, and counted
under the same class on every node (a peer that saw the failure as a lost node counts it as what it was).

The decision is a pure function (`decide`: counts in, the new count or None out); `charge_round` is the one
transaction loop around it (compare-and-swap on the counts, retried when another node moved them).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from runner.outcomes import FailureClass
from runner.rendezvous.base import RoundCharge
from runner.rendezvous.etcd.client import Connection, EtcdSession, absent, key_range, put_op, value_is
from runner.rendezvous.etcd.keys import JobKeys, dump, load

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

CHARGE_POLL_S = 0.05  # while deferring to a peer's own charge of the round


@dataclass(frozen=True)
class Charge:
    """What one failure asks of the budget: its class (None for none), the limits, and whether it counts job-wide."""

    max_restarts: int
    failure_class: FailureClass | None = None
    class_limit: int | None = None  # None: the class has no limit of its own
    job_wide: bool = True  # False: only the class's count moves (an uncharged restart still uses its class)


def decide(charge: Charge, count: int, used: int) -> int | None:
    """The job's count after this charge, or None when the budget is spent.

    `count`: the job's restarts so far; `used`: the class's. A job-wide charge needs `count < max_restarts`; a class
    with a limit needs `used < class_limit`. A charge that is not job-wide leaves the job's count as it is.
    """
    if charge.job_wide and count >= charge.max_restarts:
        return None
    if charge.class_limit is not None and used >= charge.class_limit:
        return None
    return count + 1 if charge.job_wide else count


@dataclass
class ChargeResult:
    """The round's charge (its count None: spent) and the job's count seen (to seed a recreated job)."""

    charge: RoundCharge
    seen: int


async def charge_round(session: EtcdSession, keys: JobKeys, node: str, round_: int, charge: Charge, *,
                       defer: float = 0.0, log: FilteringBoundLogger | None = None) -> ChargeResult:
    """Charge round `round_` once, job-wide.

    Read the round's marker; if there is none, decide and write it with the counts in one transaction
    (compare-and-swap on them); when another node moved them first, read again.

    `defer`: seconds to wait for a peer's own charge of the round first (the peer whose failure it is).
    """
    loop = asyncio.get_running_loop()
    waiting_until = loop.time() + defer
    marker_key = keys.restart_charge(round_)
    cls = charge.failure_class
    cls_key = keys.restarts + b"/" + cls.value.encode() if cls is not None else None
    seen = 0
    while True:
        _, (marker, total, *of_class) = await session.call(lambda c: c.snapshot(
            [key_range(marker_key), key_range(keys.restarts), *([key_range(cls_key)] if cls_key else [])]))
        if marker:
            found = marker_charge(load(marker[0].value))
            return ChargeResult(found, max(seen, found.count or 0))
        if loop.time() < waiting_until:
            await asyncio.sleep(CHARGE_POLL_S)
            continue
        count = int(total[0].value) if total else 0
        seen = max(seen, count)
        used = int(of_class[0][0].value) if of_class and of_class[0] else 0
        new = decide(charge, count, used)
        compare = [absent(marker_key), value_is(keys.restarts, str(count).encode()) if total else absent(keys.restarts)]
        decided = RoundCharge(new, cls, charge.job_wide, node)
        puts = [put_op(marker_key, dump(marker_record(decided)))]
        if new is not None and charge.job_wide:
            puts.append(put_op(keys.restarts, str(new).encode()))
        if new is not None and cls_key is not None:
            compare.append(value_is(cls_key, str(used).encode()) if of_class[0] else absent(cls_key))
            puts.append(put_op(cls_key, str(used + 1).encode()))
        done = await session.call(partial(Connection.txn, compare=compare, success=puts))
        if done.succeeded:
            if log is not None:
                log.info("restart_charged", round=round_, count=new, max_restarts=charge.max_restarts)
            return ChargeResult(decided, max(seen, new or 0))


def marker_record(charge: RoundCharge) -> dict[str, object]:
    """A round's marker as written to etcd: `{"count", "by", "class", "charged"}` (class `""`: none)."""
    cls = charge.failure_class.value if charge.failure_class is not None else ""
    return {"count": charge.count, "by": charge.by, "class": cls, "charged": charge.charged}


def marker_charge(record: object) -> RoundCharge:
    """The charge a round's marker holds (written by whichever node charged the round first); never raises.

    A count that is not a whole number reads as refused (None: no restart on a count nobody can read). The class
    reads as a FailureClass, `""` (or none) as no class; a class this runner does not know leaves the verdict to
    this node (class and `charged` None). A marker without `charged` (an older runner) says nothing about it (None),
    but a classless one that restarts can only be a membership change's claim: not charged.
    """
    data = record if isinstance(record, dict) else {}
    count, by, text, charged = data.get("count"), data.get("by"), data.get("class", ""), data.get("charged")
    number = count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None
    said = charged if isinstance(charged, bool) else None
    who = by if isinstance(by, str) else ""
    if text in ("", None):
        return RoundCharge(number, None, False if said is None else said, who)
    try:
        cls = FailureClass(text)
    except ValueError:  # a class of a newer runner, or not a string at all
        return RoundCharge(number, None, None, who)
    return RoundCharge(number, cls, said, who)
