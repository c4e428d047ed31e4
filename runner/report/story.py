"""What happened in a run, read back from its run dir(s): states, attempts, each worker's life, failures, restarts.

Inputs per node's run dir: `transitions.jsonl` (the state changes), `agent.jsonl` (worker_started / worker_exited
with pids and ranks), `attempt_<k>/failure.json` and `report.json` (root causes, tracebacks, stacks). Several run
dirs (one per node of an etcd job) merge into one story. Every file is read with a size bound; junk lines are
skipped.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from runner.json_types import JSONObject
from runner.rundir.layout import RunDir
from runner.rundir.records import FailureRecord, Report

MAX_FILE_BYTES = 64 * 1024 * 1024  # a JSON-lines file is read up to this size
MAX_JSON_BYTES = 8 * 1024 * 1024  # report.json, failure.json
KEPT = frozenset({"run_started", "transition", "worker_started", "worker_exited", "failure", "workers_stopping"})


@dataclass
class Transition:
    """One state change of one node."""

    time: float
    src: str
    dst: str
    trigger: str
    reason: str
    attempt: int
    outcome: str = ""


@dataclass
class Segment:
    """A stretch of time one node spent in one state."""

    state: str
    start: float
    end: float
    attempt: int


@dataclass
class WorkerLife:
    """One worker process: from its start to its exit (or to the runner stopping it)."""

    rank: int
    local_rank: int
    pid: int
    attempt: int
    start: float
    end: float | None = None
    exit_code: int | None = None  # None: stopped by the runner, or still running when the logs end

    @property
    def how(self) -> str:
        """How it ended: ok, failed or stopped."""
        if self.exit_code is None:
            return "stopped"
        return "ok" if self.exit_code == 0 else "failed"


@dataclass
class Restart:
    """An attempt that ended without ending the run, and how long until workers ran again."""

    node: str
    attempt: int
    trigger: str
    cause: str
    at: float
    running_again: float | None
    measured: JSONObject = field(default_factory=dict)  # the agent's own figures (report.json `recoveries`)

    @property
    def recovery_s(self) -> float | None:
        """Seconds from the end of the attempt to the next RUNNING (None: it never ran again)."""
        return None if self.running_again is None else self.running_again - self.at

    def measured_s(self, phase: str) -> float | None:
        """Failure -> every worker of the next attempt `phase` ("running", "ready"), as the agent measured it."""
        value = self.measured.get(f"{phase}_s")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass
class NodeStory:
    """One node's run dir, read."""

    node: str
    job: str
    run_dir: str
    transitions: list[Transition] = field(default_factory=list)
    workers: list[WorkerLife] = field(default_factory=list)
    failures: list[FailureRecord] = field(default_factory=list)
    report: Report = field(default_factory=Report)
    start: float = 0.0
    end: float = 0.0

    def segments(self) -> list[Segment]:
        """The states one after the other; the last one lasts until the end of the node's story."""
        out: list[Segment] = []
        state, since, attempt = "INIT", self.start, 0
        for t in self.transitions:
            out.append(Segment(state, since, t.time, attempt))
            state, since, attempt = t.dst, t.time, t.attempt
        out.append(Segment(state, since, max(since, self.end), attempt))
        return [s for s in out if s.end > s.start or s.state == "SHUTDOWN"]

    def restarts(self) -> list[Restart]:
        """Every attempt that left RUNNING for FAILED or RESTARTING, with the time to the next RUNNING."""
        out = []
        for i, t in enumerate(self.transitions):
            if t.src != "RUNNING" or t.dst not in ("FAILED", "RESTARTING"):
                continue
            later = self.transitions[i + 1 :]
            if any(x.dst == "SHUTDOWN" and x.src == "FAILED" for x in later[:1]):
                continue  # the policy gave up: not a restart
            again = next((x.time for x in later if x.dst == "RUNNING"), None)
            out.append(Restart(self.node, t.attempt, t.trigger, self.cause(t.attempt) or t.reason, t.time, again,
                               self.recovery(t.attempt + 1)))
        return out

    def recovery(self, attempt: int) -> JSONObject:
        """report.json's record of the recovery that started `attempt` ({} when the agent recorded none)."""
        found = self.report.extra.get("recoveries")
        for r in found if isinstance(found, list) else []:
            if isinstance(r, dict) and r.get("attempt") == attempt:
                return r
        return {}

    def cause(self, attempt: int) -> str:
        """The recorded root cause of `attempt`, if any."""
        return next((f.reason for f in self.failures if f.attempt == attempt), "")

    def attempts(self) -> list[tuple[int, float, float, str]]:
        """(attempt, start, end, how it ended) for every attempt of this node."""
        spans: dict[int, list[float]] = {}
        ends: dict[int, str] = {}
        for seg in self.segments():
            span = spans.setdefault(seg.attempt, [seg.start, seg.end])
            span[0], span[1] = min(span[0], seg.start), max(span[1], seg.end)
        for t in self.transitions:
            if t.src == "RUNNING" or t.dst == "SHUTDOWN":
                ends[t.attempt] = f"{t.trigger}: {t.reason}" if t.reason else t.trigger
        return [(k, a, b, ends.get(k, "")) for k, (a, b) in sorted(spans.items())]

    @property
    def outcome(self) -> str:
        """The node's outcome (succeeded, failed, stopped, error), or 'running' when its run has not ended."""
        if self.report.outcome:
            return self.report.outcome
        last = self.transitions[-1] if self.transitions else None
        return (last.outcome or "stopped") if last and last.dst == "SHUTDOWN" else "running"


