"""Which run a job name means, from the runs index: never another run of the same name by accident.

A name resolves to the live run of that name (an etcd job's nodes on this machine count as one run); when none is
live, to the newest, and the runs of that name elsewhere (other job folders) are listed so the user sees them; two
live runs of different jobs of one name cannot be told apart, so the name is refused, naming their run dirs. Index
entries whose run dir was moved or deleted are skipped (and named only when nothing else is left).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from runner.config.spec import JobSpec
from runner.errors import EXIT_SPEC, RunnerError
from runner.rundir.layout import RunDir, index_path
from runner.runs import index as runs_index
from runner.runs.control import holds_run_file

MAX_LISTED = 8  # run dirs named in a note or a refusal; the rest are counted


class UnknownRun(RunnerError):
    """The command line names a run nobody recorded (exit 2, like any bad command line)."""

    exit_code = EXIT_SPEC


class AmbiguousRun(RunnerError):
    """A job name that several live runs answer to (exit 2): the user must name one."""

    exit_code = EXIT_SPEC


@dataclass(frozen=True)
class Resolved:
    """The run a name means, and the runs of that name elsewhere.

    `runs`: one, or one per node of an etcd job on this machine, newest last. `others`: from each other job folder
    where a run of that name was, its newest run, newest first.
    """

    job: str
    runs: tuple[runs_index.Run, ...]
    others: tuple[runs_index.Run, ...]

    @property
    def run(self) -> runs_index.Run:
        """The newest run of the chosen ones."""
        return self.runs[-1]

    def note(self) -> str:
        """What to tell the user on stderr when other runs of the name exist ('' when there are none)."""
        if not self.others:
            return ""
        what = "the live run" if any(alive(r) for r in self.runs) else "the newest run"
        listed = "; ".join(f"{r.run_dir} ({state(r)})" for r in self.others[:MAX_LISTED])
        more = f"; and {len(self.others) - MAX_LISTED} more" if len(self.others) > MAX_LISTED else ""
        return (f"job '{self.job}': showing {what}, {self.run.run_dir}; other runs of this name: {listed}{more} "
                "(give a run dir to see one of them)")


def resolve(job: str, path: Path | None = None) -> Resolved:
    """The run `job` names in the index at `path` (default: this user's); UnknownRun or AmbiguousRun otherwise."""
    known = runs_index.runs_of(job, path)
    present = [r for r in known if os.path.isdir(r.run_dir)]
    if not present:
        raise _unknown(job, [r for r in known if r not in present])
    live = [r for r in present if alive(r)]
    if len({place(r) for r in live}) > 1:
        dirs = ", ".join(r.run_dir for r in live[:MAX_LISTED])
        raise AmbiguousRun(f"job name '{job}' is ambiguous: {len(live)} runs of it are live on this machine: {dirs}",
                           fix="give the run dir of the one you mean (or its spec file) instead of the name")
    chosen = live or together(present)
    folders = {job_folder(r) for r in chosen}
    others: dict[str, runs_index.Run] = {}
    for r in reversed(present):  # newest first: the first run seen in a folder is its newest
        if job_folder(r) not in folders:
            others.setdefault(job_folder(r), r)
    return Resolved(job, tuple(chosen), tuple(others.values()))


def _unknown(job: str, stale: list[runs_index.Run]) -> UnknownRun:
    if not stale:
        return UnknownRun(f"no run of job '{job}' in the runs index ({index_path()})",
                          fix="`runner runs` lists the runs it knows; or pass the job's spec file")
    dirs = ", ".join(r.run_dir for r in stale[-MAX_LISTED:])
    return UnknownRun(f"no run of job '{job}' is left: the runs index names {len(stale)}, whose run dir was moved or "
                      f"deleted ({dirs})", fix="give the run dir where it is now, or pass the job's spec file")


def together(runs: list[runs_index.Run]) -> list[runs_index.Run]:
    """The newest run and, for an etcd job, its other nodes' runs of the same job that overlap it (one per node)."""
    last = runs[-1]
    if last.backend != "etcd":
        return [last]
    now, key = time.time(), place(last)
    picked = {last.node: last}
    for r in reversed(runs[:-1]):
        if (r.node not in picked and r.started <= (last.ended or now) and (r.ended or now) >= last.started
                and place(r) == key):
            picked[r.node] = r
    return sorted(picked.values(), key=lambda r: r.started)


def place(run: runs_index.Run) -> tuple[str, ...]:
    """What tells two jobs of one name apart.

    A local run is its own; an etcd job is its etcd and prefix, which every node's run has (its job folder when its
    spec.json cannot be read).
    """
    if run.backend != "etcd":
        return ("local", run.run_dir)
    spec = spec_of_run(run)
    if spec is None:
        return ("etcd", job_folder(run))
    return ("etcd", spec.rendezvous.prefix, *sorted(spec.rendezvous.endpoints))


def job_folder(run: runs_index.Run) -> str:
    """<logs.dir>/<job>: the folder of a job's successive runs from one place."""
    return os.path.dirname(run.run_dir.rstrip("/"))


def alive(run: runs_index.Run) -> bool:
    """Whether the run's agent still runs: not ended, and its pid holds the run's own files open (not a reused pid)."""
    return run.ended is None and pid_alive(run.pid) and holds_run_file(run.pid, os.path.realpath(run.run_dir))


def state(run: runs_index.Run) -> str:
    """`live`, `ended <outcome>`, or `agent gone` (it never wrote its end)."""
    if alive(run):
        return "live"
    return f"ended {run.outcome}" if run.ended is not None else "agent gone"


def pid_alive(pid: object) -> bool:
    """Whether a process with this pid exists (only asks; never signals)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def spec_of_run(run: runs_index.Run) -> JobSpec | None:
    """The resolved spec a run wrote (`<run dir>/spec.json`), to reach its etcd; None when unreadable."""
    from runner.config import load_spec_text
    from runner.errors import SpecError

    path = RunDir(Path(run.run_dir)).spec
    try:
        text = path.read_text(encoding="utf-8")
        return load_spec_text(text, source=str(path), base_dir=run.run_dir, environ={})
    except (OSError, SpecError):
        return None
