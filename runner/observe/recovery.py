"""Time to recover: for every restart, failure -> all workers running -> all workers ready (docs/time_to_recover.md).

Every figure is taken on the agent's monotonic clock (the event loop's `time()`, injectable in tests):

- failure: when the agent learnt of it (RUNNING took the worker exit, timer expiry or peer loss off its queue; for
  a failure seen elsewhere, e.g. a rendezvous timeout, the transition that recorded it);
- running: when every worker of the new attempt has been spawned (for `restart.scope: worker`, the one replaced);
- ready: when every one of those workers has said it is ready: the first touch of its heartbeat file, or its first
  file-timer request. A worker that does neither leaves "ready" unknown (None); it is never guessed.

The first launch is recorded the same way from the agent's start and reported apart (`launch`): it is no recovery.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

PHASES = ("running", "ready")  # the label values of runner_time_to_recover_seconds
FAILURE_FIELDS = ("kind", "class", "failure_class", "reason", "rank", "exit_code", "signal")  # kept from to_dict()


@dataclass
class Recovery:
    """One attempt's start: from the failure (the first launch: the agent's start) to running and to ready."""

    attempt: int  # the attempt whose workers were started
    since: float  # monotonic: the failure as the agent learnt of it (the launch: the agent's start)
    since_wall: float  # the same moment in epoch seconds, for humans
    trigger: str = ""  # what ended the attempt before ("" for the launch): worker_failed, timer_expired, ...
    scope: str = "job"  # "job": every worker restarted; "worker": only the failed one replaced; "launch"
    failure: dict[str, object] = field(default_factory=dict)  # kind, class, reason, rank... of the failure
    running_at: float | None = None
    ready_at: float | None = None
    waiting: set[int] = field(default_factory=set)  # local ranks not ready yet
    ready_by: set[str] = field(default_factory=set)  # how the workers said so: "heartbeat", "timer"

    @property
    def running_s(self) -> float | None:
        """Failure -> every worker of the attempt spawned."""
        return None if self.running_at is None else max(0.0, self.running_at - self.since)

    @property
    def ready_s(self) -> float | None:
        """Failure -> every worker of the attempt said it is ready; None while (or if ever) one has not."""
        return None if self.ready_at is None else max(0.0, self.ready_at - self.since)

    def to_dict(self) -> dict[str, object]:
        """The JSON form (report.json, status.json): seconds rounded to the millisecond."""
        out: dict[str, object] = {"attempt": self.attempt, "scope": self.scope}
        if self.scope != "launch":
            out["trigger"] = self.trigger
            out["failure_kind"] = self.failure.get("kind")
            out["failure_class"] = self.failure.get("class", self.failure.get("failure_class"))
            out["reason"] = self.failure.get("reason", "")
            out["failure_at"] = round(self.since_wall, 3)
        else:
            out["launched_at"] = round(self.since_wall, 3)
        out["running_s"] = rounded(self.running_s)
        out["ready_s"] = rounded(self.ready_s)
        out["ready_by"] = sorted(self.ready_by)
        return out


class Recoveries:
    """Records the launch and every recovery of one agent; `observe(phase, seconds)` feeds the metrics.

    The agent calls `seen()` when RUNNING takes an event off its queue, `failed()` when an attempt ends in a
    failure or a membership change, `classed()` once FAILED has classed the failure, `running()` once the next
    attempt's workers are spawned, and `ready()` as each of them says it is ready. A failure the policy gives up
    on is never followed by `running()`: no recovery.
    """

    def __init__(
        self,
        *,
        launched_at: float,
        wall: Callable[[], float] = time.time,
        observe: Callable[[str, float], None] | None = None,
    ) -> None:
        self.launch: Recovery | None = None
        self.restarts: list[Recovery] = []
        self.observe = observe
        self._wall = wall
        self._launched = (launched_at, wall())
        self._seen: float | None = None  # when the last event was taken off the queue
        self._pending: Recovery | None = None  # the failure that ended the current attempt, not restarted yet
        self._current: Recovery | None = None  # the attempt being watched for readiness

    def seen(self, at: float) -> None:
        """An event was taken off the queue at `at`: if it ends the attempt, that is when the agent learnt of it."""
        self._seen = at

    def failed(self, at: float, trigger: str, failure: dict[str, object] | None) -> None:
        """The attempt ended (`trigger`); `failure` is the root cause's to_dict(), None for a membership change.

        `at` is used unless RUNNING saw the deciding event earlier (`seen`).
        """
        since = self._seen if self._seen is not None else at
        self._seen = None
        wall = self._wall() - max(0.0, at - since)
        self._pending = Recovery(attempt=-1, since=since, since_wall=wall, trigger=trigger,
                                 failure=kept(failure) if failure is not None else {})
        self._current = None  # the ended attempt's workers will never all be ready

    def classed(self, failure: dict[str, object]) -> None:
        """FAILED has classed the failure on its evidence (an OOM kill, say): keep its final to_dict()."""
        if self._pending is not None:
            self._pending.failure = kept(failure)

    def running(self, at: float, attempt: int, local_ranks: Iterable[int], *, scope: str = "job") -> Recovery | None:
        """Every worker of `attempt` (those of `local_ranks`) was spawned at `at`. Returns the record, if any."""
        if self._pending is not None:
            rec, self._pending = self._pending, None
            rec.attempt, rec.scope = attempt, scope
            self.restarts.append(rec)
        elif self.launch is None:
            rec = self.launch = Recovery(attempt, self._launched[0], self._launched[1], scope="launch")
        else:
            return None  # workers started with no failure before (nothing of ours does that): not a recovery
        rec.running_at = at
        rec.waiting = set(local_ranks)
        self._current = rec
        self._emit(rec, "running", rec.running_s)
        return rec

    def ready(self, local_rank: int, at: float, source: str) -> Recovery | None:
        """`local_rank` of the current attempt said it is ready at `at`; the record, once every worker has."""
        rec = self._current
        if rec is None or local_rank not in rec.waiting:
            return None
        rec.waiting.discard(local_rank)
        rec.ready_by.add(source)
        if rec.waiting:
            return None
        rec.ready_at = max(at, rec.running_at if rec.running_at is not None else at)
        self._current = None
        self._emit(rec, "ready", rec.ready_s)
        return rec

    def _emit(self, rec: Recovery, phase: str, seconds: float | None) -> None:
        if rec.scope != "launch" and seconds is not None and self.observe is not None:
            self.observe(phase, seconds)

    @property
    def launched_at(self) -> float:
        """Monotonic: the agent's start (the launch's origin)."""
        return self._launched[0]

    @property
    def pending(self) -> Recovery | None:
        """The failure that ended the current attempt, while no attempt was started after it."""
        return self._pending

    @property
    def last(self) -> Recovery | None:
        """The latest recovery (None before the first restart)."""
        return self.restarts[-1] if self.restarts else None

    def summary(self) -> dict[str, object]:
        """Median and max of each phase over the recoveries; `ready_unknown` counts those never ready."""
        out: dict[str, object] = {"count": len(self.restarts)}
        for phase in PHASES:
            values = self.phase_values(phase)
            out[phase] = (
                {"median_s": rounded(median(values)), "max_s": rounded(max(values))} if values else None
            )
        out["ready_unknown"] = self.ready_unknown()
        return out

    def phase_values(self, phase: str) -> list[float]:
        """The seconds to `phase` of every recovery that reached it."""
        return [v for r in self.restarts if (v := getattr(r, f"{phase}_s")) is not None]

    def ready_unknown(self) -> int:
        """How many recoveries were never known ready."""
        return sum(1 for r in self.restarts if r.ready_s is None)

    def report(self) -> dict[str, object]:
        """report.json's part: the launch, every recovery, and their summary."""
        return {
            "launch": self.launch.to_dict() if self.launch is not None else None,
            "recoveries": [r.to_dict() for r in self.restarts],
            "time_to_recover": self.summary(),
        }

    def status(self) -> dict[str, object]:
        """status.json's part: the launch and the last recovery."""
        last = self.last
        return {
            "launch": self.launch.to_dict() if self.launch is not None else None,
            "recovery": last.to_dict() if last is not None else None,
        }

    def line(self) -> str:
        """One line for the summary at the end ("" when nothing restarted)."""
        if not self.restarts:
            return ""
        count, unknown = len(self.restarts), self.ready_unknown()
        parts = [f"{count} recover{'y' if count == 1 else 'ies'}"]
        parts += [f"to {phase} median {round(median(values), 3):.3f} s, max {round(max(values), 3):.3f} s"
                  for phase in PHASES if (values := self.phase_values(phase))]
        if unknown:
            parts.append(f"ready unknown for {unknown} (the workers sent no heartbeat or timer to say they were "
                         "ready: docs/time_to_recover.md)")
        return "time to recover: " + "; ".join(parts)


def kept(failure: dict[str, object]) -> dict[str, object]:
    """The few fields of a failure's to_dict() a recovery shows (no traceback, no stacks)."""
    return {k: failure[k] for k in FAILURE_FIELDS if failure.get(k) is not None}


def median(values: list[float]) -> float:
    """The median of a non-empty list (statistics.median without its 9 ms of imports: fractions, decimal)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def rounded(seconds: float | None) -> float | None:
    """Seconds to the millisecond (None stays None)."""
    return None if seconds is None else round(seconds, 3)