@dataclass
class Story:
    """Every node of one run of one job."""

    nodes: list[NodeStory]
    groups: list[JSONObject] = field(default_factory=list)  # replica groups: report.json's `groups`

    @property
    def job(self) -> str:
        """The job's name."""
        return self.nodes[0].job if self.nodes else "?"

    @property
    def start(self) -> float:
        """When the first node started."""
        return min(n.start for n in self.nodes)

    @property
    def end(self) -> float:
        """When the last node's story ends."""
        return max(n.end for n in self.nodes)

    def outcome(self) -> str:
        """The job's outcome: the worst of its nodes' (failed > error > stopped > running > succeeded)."""
        order = ["failed", "error", "stopped", "running", "succeeded"]
        found = {n.outcome for n in self.nodes}
        return next((o for o in order if o in found), min(found) if found else "unknown")

    def root_cause(self) -> tuple[str, FailureRecord] | None:
        """(node, failure) that explains the run: the last attempt's first failure not merely caused by a peer."""
        found = [(n.node, f) for n in self.nodes for f in n.failures]
        if not found:
            return None
        last = max(f.attempt for _, f in found)
        candidates = [(node, f) for node, f in found if f.attempt == last]
        own = [(node, f) for node, f in candidates if f.kind != "peer"]
        return (own or candidates)[0]


def read_story(run_dirs: list[Path]) -> Story:
    """Read every run dir (one per node) into one Story; a run with replica groups shows each group as a lane."""
    lanes: list[Path] = []
    groups: list[JSONObject] = []
    for d in map(Path, run_dirs):
        inner = RunDir(d).groups()
        lanes += [g.root for g in inner if g.root.is_dir()] or [d]
        listed = report.groups if RunDir(d).has_groups() and (report := read_report(RunDir(d))) else None
        groups += listed or []
    return Story(sorted((read_node(lane) for lane in lanes), key=lambda n: n.node), groups)


