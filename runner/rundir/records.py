"""The run dir's records, each written and read through one codec.

report.json (`Report`), status.json (`Status`), attempt_<k>/failure.json and each of a report's failures
(`FailureRecord`).

`to_json` writes what the agent has always written (the same keys, the same meanings: docs/usage.md, docs/goodput.md
and other tools read them); `from_json` reads any version of it: a missing key takes its default, a key of the wrong
type is read as missing, a key this version does not know is kept in `extra` as it was (so a reader never loses what
a newer agent wrote), and text that is not a JSON object is a `RecordError` naming the file, never a traceback.
report.json's ETTR ledger (`LedgerRecord`, each failure's `LedgerFailure`) is typed too (runner/observe/ledger.py
writes it); a hang's verdict and a lost peer inside a failure stay JSON objects (runner/hangs.py and runner/events.py
write them; the report page reads them as it finds them).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, TypeVar

from runner.json_types import JSON, JSONObject
from runner.rundir.layout import RunDir, report_fallbacks
from runner.system.private_files import write_private

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger


R = TypeVar("R")


class RecordError(ValueError):
    """A record's file that is not a JSON object (damaged, cut short, not ours)."""


class NotJSON(RecordError):
    """A record's file that is not JSON at all (cut short while written, or not text)."""


def _str(v: JSON, default: str) -> str:
    return v if isinstance(v, str) else default


def _opt_str(v: JSON) -> str | None:
    return v if isinstance(v, str) else None


def _int(v: JSON, default: int) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def _opt_int(v: JSON) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _float(v: JSON, default: float) -> float:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else default  # type: ignore[arg-type]


def _objects(v: JSON) -> tuple[JSONObject, ...]:
    return tuple(x for x in v if isinstance(x, dict)) if isinstance(v, list) else ()


def _opt_float(v: JSON) -> float | None:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None  # type: ignore[arg-type]


def _seconds(v: JSON) -> dict[str, float] | None:
    """A JSON object of seconds by name (its other values left out); None when it is no object."""
    if not isinstance(v, dict):
        return None
    return {k: s for k, x in v.items() if (s := _opt_float(x)) is not None}


def _opt_objects(v: JSON) -> tuple[JSONObject, ...] | None:
    return _objects(v) if isinstance(v, list) else None


def _strings(v: JSON) -> tuple[str, ...]:
    return tuple(x for x in v if isinstance(x, str)) if isinstance(v, list) else ()


def _object(v: JSON) -> JSONObject | None:
    return v if isinstance(v, dict) else None


def _spans(v: JSON) -> tuple[tuple[float, float], ...] | None:
    """[[start, end], ...] of seconds (a pair that is not two numbers left out); None when it is no list."""
    if not isinstance(v, list):
        return None
    pairs = (tuple(map(_opt_float, s)) for s in v if isinstance(s, list) and len(s) == 2)
    return tuple((a, b) for a, b in pairs if a is not None and b is not None)


def _ledger(v: JSON) -> LedgerRecord | None:
    return LedgerRecord.from_dict(v) if isinstance(v, dict) else None


