"""A run's status from anywhere: find it (spec file or job name, through the runs index), read it, draw the table.

`runner status` and `runner status --watch` use this; the local backend's status lives in `<run dir>/status.json`,
an etcd job's in etcd (runner/runs/control.py reads both).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from runner.errors import RunnerError
from runner.rundir.layout import RunDir
from runner.rundir.records import NotJSON, RecordError, Status
from runner.runs import index as runs_index
from runner.runs.resolve import AmbiguousRun, UnknownRun, pid_alive, resolve, spec_of_run

__all__ = ["AmbiguousRun", "UnknownRun", "pid_alive", "spec_of_run"]  # kept importable from here

LIVE = frozenset({"running", "rendezvous", "stopping", "starting"})
MAX_TAIL = 65536  # bytes of agent.jsonl read to find the last event
MAX_SHOWN_S = 1e7  # a recovery figure beyond this (or negative, or not a number) is junk: shown as '?'
PER_RANK_UP_TO = 4  # more ranks than this are counted, not listed
MAX_REASON_SHOWN = 80  # characters of a health reason in the table's FAILURE column
MAX_LEDGER_ROWS = 64  # nodes of the node ledger shown


def looks_like_a_file(target: str) -> bool:
    """Whether `target` names a spec file rather than a job name."""
    return os.sep in target or target.endswith((".yaml", ".yml", ".json")) or os.path.isfile(target)


def is_run_dir(path: Path) -> bool:
    """A folder an agent wrote."""
    return RunDir(path).is_run_dir()


def local_status(run: runs_index.Run) -> dict[str, Any]:
    """The status of a local-backend run from its run dir, shaped as runner.runs.control.read_status's."""
    from runner.runs.control import local_ledger

    path = RunDir(Path(run.run_dir)).status
    try:
        node = Status.from_json(path.read_bytes(), str(path))
    except (OSError, NotJSON) as e:
        raise RunnerError(f"no status for job '{run.job}' at {path}", fix="the run dir was moved or deleted") from e
    except RecordError as e:
        raise RunnerError(f"unreadable status at {path}", fix="the run dir was damaged") from e
    running = node.state != "SHUTDOWN" and pid_alive(node.agent_pid)
    status = "running" if running else (node.outcome or run.outcome or "unknown (agent gone)")
    return {"job": run.job, "status": status, "backend": "local", "nodes": [node.to_dict()],
            "ledger": local_ledger(spec_of_run(run))}


Note = Callable[[str], None]  # where a resolution's note goes (the CLI: stderr, once)


def read(target: str, note: Note | None = None) -> dict[str, Any]:
    """The status of the job a run dir, a spec file or a job name designates, from whichever directory.

    A name (or a spec whose own logs folder has no run from here) goes through the runs index (runner/runs/
    resolve.py): `note` hears about the other runs of that name.
    """
    from runner.runs.control import read_status

    if os.path.isdir(target) and is_run_dir(Path(target)):
        return status_of(run_at(Path(target)))
    if not looks_like_a_file(target):
        return status_of(chosen(target, note))
    from runner.config import load_spec

    spec = load_spec(target)
    if spec.rendezvous.backend == "etcd":
        return read_status(spec)
    try:
        return read_status(spec)  # this directory's logs.dir, as before
    except RunnerError:
        if not runs_index.runs_of(spec.name):
            raise
        return status_of(chosen(spec.name, note))


def chosen(job: str, note: Note | None) -> runs_index.Run:
    """The run a job name resolves to; its note (the other runs of the name) goes to `note`."""
    resolved = resolve(job)
    if note is not None and resolved.note():
        note(resolved.note())
    return resolved.run


def status_of(run: runs_index.Run) -> dict[str, Any]:
    """The status of one run: an etcd job's from its etcd (through the spec it wrote), a local one's from its dir."""
    from runner.runs.control import read_status

    if run.backend == "etcd":
        resolved = spec_of_run(run)
        if resolved is not None:
            return read_status(resolved)
    return local_status(run)


