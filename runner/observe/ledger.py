"""The ETTR ledger: a run's wall time split into its launch, productive time, and the time each failure cost.

docs/goodput.md defines every term against Meta's ETTR and Google's runtime goodput. In short, on the agent's
monotonic clock (the event loop's `time()`, the clock of docs/time_to_recover.md):

- the **launch** runs from the agent's start to the first step the workers report (rendezvous, spawn, init, the
  first step);
- a **failure's lost time** runs from the last step reported before it to the moment the next attempt has reached
  that step again, in phases: `lost_work` (last step -> the cause), `detection` (cause -> the agent learnt of it),
  `teardown` (-> the old workers stopped: the policy's decision, the stop, the backoff), `rendezvous` (-> the new
  round complete), `spawn` (-> every worker spawned), `init` (-> every worker ready), `first_step` (-> the first
  step report after the restart), `recompute` (-> the step reported before the failure reached again);
- **productive** time is everything else: the wall time less the launch and every failure's lost time, so
  ETTR = productive / wall.

The phases are consecutive spans of one timeline whose marks are clamped to never go back, so launch + productive
+ the failures' lost time add up to the wall time exactly (each figure is rounded to the millisecond). A run
whose workers report no step is counted on readiness instead (`basis: "ready"`, or `"running"` when no worker
says it is ready either): its launch and recoveries end when the workers are ready, and no work since a step can
be known lost.

Memory is bounded: one record per attempt and per failure, and attempts are bounded by the restart budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from runner.json_types import JSONObject
from runner.observe.recovery import kept, rounded

PHASES = ("lost_work", "detection", "teardown", "rendezvous", "spawn", "init", "first_step", "recompute")
LAUNCH_PHASES = ("rendezvous", "spawn", "init", "first_step")
PRODUCTIVE = "productive"
MAX_FAILURES_SHOWN = 100  # report.json lists this many failures; totals always count them all


@dataclass(frozen=True)
class StepReport:
    """What a worker reported through its heartbeat file: the step it finished and its latest checkpoint's step."""

    step: int
    checkpoint: int | None
    at: float  # monotonic: when the worker wrote it


@dataclass
class Attempt:
    """One attempt's workers, as the ledger saw them."""

    attempt: int
    scope: str
    entered_at: float | None  # RUNNING entered (the round complete); None: spawned without one (scope worker)
    spawned_at: float
    ready_at: float | None = None
    first: StepReport | None = None  # the first step report of this attempt
    last: StepReport | None = None  # the latest
    checkpoint: int | None = None  # the latest checkpoint step reported
    target: int | None = None  # the step to reach again: the last one reported before the failure that preceded it
    caught_up_at: float | None = None  # when it reported a step >= target (its first report when there is no target)


@dataclass
class Interruption:
    """What ended an attempt: a failure (or a membership change), and what was known of the steps then."""

    trigger: str
    failure: dict[str, object]
    cause_at: float  # monotonic: learnt_at less the detection time, where knowable
    learnt_at: float
    detection_known: bool
    last: StepReport | None  # the last step report before it
    checkpoint: int | None
    ended: Attempt  # the attempt it ended
    torn_down_at: float | None = None  # RESTARTING left for a new round
    recovered_by: Attempt | None = None


@dataclass
class Span:
    """One mark of the timeline: `phase` ran until `until`; `owner` is "launch", a failure's index, or None."""

    phase: str
    until: float
    owner: str | int | None


