"""Things that happen while workers run.

Sources put them on the agent's one event queue; the RUNNING state awaits the queue and turns the first decisive
event into a trigger.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.hangs import Culprit
from runner.outcomes import FailureClass


@dataclass(frozen=True)
class WorkerExited:
    """A worker process ended (exit_code < 0 means killed by signal -exit_code)."""

    local_rank: int
    rank: int
    pid: int
    exit_code: int
    attempt: int


@dataclass(frozen=True)
class TimerExpired:
    """A file-timer scope (or the heartbeat) of a worker expired; the worker has been signalled."""

    local_rank: int
    rank: int
    pid: int
    scope: str
    overdue_s: float  # how long past its deadline the scope was when the worker was signalled
    stacks: str = ""  # Python stacks captured before the kill, when available
    reason: str = ""
    culprit: Culprit | None = None  # what every rank's flight recorder showed (docs/hangs.md); None: not read


@dataclass(frozen=True)
class StopRequested:
    """The runner was asked to stop: by a signal (signum) or by `runner stop` (signum 0).

    A replica group may also be stopped by the job above it: signum 0, and the job's cause in `reason`.
    """

    signum: int
    graceful: bool
    reason: str = ""  # why, when not a signal's or `runner stop`'s plain request


@dataclass(frozen=True)
class HangQuery:
    """Another node of the round found a hang: read this node's flight recorders and answer (docs/hangs.md)."""

    by: str  # the node that asked


PEER_REPORTED = "reported FAILED"  # PeerLost.why when the peer published its own failure (and charges it)


@dataclass(frozen=True)
class PeerLost:
    """Another node of the job left (its lease expired or it reported FAILED).

    `cause`: the root cause the peer published with its FAILED state (its first failing rank and exception line), so
    that every node's FAILED line and summary name it, not only the peer's.
    """

    node: str
    why: str
    cause: str = ""
    failure_class: FailureClass | None = None  # the class of the peer's own failure, as its FAILED state says

    def to_dict(self) -> dict[str, str]:
        """The JSON form (no `cause` or `class` when there is none): a failure's `peer`, a waiter's published `lost`."""
        return {"node": self.node, "why": self.why, **({"cause": self.cause} if self.cause else {}),
                **({"class": self.failure_class.value} if self.failure_class is not None else {})}


@dataclass(frozen=True)
class MembershipChanged:
    """A node is waiting to join a running job (elastic scale-up)."""

    waiting: tuple[str, ...]


@dataclass(frozen=True)
class DeadlineReached:
    """The job's watchdog.max_run_time passed."""

    max_run_time: float


@dataclass(frozen=True)
class GuardLost:
    """The shepherd (the guard that kills every worker if the agent dies) died and could not be replaced."""

    why: str


@dataclass(frozen=True)
class Fenced:
    """This node is cut off from etcd and every peer of its round (runner/rendezvous/etcd/fence.py).

    Its lease is about to lapse: its workers must stop before the other nodes give their ranks to others.
    """

    why: str


Event = (WorkerExited | TimerExpired | StopRequested | PeerLost | MembershipChanged | DeadlineReached | GuardLost
         | HangQuery | Fenced)
