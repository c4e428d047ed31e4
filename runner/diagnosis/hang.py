"""A failure joined with the flight recorder's verdict (runner.hangs).

The hang's or the mismatch's culprit as the root cause, what the rank that failed saw kept as `detected`, or the
line that says why no culprit was named.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from runner.diagnosis.evidence import COLLECTIVE_TIMEOUT, mismatch_line
from runner.diagnosis.failure import Failure, reported_line
from runner.events import TimerExpired
from runner.hangs import Culprit, Verdict
from runner.outcomes import FailureClass, FailureKind


def collective_timeout(failure: Failure) -> bool:
    """Whether the worker's error is a collective timeout: a hang a rank gave up on (docs/hangs.md)."""
    return bool(COLLECTIVE_TIMEOUT.search(f"{failure.error}\n{failure.traceback}\n{failure.stderr_tail}"))


def collective_mismatch(failure: Failure) -> str:
    """The line of the worker's error that says it died of a collective mismatch, short ("" when it did not)."""
    return mismatch_line(f"{failure.error}\n{failure.traceback}\n{failure.stderr_tail}")


def with_mismatch(failure: Failure, found: Culprit | None) -> Failure:
    """A worker's death of a collective mismatch, with the rank whose call differed as its root cause.

    When the records of the ranks still alive name it; its class stays the death's (a signal, an exception).
    """
    if found is None or not found.verdict.named:
        note = unnamed(found.verdict if found is not None else None, recorder=True)
        return replace(failure, hang=found.verdict if found is not None else None, culprit_note=note)
    return replace(failure, reason=found.verdict.reason(), detected=f"{failure.reason}: a collective mismatch",
                   hang=found.verdict, stacks="\n".join(found.stacks_text()))


def peer_hang(failure: Failure, found: Culprit | None, *, local_ranks: dict[int, int],
              rank_dir: Callable[[int], str]) -> Failure:
    """A peer's FAILED report that follows the hang query this node answered: the hang's culprit as the root cause.

    Every node analysed the same records, so this node names the culprit the detecting node names (one story on
    every node). Unchanged when the records name no culprit.
    """
    if found is None or not found.verdict.named:
        return failure
    verdict = found.verdict
    first = verdict.culprits[0][0]
    local = local_ranks.get(first) if len(verdict.culprits) == 1 else None
    hang = not verdict.died  # a mismatch that aborts keeps its own class, on the node where a rank died of it
    return replace(
        failure, reason=verdict.reason(), detected=reported_line(failure.reason), hang=verdict,
        stacks="\n".join(found.stacks_text()), classified=FailureClass.HANG if hang else None,
        evidence="another node's hang query" if hang else "",
        rank=first if len(verdict.culprits) == 1 else None, local_rank=local,
        log_dir=rank_dir(local) if local is not None else "",
    )


def with_hang(failure: Failure, found: Culprit | None) -> Failure:
    """A collective timeout's failure with the hang's culprit as its root cause, when the records name one.

    Classed `hang` (evidence: the timeout). The rank that timed out stays the failure's rank (its traceback, its
    logs; `restart.scope: worker` replaces it), and what it saw is kept as `detected`.
    """
    if found is None or not found.verdict.named:
        note = unnamed(found.verdict if found is not None else None, recorder=True)
        return replace(failure, hang=found.verdict if found is not None else None, culprit_note=note,
                       classified=FailureClass.HANG, evidence="a collective timeout")
    stacks = "\n".join(found.stacks_text())
    return replace(failure, reason=found.verdict.reason(), detected=f"{failure.reason}: a collective timeout",
                   hang=found.verdict, stacks=stacks, classified=FailureClass.HANG, evidence="a collective timeout")


def watchdog_failure(event: TimerExpired, attempt: int, *, local_ranks: dict[int, int], log_dir: str,
                     recorder: bool, rank_dir: Callable[[int], str]) -> Failure:
    """The failure a watchdog expiry makes: the hang's culprit as the root cause when the records name one.

    `local_ranks` maps this node's global ranks to local ones; `rank_dir(local_rank)` is a rank's log dir;
    `log_dir` the expired worker's. Without a named culprit the rank the watchdog timed out stays the root cause,
    with a line saying why no culprit was named.
    """
    verdict = event.culprit.verdict if event.culprit is not None else None
    base = Failure(kind=FailureKind.WATCHDOG, reason=event.reason, attempt=attempt, rank=event.rank,
                   local_rank=event.local_rank, stacks=event.stacks, log_dir=log_dir, hang=verdict)
    if verdict is None or not verdict.named:
        return replace(base, culprit_note=unnamed(verdict, recorder=recorder))
    assert event.culprit is not None
    stacks = event.culprit.stacks_text()
    if event.stacks:
        stacks.append(f"rank {event.rank} (timed out by the watchdog):\n{event.stacks.rstrip()}")
    first = verdict.culprits[0][0]
    local = local_ranks.get(first) if len(verdict.culprits) == 1 else None
    return replace(
        base, reason=verdict.reason(), detected=event.reason, stacks="\n".join(stacks),
        rank=first if len(verdict.culprits) == 1 else None, local_rank=local,
        log_dir=rank_dir(local) if local is not None else "",
    )


def unnamed(verdict: Verdict | None, *, recorder: bool) -> str:
    """Why a hang's culprit was not named: the line the report shows."""
    if not recorder:
        return ("not analysed: the flight recorder is off (watchdog.flight_recorder: 0); the rank named is the one "
                "the watchdog timed out, which may be one that waited for another")
    if verdict is None:
        return "not analysed (the query failed: see agent.jsonl)"
    if verdict.ranks == 0 and verdict.recorder_off:
        return ("not analysed: the flight recorder is off in the workers (their dumps have no entries: "
                "TORCH_FR_BUFFER_SIZE or TORCH_NCCL_TRACE_BUFFER_SIZE is 0 in their environment); the rank named is "
                "the one seen first, which may be one that waited for another")
    if verdict.ranks == 0 and not verdict.died:
        return ("no rank's flight recorder could be read (workers started cold, or torch not preloaded: "
                "docs/hangs.md)")
    return verdict.reason()