@dataclass
class Ledger:
    """Fed by the agent as things happen; `report(end)` splits [started, end] into the ledger's spans."""

    started: float
    attempts: list[Attempt] = field(default_factory=list)
    interruptions: list[Interruption] = field(default_factory=list)
    current: Attempt | None = None  # the attempt whose workers run now (None between attempts)
    _entered_at: float | None = None  # RUNNING entered, the attempt not spawned yet

    def entered_running(self, at: float) -> None:
        """RUNNING was entered from RENDEZVOUS (the round is complete)."""
        self._entered_at = at

    def torn_down(self, at: float) -> None:
        """RESTARTING was left for a new round: the old workers are stopped and the backoff waited."""
        if self.interruptions and self.interruptions[-1].torn_down_at is None:
            self.interruptions[-1].torn_down_at = at

    def spawned(self, at: float, attempt: int, scope: str) -> None:
        """Every worker of `attempt` is spawned (for scope worker: the replaced one)."""
        new = Attempt(attempt, scope, self._entered_at, at)
        self._entered_at = None
        before = self.interruptions[-1] if self.interruptions else None
        if before is not None and before.recovered_by is None:
            before.recovered_by = new
            new.target = before.last.step if before.last is not None else None
            if scope == "worker" and before.torn_down_at is None:
                before.torn_down_at = at  # no round: the teardown (stop one, backoff) ran until the spawn
        self.attempts.append(new)
        self.current = new

    def ready(self, at: float) -> None:
        """Every worker of the current attempt said it is ready."""
        if (a := self.current) is not None and a.ready_at is None:
            a.ready_at = max(at, a.spawned_at)

    def step(self, report: StepReport) -> None:
        """A step report of the current attempt's workers."""
        a = self.current
        if a is None:
            return
        report = StepReport(report.step, report.checkpoint, max(report.at, a.spawned_at))
        if a.first is None:
            a.first = report
        a.last = report
        if report.checkpoint is not None:
            a.checkpoint = report.checkpoint
        if a.caught_up_at is None and (a.target is None or report.step >= a.target):
            a.caught_up_at = report.at

    def failed(self, learnt_at: float, detection_s: float | None, trigger: str,
               failure: dict[str, object] | None) -> None:
        """The current attempt ended (`trigger`) at `learnt_at`; its cause was `detection_s` before (None: unknown).

        A failure while no attempt runs (a round that timed out before the next attempt) adds nothing: the
        interruption before it goes on until an attempt makes progress again.
        """
        a = self.current
        if a is None:
            return
        detection = max(0.0, detection_s) if detection_s is not None else 0.0
        self.interruptions.append(Interruption(
            trigger, kept(failure) if failure is not None else {}, learnt_at - detection, learnt_at,
            detection_s is not None, a.last, a.checkpoint, a))
        self.current = None

    def classed(self, failure: dict[str, object]) -> None:
        """FAILED classed the latest failure on its evidence: keep its final fields."""
        if self.interruptions:
            self.interruptions[-1].failure = kept(failure)

    @property
    def basis(self) -> str:
        """What marks progress: "steps" once any worker reported one, else "ready", else "running"."""
        if any(a.first is not None for a in self.attempts):
            return "steps"
        if any(a.ready_at is not None for a in self.attempts):
            return "ready"
        return "running"

    def spans(self, end: float) -> list[Span]:
        """The run's timeline, [started, end], as consecutive spans (each `until` >= the one before)."""
        basis = self.basis
        out: list[Span] = []
        owner: str | int | None = "launch"
        ended_by = {id(i.recovered_by): n for n, i in enumerate(self.interruptions) if i.recovered_by is not None}

        def mark(phase: str, until: float | None) -> None:
            if until is None:
                return
            floor = out[-1].until if out else self.started
            out.append(Span(phase, min(max(until, floor), end), owner))

        for k, a in enumerate(self.attempts):
            owner = ended_by.get(id(a), owner if k else "launch")
            mark("rendezvous", a.entered_at)
            mark("spawn", a.spawned_at)
            mark("init", a.ready_at)
            if basis == "steps":
                mark("first_step", a.first.at if a.first is not None else None)
                mark("recompute", a.caught_up_at)
                progressed = a.caught_up_at
            else:
                progressed = a.ready_at if basis == "ready" else a.spawned_at
            stop = next((n for n, i in enumerate(self.interruptions) if i.ended is a), None)
            if progressed is not None:
                owner = None
                if stop is None:
                    mark(PRODUCTIVE, end)
                    continue
                i = self.interruptions[stop]
                mark(PRODUCTIVE, i.last.at if basis == "steps" and i.last is not None else i.cause_at)
            if stop is not None:
                owner = stop
                i = self.interruptions[stop]
                mark("lost_work", i.cause_at)
                mark("detection", i.learnt_at)
                mark("teardown", i.torn_down_at if i.recovered_by is not None else end)
        if not out or out[-1].until < end:  # never spawned, or a last attempt not progressing (yet)
            last = self.attempts[-1] if self.attempts else None
            mark("rendezvous" if last is None else "recompute" if last.first is not None else "first_step", end)
        return out

    def report(self, end: float) -> dict[str, object]:
        """report.json's `ledger`: ETTR, wall / productive / launch / lost seconds, each failure's phases."""
        spans = self.spans(end)
        wall = max(0.0, end - self.started)
        launch = dict.fromkeys(LAUNCH_PHASES, 0.0)
        lost: list[dict[str, float]] = [dict.fromkeys(PHASES, 0.0) for _ in self.interruptions]
        productive, productive_spans, since = 0.0, [], self.started
        for s in spans:
            length = s.until - since
            if s.owner is None:
                productive += length
                if length > 0:
                    productive_spans.append([rounded(since - self.started), rounded(s.until - self.started)])
            elif s.owner == "launch":
                launch[s.phase if s.phase in launch else "first_step"] += length  # recompute: none at the launch
            elif isinstance(s.owner, int):
                lost[s.owner][s.phase] += length
            since = s.until
        failures = [self.failure_entry(i, lost[n]) for n, i in enumerate(self.interruptions)]
        lost_s = sum(sum(p.values()) for p in lost)
        return {
            "basis": self.basis,
            "wall_s": rounded(wall),
            "productive_s": rounded(productive),
            "launch_s": rounded(sum(launch.values())),
            "lost_s": rounded(lost_s),
            "ettr": round(productive / wall, 4) if wall > 0 else None,
            "launch": {k: rounded(v) for k, v in launch.items()},
            "failures": failures[:MAX_FAILURES_SHOWN],
            "failure_count": len(failures),
            "productive_spans": productive_spans[:MAX_FAILURES_SHOWN + 1],
        }

    @staticmethod
    def failure_entry(i: Interruption, phases: dict[str, float]) -> dict[str, object]:
        """One failure's record: what it was, its phases, the steps it cost."""
        nxt = i.recovered_by
        resumed = i.checkpoint
        if resumed is None and nxt is not None and nxt.first is not None:
            resumed = max(0, nxt.first.step - 1)  # its first report comes after one step of its own
        last = i.last.step if i.last is not None else None
        return {
            "trigger": i.trigger,
            "failure_class": i.failure.get("class", i.failure.get("failure_class")),
            "reason": i.failure.get("reason", ""),
            "recovered": nxt is not None,
            "attempt": nxt.attempt if nxt is not None else None,
            "detection_known": i.detection_known,
            "last_step": last,
            "checkpoint": i.checkpoint,
            "resumed_from": resumed,
            "steps_lost": max(0, last - resumed) if last is not None and resumed is not None else None,
            "phases": {k: rounded(v) for k, v in phases.items()},
            "lost_s": rounded(sum(phases.values())),
        }

    def status(self, now: float) -> dict[str, object]:
        """status.json's part: the figures so far, without the failures' details."""
        r = self.report(now)
        return {k: r[k] for k in ("basis", "wall_s", "productive_s", "launch_s", "lost_s", "ettr", "failure_count")}