def parse_object(text: str | bytes, source: str) -> JSONObject:
    """`text` as a JSON object; a RecordError naming `source` when it is not one."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise NotJSON(f"{source}: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise RecordError(f"{source}: not a JSON object (a {type(data).__name__})")
    return data


def read_record(path: Path, parse: Callable[[bytes, str], R], limit: int = -1) -> R | None:
    """The record `parse` makes of the file at `path` (its first `limit` bytes).

    None when there is none, the file cannot be read, or it is damaged (a RecordError).
    """
    try:
        with path.open("rb") as f:
            return parse(f.read(limit), str(path))
    except (OSError, RecordError):
        return None


def _dumps(data: Mapping[str, Any]) -> str:
    return json.dumps(data, indent=2, default=str)


@dataclass(frozen=True)
class FailureRecord:
    """A failed attempt's root cause as written: attempt_<k>/failure.json, and each entry of report.json's `failures`.

    What runner.diagnosis's `Failure.to_dict()` writes, read back typed (the JSON keys are the field names, but
    `class` for `failure_class`); an empty text or a None field is left out when written, as the agent always did.
    """

    kind: str = ""
    reason: str = ""
    attempt: int = 0
    failure_class: str = ""  # JSON "class": the class the restart budgets charged (docs/failure_classes.md)
    rank: int | None = None
    local_rank: int | None = None
    exit_code: int | None = None
    signal: str = ""
    hint: str = ""
    error: str = ""  # torch's error file's message
    traceback: str = ""
    stderr_tail: str = ""
    stacks: str = ""
    log_dir: str = ""
    evidence: str = ""
    detected: str = ""
    culprit_note: str = ""
    fingerprint: str = ""
    group: int | None = None  # a job of replica groups: the group it failed in
    hang: JSONObject | None = None  # the flight recorders' verdict (runner.hangs.Verdict.to_dict())
    peer: JSONObject | None = None  # the lost peer (runner.events.PeerLost.to_dict())
    extra: JSONObject = field(default_factory=dict)  # the failure's own extras (Failure.extra)
    unknown: JSONObject = field(default_factory=dict)  # keys this version does not know, kept as written

    def to_dict(self) -> JSONObject:
        """The JSON object: the fields that say something, then the unknown keys as they were read."""
        out: JSONObject = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "unknown" or value in (None, "", {}):
                continue
            out["class" if f.name == "failure_class" else f.name] = value
        return out | {k: v for k, v in self.unknown.items() if k not in out}

    def to_json(self) -> str:
        """failure.json's text."""
        return _dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, JSON]) -> Self:
        """Read leniently (see the module)."""
        g = data.get
        texts = {f: _str(g(f), "") for f in ("kind", "reason", "signal", "hint", "error", "traceback",
                                             "stderr_tail", "stacks", "log_dir", "evidence", "detected",
                                             "culprit_note", "fingerprint")}
        return cls(**texts, attempt=_int(g("attempt"), 0), failure_class=_str(g("class"), ""),
                   rank=_opt_int(g("rank")), local_rank=_opt_int(g("local_rank")), exit_code=_opt_int(g("exit_code")),
                   group=_opt_int(g("group")), hang=_object(g("hang")), peer=_object(g("peer")),
                   extra=_object(g("extra")) or {},
                   unknown={k: v for k, v in data.items() if k not in KNOWN_FAILURE})

    @classmethod
    def from_json(cls, text: str | bytes, source: str = "failure.json") -> Self:
        """A failure record from its text; RecordError when it is not a JSON object."""
        return cls.from_dict(parse_object(text, source))

    @classmethod
    def read(cls, path: Path, limit: int = -1) -> Self | None:
        """The failure record at `path` (its first `limit` bytes); None when there is none or it is damaged."""
        return read_record(path, cls.from_json, limit)


KNOWN_FAILURE = frozenset({"class"} | {f.name for f in fields(FailureRecord)} - {"failure_class", "unknown"})


@dataclass(frozen=True)
class LedgerFailure:
    """One failure of the ETTR ledger: what it was, the seconds each phase took, the steps it cost (docs/goodput.md)."""

    trigger: str = ""
    failure_class: str | None = None
    reason: str = ""
    recovered: bool = False
    attempt: int | None = None  # the attempt that recovered it
    detection_known: bool = False
    last_step: int | None = None
    checkpoint: int | None = None
    resumed_from: int | None = None
    steps_lost: int | None = None
    phases: dict[str, float] = field(default_factory=dict)
    lost_s: float = 0.0

    def to_dict(self) -> JSONObject:
        """The JSON object, every key written."""
        return {f.name: dict(v) if isinstance(v := getattr(self, f.name), dict) else v for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, JSON]) -> Self:
        """Read leniently (see the module)."""
        g = data.get
        return cls(trigger=_str(g("trigger"), ""), failure_class=_opt_str(g("failure_class")),
                   reason=_str(g("reason"), ""), recovered=g("recovered") is True, attempt=_opt_int(g("attempt")),
                   detection_known=g("detection_known") is True, last_step=_opt_int(g("last_step")),
                   checkpoint=_opt_int(g("checkpoint")), resumed_from=_opt_int(g("resumed_from")),
                   steps_lost=_opt_int(g("steps_lost")), phases=_seconds(g("phases")) or {},
                   lost_s=_float(g("lost_s"), 0.0))


