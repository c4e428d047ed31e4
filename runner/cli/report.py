"""`runner report RUN... [-o FILE]`: one self-contained HTML page of a run (timeline, attempts, restarts, causes).

RUN is a run dir, a job's logs folder (its `latest` run), a spec file or a job name (both through the runs
index); several run dirs (one per node of an etcd job) merge into one page. A job name or spec of an etcd job
also takes the other nodes' runs on this machine that overlap the latest one.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from runner.cli.command import Command
from runner.errors import EXIT_SPEC, RunnerError

if TYPE_CHECKING:
    from runner.runs.index import Run


class NoRun(RunnerError):
    """The command line names no run that can be read (exit 2)."""

    exit_code = EXIT_SPEC


class ReportCommand(Command):
    """Write the HTML report of a run."""

    name = "report"
    help = "write one self-contained HTML page of a run: timeline, attempts, restarts, root cause"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """RUN..., -o."""
        parser.add_argument("run", nargs="+", metavar="RUN", help="run dir(s), a job's logs folder, spec or job name")
        parser.add_argument("-o", "--output", help="where to write the page (default: <run dir>/report.html)")

    def run(self, args: argparse.Namespace) -> int:
        """Write the page and print its path."""
        from runner.report.page import render
        from runner.report.story import read_story

        dirs: list[Path] = []
        for target in args.run:
            dirs += [d for d in resolve(target) if d not in dirs]
        page = render(read_story(dirs))
        out = Path(args.output) if args.output else dirs[0] / "report.html"
        try:
            out.write_text(page, encoding="utf-8")
        except OSError as e:
            raise NoRun(f"cannot write {out}: {e.strerror}", fix="pick another place with -o FILE") from e
        print(out)
        return 0


def is_run_dir(path: Path) -> bool:
    """A folder an agent wrote."""
    return (path / "transitions.jsonl").is_file() or (path / "agent.jsonl").is_file()


def resolve(target: str) -> list[Path]:
    """The run dir(s) `target` designates."""
    from runner.runs import index as runs_index
    from runner.runs.status import looks_like_a_file

    path = Path(target).expanduser()
    if path.is_dir():
        for candidate in (path, path / "latest"):
            if is_run_dir(candidate):
                return [candidate.resolve()]
        raise NoRun(f"{target} is not a run dir (no transitions.jsonl or agent.jsonl)",
                    fix="give <logs.dir>/<job>/<run> (`runner runs` lists them)")
    if looks_like_a_file(target):
        from runner.cli.command import load

        spec = load(target)
        runs = runs_index.runs_of(spec.name)
        if not runs:
            latest = Path(spec.logs.dir).expanduser().absolute() / spec.name / "latest"
            if is_run_dir(latest):
                return [latest.resolve()]
        name = spec.name
    else:
        runs, name = runs_index.runs_of(target), target
    if not runs:
        raise NoRun(f"no run of job '{name}' in the runs index ({runs_index.index_path()})",
                    fix="give the run dir itself; `runner runs` lists the runs it knows")
    return [Path(r.run_dir) for r in together(runs)]


def together(runs: list[Run]) -> list[Run]:
    """The latest run and, for an etcd job, the other nodes' runs whose time overlaps it (one per node)."""
    import time

    last = runs[-1]
    if last.backend != "etcd":
        return [last]
    now = time.time()
    picked = {last.node: last}
    for r in reversed(runs[:-1]):
        if r.node not in picked and r.started <= (last.ended or now) and (r.ended or now) >= last.started:
            picked[r.node] = r
    return sorted(picked.values(), key=lambda r: r.node)