def job_ledger(groups: list[dict[str, Any]]) -> JSONObject:
    """Replica groups: the job's ledger from its groups' (report.json `ledger` of each, with its `group`).

    The job progresses while ANY group steps (docs/goodput.md), so its productive time is the union of the groups'
    productive spans (seconds from the common start, the supervisor's) within [0, wall_s]; wall_s is the longest
    group's (the supervisor's own wind-down after the last group ended is no part of it).
    """
    wall_s = max((float(g.get("wall_s") or 0.0) for g in groups), default=0.0)
    spans = sorted((float(a), float(b)) for g in groups for a, b in g.get("productive_spans", []))
    productive, reach = 0.0, 0.0
    first: float | None = None
    for start, stop in spans:
        a, b = max(start, reach), min(stop, wall_s)
        if b > a:
            productive += b - a
            reach = b
            first = a if first is None else first
    return {
        "wall_s": rounded(wall_s),
        "productive_s": rounded(productive),
        "launch_s": rounded(first if first is not None else wall_s),
        "lost_s": rounded(max(0.0, wall_s - productive - (first if first is not None else wall_s))),
        "ettr": round(productive / wall_s, 4) if wall_s > 0 else None,
        "groups": [{"group": g.get("group"), "ettr": g.get("ettr"), "lost_s": g.get("lost_s"),
                    "failure_count": g.get("failure_count")} for g in groups],
    }


def gauge_values(ledger: Callable[[], Mapping[str, object]] | None) -> tuple[float, float]:
    """(ETTR, lost seconds) of a ledger's report for the metrics' gauges; NaN where unknown.

    The gauges are read on the metrics server's thread: a report that fails mid-update is a NaN for one scrape,
    never a failed scrape.
    """
    try:
        report = ledger() if ledger is not None else {}
        ettr, lost = report.get("ettr"), report.get("lost_s")
        return (float(ettr) if isinstance(ettr, int | float) else math.nan,
                float(lost) if isinstance(lost, int | float) else math.nan)
    except Exception:  # a gauge's callback must never fail the scrape
        return math.nan, math.nan
