"""The per-user index of runs: `$XDG_STATE_HOME/runner/runs.jsonl` (default `~/.local/state/runner/runs.jsonl`).

Each agent appends a `start` line when its run dir exists and an `end` line when it stops, so `runner runs`,
`runner status JOB` and `runner report JOB` find a run from any directory. The file is private (0600 in a 0700
folder), appended under a lock, and compacted to the last KEEP_RUNS runs once it passes MAX_BYTES. It is a
convenience: a failure to write it is logged and never stops a job.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runner.rundir.layout import index_path
from runner.system.soft_io import describe, note, write_whole

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

    from runner.config.spec import JobSpec

VERSION = 1
MAX_BYTES = 256 * 1024  # compact past this size
KEEP_RUNS = 200  # runs kept by a compaction
MAX_LINE = 4096  # longer lines are not ours: skipped
READ_BYTES = 2 * MAX_BYTES  # a reader never reads more than this (from the end)


@dataclass(frozen=True)
class Run:
    """One run of one node, as the index knows it."""

    job: str
    node: str
    run_dir: str
    started: float
    pid: int = 0
    backend: str = ""
    ended: float | None = None
    outcome: str | None = None
    exit_code: int | None = None
    attempts: int | None = None
    restarts: int | None = None

    @property
    def key(self) -> tuple[str, str]:
        """What a start and its end have in common."""
        return (self.run_dir, self.node)


def start_line(job: str, node: str, run_dir: Path, backend: str, now: float | None = None) -> dict[str, object]:
    """The line an agent appends when its run starts."""
    return {
        "v": VERSION, "kind": "start", "job": job, "node": node, "run_dir": str(run_dir),
        "backend": backend, "pid": os.getpid(), "time": time.time() if now is None else now,
    }


def end_line(
    node: str, run_dir: Path, outcome: str, exit_code: int, attempts: int, restarts: int, now: float | None = None
) -> dict[str, object]:
    """The line an agent appends when its run ends."""
    return {
        "v": VERSION, "kind": "end", "node": node, "run_dir": str(run_dir), "outcome": outcome,
        "exit_code": exit_code, "attempts": attempts, "restarts": restarts,
        "time": time.time() if now is None else now,
    }


def append(line: Mapping[str, object], path: Path | None = None) -> None:
    """Append one line under an exclusive lock, creating the file 0600; compact it when it grew too big.

    Raises OSError when the index cannot be written (callers log it and go on).
    """
    path = path or index_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        data = (json.dumps(line, default=str, separators=(",", ":")) + "\n").encode()
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data  # a line an earlier full disk cut short stays junk of its own
        write_whole(fd, data)
        if os.fstat(fd).st_size > MAX_BYTES:
            compact(fd, path)
    finally:
        os.close(fd)  # releases the lock


def compact(fd: int, path: Path) -> None:
    """Rewrite the (locked) index with the lines of its last KEEP_RUNS runs, atomically, 0600."""
    size = os.fstat(fd).st_size
    data = os.pread(fd, min(size, READ_BYTES), max(0, size - READ_BYTES))
    lines = data.decode(errors="replace").splitlines()
    keep = {r.key for r in parse(lines)[-KEEP_RUNS:]}
    kept = []
    for raw in lines:
        item = decode(raw)
        if item is not None and (str(item.get("run_dir")), str(item.get("node"))) in keep:
            kept.append(raw)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        try:  # never replace the index with a cut copy: on a full disk it stays as it is, too big
            write_whole(tfd, "".join(line + "\n" for line in kept).encode())
        finally:
            os.close(tfd)
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def decode(raw: str) -> dict[str, object] | None:
    """One index line as a dict, or None for anything that is not one of our lines."""
    if len(raw) > MAX_LINE:
        return None
    try:
        item = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(item, dict) or item.get("v") != VERSION or item.get("kind") not in ("start", "end"):
        return None
    if not isinstance(item.get("run_dir"), str) or not isinstance(item.get("node"), str):
        return None
    return item


def parse(lines: Iterable[str]) -> list[Run]:
    """Every run the lines describe, oldest start first; an end line completes its start; junk is skipped."""
    runs: dict[tuple[str, str], Run] = {}
    for raw in lines:
        item = decode(raw)
        if item is None:
            continue
        run_dir, node = str(item["run_dir"]), str(item["node"])  # text: decode checked them
        key = (run_dir, node)
        if item["kind"] == "start":
            job, started = item.get("job"), item.get("time")
            if isinstance(job, str) and isinstance(started, int | float) and not isinstance(started, bool):
                runs[key] = Run(job=job, node=node, run_dir=run_dir, started=float(started),
                                pid=as_int(item.get("pid")) or 0, backend=str(item.get("backend") or ""))
        elif key in runs:
            run = runs[key]
            ended = item.get("time")
            runs[key] = Run(
                job=run.job, node=run.node, run_dir=run.run_dir, started=run.started, pid=run.pid,
                backend=run.backend, ended=float(ended) if isinstance(ended, int | float) else run.started,
                outcome=str(item.get("outcome") or "unknown"), exit_code=as_int(item.get("exit_code")),
                attempts=as_int(item.get("attempts")), restarts=as_int(item.get("restarts")),
            )
    return sorted(runs.values(), key=lambda r: r.started)


def as_int(value: object) -> int | None:
    """An int field, or None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read(path: Path | None = None) -> list[Run]:
    """The runs in the index (at most the last READ_BYTES of it); none when there is no index yet."""
    path = path or index_path()
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - READ_BYTES))
            data = f.read(READ_BYTES)
    except OSError:
        return []
    return parse(data.decode(errors="replace").splitlines())


def runs_of(job: str, path: Path | None = None) -> list[Run]:
    """Runs of the job called `job`, oldest first."""
    return [r for r in read(path) if r.job == job]


def record_start(job: str, node: str, run_dir: Path, backend: str, log: FilteringBoundLogger) -> None:
    """Append this run's start (failures are logged, never raised)."""
    try:
        append(start_line(job, node, run_dir, backend))
    except OSError as e:
        unwritable(e, log)


def record_end(node: str, run_dir: Path, outcome: str, exit_code: int, attempts: int, restarts: int,
               log: FilteringBoundLogger) -> None:
    """Append this run's end (failures are logged, never raised)."""
    try:
        append(end_line(node, run_dir, outcome, exit_code, attempts, restarts))
    except OSError as e:
        unwritable(e, log)


def unwritable(error: OSError, log: FilteringBoundLogger) -> None:
    """The index could not take a line: a warning the first time (a convenience only; the job goes on)."""
    if note("runs_index_unwritable", index_path(), error):
        log.warning("runs_index_unwritable", path=str(index_path()), error=describe(error))


def announce(spec: JobSpec, node: str, run_dir: Path, log: FilteringBoundLogger) -> None:
    """The run's first event (the console's header: job, node, run dir) and its line in the index."""
    groups = spec.replica_groups
    shape = ({"nproc_per_node": spec.nproc_per_node} if groups is None else  # replica groups: theirs, not the top's
             {"replica_groups": groups.count, "group_workers": groups.nproc_per_node * groups.nodes_per_group,
              "min_active": groups.min_active})
    log.info("run_started", run_dir=str(run_dir), **shape,
             nodes=f"{spec.nodes.min}" if spec.nodes.min == spec.nodes.max else f"{spec.nodes.min}:{spec.nodes.max}",
             backend=spec.rendezvous.backend)
    record_start(spec.name, node, run_dir, spec.rendezvous.backend, log)