def run_at(path: Path) -> runs_index.Run:
    """The run whose run dir is `path`: as the index knows it, else as its own files tell (job and backend)."""
    where = os.path.realpath(path)
    for run in reversed(runs_index.read()):
        if os.path.realpath(run.run_dir) == where:
            return run
    guess = runs_index.Run(job=path.parent.name, node="", run_dir=where, started=0.0)
    spec = spec_of_run(guess)
    if spec is None:
        return guess
    return runs_index.Run(job=spec.name, node="", run_dir=where, started=0.0, backend=spec.rendezvous.backend)


def last_event(run_dir: str) -> tuple[str, float | None]:
    """The last event a run's agent logged (name, epoch seconds), from the end of its agent.jsonl."""
    try:
        with RunDir(Path(run_dir)).agent_log.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - MAX_TAIL))
            lines = f.read(MAX_TAIL).decode(errors="replace").splitlines()
    except OSError:
        return "", None
    for raw in reversed(lines):
        try:
            item = json.loads(raw)
        except ValueError:
            continue
        if isinstance(item, dict) and isinstance(item.get("event"), str):
            name = item["event"]
            if name == "transition":
                name = f"→ {item.get('dst')}"
            return name, epoch(item.get("timestamp"))
    return "", None


def epoch(stamp: object) -> float | None:
    """Seconds since the epoch of an ISO timestamp, or None."""
    import datetime as dt

    if not isinstance(stamp, str):
        return None
    try:
        return dt.datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


def duration(seconds: float | None) -> str:
    """1h02m, 3m05s, 42s; '-' when unknown."""
    if seconds is None or seconds < 0:
        return "-"
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def ranks(workers: object) -> str:
    """The workers of a node in a few characters: `0 run · 1 exit 1`, or counts for many ranks."""
    if not isinstance(workers, list) or not workers:
        return "-"
    items = [w for w in workers if isinstance(w, dict)]
    if len(items) > PER_RANK_UP_TO:
        done = [w for w in items if w.get("exit_code") is not None]
        failed = [w for w in done if w.get("exit_code") != 0]
        return f"{len(items)} ranks: {len(items) - len(done)} running, {len(done)} exited ({len(failed)} failed)"
    parts = []
    for w in items:
        code = w.get("exit_code")
        parts.append(f"{w.get('rank')} {'run' if code is None else 'ok' if code == 0 else f'exit {code}'}")
    return " · ".join(parts)


def table(status: Mapping[str, object], now: float | None = None) -> list[str]:
    """The lines of `runner status --watch`: a title, then one row per node."""
    now = time.time() if now is None else now
    known = runs_index.runs_of(str(status.get("job")))
    runs = {r.node: r for r in known}
    by_dir = {r.run_dir: r for r in known}  # a node's own run dir names its run: never another run of the name
    title = f"job {status.get('job')} · {status.get('status')} · {status.get('backend')} · {fmt_clock(now)}"
    if status.get("backend") == "etcd":
        title += f" · round {cell(status.get('round'))} · world {cell(status.get('world_size'))}"
        title += f" · restarts {cell(status.get('restarts'))}"
    head = ("NODE", "STATE", "ATTEMPT", "RESTARTS", "FAILURE", "RANKS", "UPTIME", "RECOVERY", "ETTR", "LAST EVENT")
    rows: list[tuple[str, ...]] = [head]
    for node in objects(status.get("nodes")):
        name = str(node.get("node"))
        run = by_dir.get(str(node["run_dir"])) if node.get("run_dir") else runs.get(name)
        run_dir = str(node.get("run_dir") or (run.run_dir if run else ""))
        event, when = last_event(run_dir) if run_dir else ("", None)
        up = None
        if run is not None:
            up = (run.ended or now) - run.started if node.get("state") != "SHUTDOWN" or run.ended else None
        ago = f" ({duration(now - when)} ago)" if when is not None else ""
        restarts = node.get("restarts", status.get("restarts", "-"))
        rows.append((name, cell(node.get("state")), cell(node.get("attempt")), cell(restarts),
                     failure_class(node), ranks(node.get("workers")), duration(up),
                     recovery(node.get("recovery")), ettr(node.get("ledger")), (event + ago) if event else "-"))
    lines = [title, *aligned(rows)]
    for node in objects(status.get("nodes")):
        lines += groups_table(node.get("groups"))
    return lines + ettr_legend(ledgers_of(status)) + ledger_table(status.get("ledger"), now)