@dataclass(frozen=True)
class LedgerRecord:
    """report.json's `ledger`: a run's wall time split into launch, productive time and what failures cost.

    A node's or group's ledger has a basis, the launch's phases, its failures and its productive spans; a job of
    replica groups' has its groups' figures instead (runner.observe.ledger `job_ledger`). What a ledger does not
    have is None and left out when written.
    """

    basis: str | None = None  # "step", "ready" or "running": what the ledger counted on
    wall_s: float = 0.0
    productive_s: float = 0.0
    launch_s: float = 0.0
    lost_s: float = 0.0
    ettr: float | None = None  # productive / wall; None for a run of no time
    launch: dict[str, float] | None = None  # each launch phase's seconds
    failures: tuple[LedgerFailure, ...] | None = None
    failure_count: int | None = None  # every failure, the listed ones at most runner.observe.ledger's maximum
    productive_spans: tuple[tuple[float, float], ...] | None = None  # seconds from the start
    groups: tuple[JSONObject, ...] | None = None  # a job of replica groups: each group's ETTR, lost_s, failure count
    unknown: JSONObject = field(default_factory=dict)  # keys this version does not know, kept as written

    def to_dict(self) -> JSONObject:
        """The JSON object, in the order the ledger writes it; what it lacks left out."""
        out: JSONObject = {} if self.basis is None else {"basis": self.basis}
        out |= {"wall_s": self.wall_s, "productive_s": self.productive_s, "launch_s": self.launch_s,
                "lost_s": self.lost_s, "ettr": self.ettr}
        if self.launch is not None:
            out["launch"] = dict(self.launch)
        if self.failures is not None:
            out["failures"] = [f.to_dict() for f in self.failures]
        if self.failure_count is not None:
            out["failure_count"] = self.failure_count
        if self.productive_spans is not None:
            out["productive_spans"] = [[a, b] for a, b in self.productive_spans]
        if self.groups is not None:
            out["groups"] = list(self.groups)
        return out | {k: v for k, v in self.unknown.items() if k not in out}

    @classmethod
    def from_dict(cls, data: Mapping[str, JSON]) -> Self:
        """Read leniently (see the module)."""
        g = data.get
        return cls(basis=_opt_str(g("basis")), wall_s=_float(g("wall_s"), 0.0),
                   productive_s=_float(g("productive_s"), 0.0), launch_s=_float(g("launch_s"), 0.0),
                   lost_s=_float(g("lost_s"), 0.0), ettr=_opt_float(g("ettr")), launch=_seconds(g("launch")),
                   failures=(tuple(map(LedgerFailure.from_dict, _objects(g("failures"))))
                             if isinstance(g("failures"), list) else None),
                   failure_count=_opt_int(g("failure_count")),
                   productive_spans=_spans(g("productive_spans")),
                   groups=_opt_objects(g("groups")),
                   unknown={k: v for k, v in data.items() if k not in KNOWN_LEDGER})


KNOWN_LEDGER = frozenset(f.name for f in fields(LedgerRecord)) - {"unknown"}