def read_node(run_dir: Path) -> NodeStory:
    """One node's run dir."""
    story = NodeStory(node="?", job="?", run_dir=str(run_dir))
    story.report = read_report(RunDir(run_dir)) or Report()
    events = list(json_lines(RunDir(run_dir).agent_log))
    transitions = [e for e in json_lines(RunDir(run_dir).transitions) if e.get("event", "transition") == "transition"]
    if not transitions:  # an older run, or a damaged file: agent.jsonl has them too
        transitions = [e for e in events if e.get("event") == "transition"]
    story.transitions = [t for t in (to_transition(e) for e in transitions) if t is not None]
    first = next((e for e in [*events, *transitions] if e.get("job")), {})
    story.job = str(story.report.job or first.get("job") or run_dir.parent.name)
    story.node = str(story.report.node or first.get("node") or "?")
    story.workers = worker_lives(events, story.transitions)
    story.failures = failures(run_dir, story.report)
    times = [t.time for t in story.transitions] + [w.start for w in story.workers]
    times += [w.end for w in story.workers if w.end is not None]
    times += [s for s in (stamp(e) for e in events) if s is not None]
    story.start = min(times) if times else run_dir.stat().st_mtime
    story.end = max(times) if times else story.start
    for w in story.workers:
        if w.end is None and story.outcome == "running":
            w.end = max(story.end, time.time())
    return story


def worker_lives(events: list[JSONObject], transitions: list[Transition]) -> list[WorkerLife]:
    """Each worker from worker_started to worker_exited (by pid); one the runner stopped ends with its group."""
    lives: dict[int, WorkerLife] = {}
    attempt = 0
    for e in events:
        kind = e.get("event")
        if kind == "transition" and isinstance(number := e.get("attempt"), int):
            attempt = number
        when, pid = stamp(e), e.get("pid")
        if when is None or not isinstance(pid, int):
            continue
        if kind == "worker_started":
            rank, local = e.get("rank"), e.get("local_rank", e.get("rank"))
            if isinstance(rank, int) and isinstance(local, int):
                lives[pid] = WorkerLife(rank, local, pid, attempt, when)
        elif kind == "worker_exited" and pid in lives and isinstance(code := e.get("exit_code"), int):
            lives[pid].end, lives[pid].exit_code = when, code
    for w in lives.values():
        if w.end is None:  # stopped with its group: at the next group restart or the shutdown
            w.end = next((t.time for t in transitions if t.time >= w.start and t.dst in ("RENDEZVOUS", "SHUTDOWN")),
                         None)
    return sorted(lives.values(), key=lambda w: (w.local_rank, w.start))


def failures(run_dir: Path, report: Report) -> list[FailureRecord]:
    """Every failure: report.json's list, else each attempt_<k>/failure.json."""
    if report.failures:
        return list(report.failures)
    return [f for p in RunDir(run_dir).failures() if (f := FailureRecord.read(p, MAX_JSON_BYTES)) is not None]


def to_transition(e: JSONObject) -> Transition | None:
    """A transition event as a Transition (None when a field is missing or mistyped)."""
    time_ = e.get("time")
    when = time_ if isinstance(time_, int | float) else stamp(e)
    src, dst, trigger = e.get("src"), e.get("dst"), e.get("trigger")
    if when is None or not isinstance(src, str) or not isinstance(dst, str) or not isinstance(trigger, str):
        return None
    attempt = e.get("attempt")
    return Transition(float(when), src, dst, trigger, str(e.get("reason") or ""),
                      attempt if isinstance(attempt, int) else 0,
                      str(e.get("outcome") or ""))


def stamp(e: JSONObject) -> float | None:
    """Epoch seconds of an event's ISO `timestamp`."""
    value = e.get("timestamp")
    if not isinstance(value, str):
        return None
    try:
        return dt.datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def json_lines(path: Path) -> Iterator[JSONObject]:
    """The JSON objects of a JSON-lines file (its first MAX_FILE_BYTES), skipping what does not parse."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES)
    except OSError:
        return
    for raw in data.splitlines():
        try:
            item = json.loads(raw)
        except ValueError:
            continue
        if isinstance(item, dict) and item.get("event", "transition") in KEPT:
            yield item


def read_report(run_dir: RunDir) -> Report | None:
    """A run dir's report.json (None: none yet, or damaged)."""
    return Report.read(run_dir.report, MAX_JSON_BYTES)