def cell(value: object) -> str:
    """A table cell: '-' for a field that is missing or null (a node its guard marked dead has no attempt)."""
    return "-" if value is None or value == "" else str(value)


def ledger_table(ledger: object, now: float) -> list[str]:
    """The node ledger (docs/hangs.md): each node's own failures by class across runs, its last, when last seen."""
    records = [r for r in ledger if isinstance(r, dict)] if isinstance(ledger, list) else []
    if not records:
        return []
    rows: list[tuple[str, ...]] = [("NODE", "OWN FAILURES", "LAST FAILURE", "LAST SEEN")]
    for rec in sorted(records, key=lambda r: str(r.get("node")))[:MAX_LEDGER_ROWS]:
        raw_counts = rec.get("counts")
        counts = raw_counts if isinstance(raw_counts, dict) else {}
        marks = rec.get("marks") if isinstance(rec.get("marks"), list) else []
        last = marks[-1] if marks and isinstance(marks[-1], dict) else {}
        raw_seen = rec.get("last_seen")
        seen = float(raw_seen) if isinstance(raw_seen, (int, float)) and not isinstance(raw_seen, bool) else None
        failures = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"
        last_line = (f"{last.get('class')}{' (culprit)' if last.get('culprit') else ''}: "
                     f"{str(last.get('reason', ''))[:MAX_REASON_SHOWN]}") if last else "-"
        rows.append((str(rec.get("node")), failures, last_line,
                     f"{duration(now - seen)} ago" if seen is not None else "-"))
    return ["", "node ledger (across runs):", *aligned(rows)]


def aligned(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows as left-aligned columns two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def groups_table(groups: object) -> list[str]:
    """A node's replica groups (docs/replica_groups.md): state, attempt, restarts and the step each committed."""
    if not isinstance(groups, list) or not groups:
        return []
    keys = ("group", "state", "attempt", "restarts", "step", "outcome")
    rows: list[tuple[str, ...]] = [(*(k.upper() for k in keys), "ETTR", "PIDS")]
    rows.extend((*(str(g[k]) if g.get(k) is not None else "-" for k in keys), ettr(g.get("ledger")), pids(g))
                for g in groups if isinstance(g, dict))
    return ["", *aligned(rows)]


def pids(group: Mapping[str, object]) -> str:
    """The pids of a replica group's running workers (`rank:pid`, comma-separated), '-' when none runs."""
    workers = group.get("workers")
    shown = [f"{w.get('rank')}:{w.get('pid')}" for w in workers if isinstance(w, dict) and w.get("exit_code") is None
             and w.get("pid") is not None] if isinstance(workers, list) else []
    if len(shown) > PER_RANK_UP_TO:
        return f"{','.join(shown[:PER_RANK_UP_TO])},+{len(shown) - PER_RANK_UP_TO}"
    return ",".join(shown) or "-"


def failure_class(node: Mapping[str, object]) -> str:
    """The class of a node's last failure (docs/failure_classes.md): its `failure`, else its last recovery's.

    A node out of the round for its health checks shows that instead, with the first reason (docs/health.md).
    """
    reasons = unhealthy_reasons(node)
    if reasons:
        first = reasons[0] if len(reasons[0]) <= MAX_REASON_SHOWN else reasons[0][: MAX_REASON_SHOWN - 3] + "..."
        return f"unhealthy: {first}" + (f" (+{len(reasons) - 1})" if len(reasons) > 1 else "")
    for part, key in (("failure", "class"), ("recovery", "failure_class")):
        value = node.get(part)
        if isinstance(value, dict) and isinstance(value.get(key), str):
            return str(value[key])
    return "-"


def unhealthy_reasons(node: Mapping[str, object]) -> list[str]:
    """Why a node stays out of the round for its health checks (its last failed try), [] when it does not."""
    last = node.get("unhealthy")
    failures = last.get("failures") if isinstance(last, dict) else None
    if not isinstance(failures, list):
        return []
    out = []
    for f in failures:
        if isinstance(f, dict):
            subject = f" {f['subject']}" if f.get("subject") else ""
            out.append(f"{f.get('check')}{subject}: {f.get('reason')}")
    return out


def recovery(rec: object) -> str:
    """A node's last recovery in a few characters: `0.02s running → 1.30s ready` ('?' while unknown)."""
    if not isinstance(rec, dict):
        return "-"
    parts = []
    for phase in ("running", "ready"):
        value = rec.get(f"{phase}_s")
        known = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < MAX_SHOWN_S
        shown = f"{value:.2f}s" if known else "?"
        parts.append(f"{shown} {phase}")
    return " → ".join(parts)


BASES = {  # what ETTR is counted on (docs/goodput.md): shown beside a figure not counted on steps
    "steps": "the steps the workers report",
    "ready": "no step reported: counted from the workers' readiness",
    "running": "no step nor readiness reported: counted from the spawn",
}


def ettr(ledger: object) -> str:
    """A run's ETTR so far, its basis unless steps, the seconds its failures cost (docs/goodput.md).

    `0.93 (lost 3.1s)` on steps; `0.82 [ready]` or `0.82 [running] (lost 0.4s)` otherwise (basis_legend() says
    what the bracket means); '-' without a ledger, '?' for a figure out of range.
    """
    if not isinstance(ledger, dict):
        return "-"
    value, lost = ledger.get("ettr"), ledger.get("lost_s")
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1):
        return "?"
    basis = ledger.get("basis")
    shown = f"{value:.2f}" + (f" [{basis}]" if isinstance(basis, str) and basis in BASES and basis != "steps" else "")
    if isinstance(lost, (int, float)) and not isinstance(lost, bool) and 0 < lost < MAX_SHOWN_S:
        return f"{shown} (lost {lost:.1f}s)"
    return shown