@dataclass(frozen=True)
class Report:
    """report.json: how a run ended (a job of one group, a replica group's entry, or a job of replica groups)."""

    job: str = ""
    node: str = ""
    outcome: str | None = None
    exit_code: int | None = None
    reason: str | None = None  # a job of replica groups: why it ended
    attempts: int = 0
    restarts: int = 0
    duration_s: float = 0.0
    failures: tuple[FailureRecord, ...] = ()  # each failed attempt's root cause, in order
    groups: tuple[dict[str, Any], ...] | None = None  # a job of replica groups: each group's own report
    ledger: LedgerRecord | None = None  # the ETTR ledger (docs/goodput.md); absent before the ledger existed
    warnings: tuple[str, ...] = ()
    run_dir: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # the rest as written: health, launch, recoveries, standby, ...

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (an optional field left out when None, as before)."""
        head: dict[str, Any] = {"job": self.job, "node": self.node, "outcome": self.outcome,
                                "exit_code": self.exit_code}
        if self.reason is not None:
            head["reason"] = self.reason
        head |= {"attempts": self.attempts, "restarts": self.restarts, "duration_s": self.duration_s,
                 "failures": [f.to_dict() for f in self.failures]}
        tail: dict[str, Any] = {}
        if self.groups is not None:
            tail["groups"] = list(self.groups)
        if self.ledger is not None:
            tail["ledger"] = self.ledger.to_dict()
        tail |= {"warnings": list(self.warnings), "run_dir": self.run_dir}
        return head | {k: v for k, v in self.extra.items() if k not in KNOWN_REPORT} | tail

    def to_json(self) -> str:
        """The file's text."""
        return _dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Read leniently (see the module)."""
        g = data.get
        return cls(job=_str(g("job"), ""), node=_str(g("node"), ""), outcome=_opt_str(g("outcome")),
                   exit_code=_opt_int(g("exit_code")), reason=_opt_str(g("reason")),
                   attempts=_int(g("attempts"), 0), restarts=_int(g("restarts"), 0),
                   duration_s=_float(g("duration_s"), 0.0),
                   failures=tuple(map(FailureRecord.from_dict, _objects(g("failures")))),
                   groups=_opt_objects(g("groups")), ledger=_ledger(g("ledger")), warnings=_strings(g("warnings")),
                   run_dir=_str(g("run_dir"), ""),
                   extra={k: v for k, v in data.items() if k not in KNOWN_REPORT})

    @classmethod
    def from_json(cls, text: str | bytes, source: str = "report.json") -> Self:
        """A report from its text; RecordError when it is not a JSON object."""
        return cls.from_dict(parse_object(text, source))

    @classmethod
    def read(cls, path: Path, limit: int = -1) -> Self | None:
        """The report at `path` (its first `limit` bytes); None when there is none or it is damaged."""
        return read_record(path, cls.from_json, limit)


KNOWN_REPORT = frozenset(f.name for f in fields(Report)) - {"extra"}


@dataclass(frozen=True)
class Status:
    """status.json: a run's live state on this node (also what the etcd backend publishes for `runner status`)."""

    node: str = ""
    state: str = ""
    attempt: int = 0
    restarts: int = 0
    run_id: str = ""
    run_dir: str = ""
    heartbeat: float = 0.0  # epoch seconds of the write
    workers: tuple[JSONObject, ...] = ()  # rank, local_rank, pid, exit_code of the current attempt's
    outcome: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # the rest: agent_pid, cause, lost, launch, ledger, groups, ...

    @property
    def agent_pid(self) -> int | None:
        """The agent's pid (`runner stop` proves it is still this agent with its start time)."""
        return _opt_int(self.extra.get("agent_pid"))

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: node, the agent's identity, state, ... then the rest in the order it was given."""
        identity = {k: v for k, v in self.extra.items() if k.startswith("agent_")}
        rest = {k: v for k, v in self.extra.items() if k not in KNOWN_STATUS and k not in identity}
        return {"node": self.node, **identity, "state": self.state, "attempt": self.attempt,
                "restarts": self.restarts, "run_id": self.run_id, "run_dir": self.run_dir,
                "heartbeat": self.heartbeat, "workers": list(self.workers), "outcome": self.outcome, **rest}

    def to_json(self) -> str:
        """The file's text."""
        return _dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Read leniently (see the module)."""
        g = data.get
        return cls(node=_str(g("node"), ""), state=_str(g("state"), ""), attempt=_int(g("attempt"), 0),
                   restarts=_int(g("restarts"), 0), run_id=_str(g("run_id"), ""), run_dir=_str(g("run_dir"), ""),
                   heartbeat=_float(g("heartbeat"), 0.0), workers=_objects(g("workers")),
                   outcome=_opt_str(g("outcome")), extra={k: v for k, v in data.items() if k not in KNOWN_STATUS})

    @classmethod
    def from_json(cls, text: str | bytes, source: str = "status.json") -> Self:
        """A status from its text; RecordError when it is not a JSON object."""
        return cls.from_dict(parse_object(text, source))


KNOWN_STATUS = frozenset(f.name for f in fields(Status)) - {"extra"}


def write_status(status: Status, run_dir: Path) -> None:
    """<run dir>/status.json (OSError when the disk refuses it)."""
    write_private(RunDir(run_dir).status, status.to_json())


def place_report(report: Report, run_dir: Path, name: str, warn: Callable[..., None],
                 log: FilteringBoundLogger) -> Path | None:
    """<run dir>/report.json, else <state dir>/reports/NAME-report.json, else the temp dir's; where it went.

    The run dir may be full or read-only, and so may the others: each refusal is a warning, None if none took it.
    """
    text = report.to_json()
    elsewhere, no_temp = report_fallbacks(name)
    candidates = [RunDir(run_dir).report, *elsewhere]
    if no_temp is not None:  # no usable temp dir at all
        warn("report_write_failed", path="<temp dir>", error=str(no_temp))
    for path in candidates:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_private(path, text)
        except OSError as e:
            warn("report_write_failed", path=str(path), error=str(e))
            continue
        if path.parent != run_dir:
            log.warning("report_elsewhere", path=str(path))
        return path
    return None