ETTR_MEANING = ("ETTR: effective training time ratio, the share of the run's wall time spent training so far "
                "(1.00: none lost; docs/goodput.md)")


def ettr_legend(ledgers: list[object]) -> list[str]:
    """What ETTR means, once, when a ledger is shown, then what its basis brackets mean (basis_legend)."""
    meaning = [ETTR_MEANING] if any(isinstance(led, dict) for led in ledgers) else []
    return meaning + basis_legend(ledgers)


def basis_legend(ledgers: list[object]) -> list[str]:
    """One line per basis other than steps that the shown ledgers use: what `[ready]` / `[running]` mean."""
    used = {str(led.get("basis")) for led in ledgers if isinstance(led, dict)}
    return [f"ETTR [{b}]: {BASES[b]} (docs/goodput.md)" for b in ("ready", "running") if b in used]


def ledgers_of(status: Mapping[str, object]) -> list[object]:
    """Every ETTR ledger the status shows: each node's, each replica group's."""
    out: list[object] = []
    for node in objects(status.get("nodes")):
        out.append(node.get("ledger"))
        out += [g.get("ledger") for g in objects(node.get("groups"))]
    return out


def watch_key(status: Mapping[str, object]) -> str:
    """What `runner status --watch` off a terminal prints on a change of: the table less its clocks.

    The title's time, UPTIME, the age of the last event and the live totals (ETTR) change every second while
    nothing happens; a state, an attempt, a rank's exit, a recovery, a new last event or a group's step does not.
    """
    nodes = []
    for node in objects(status.get("nodes")):
        run_dir = str(node.get("run_dir") or "")
        nodes.append([node.get("node"), node.get("state"), node.get("attempt"), node.get("restarts"),
                      failure_class(node), ranks(node.get("workers")), recovery(node.get("recovery")),
                      last_event(run_dir)[0] if run_dir else "",
                      [[g.get(k) for k in ("group", "state", "attempt", "restarts", "step", "outcome")]
                       for g in objects(node.get("groups"))]])
    raw = status.get("ledger")
    ledger = raw if isinstance(raw, list) else []
    return json.dumps([status.get("status"), status.get("round"), status.get("world_size"), nodes,
                       [[r.get("node"), r.get("counts")] for r in ledger if isinstance(r, dict)]], default=str)


def objects(value: object) -> list[Mapping[str, object]]:
    """The objects of a list in the status document (anything else in it, or no list, is skipped)."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def fmt_clock(now: float) -> str:
    """HH:MM:SS local time."""
    return time.strftime("%H:%M:%S", time.localtime(now))


def ended(status: Mapping[str, object]) -> bool:
    """Whether the job is over (nothing left to watch)."""
    return str(status.get("status")) not in LIVE
