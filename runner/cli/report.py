"""`runner report RUN... [-o FILE]`: one self-contained HTML page of a run (timeline, attempts, restarts, causes).

RUN is a run dir, a job's logs folder (its `latest` run), a spec file (a local job's: its own logs folder's latest
run, from the directory it ran in) or a job name (through the runs index: runner/runs/resolve.py; the live run or
the newest, the runs of the name elsewhere named on stderr); several run dirs (one per node of an etcd job) merge
into one page. A job name or spec of an etcd job also takes the other nodes' runs of the same job on this machine
that overlap the chosen one.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from runner.cli.command import Command
from runner.errors import EXIT_SPEC, RunnerError


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


def resolve(target: str) -> list[Path]:
    """The run dir(s) `target` designates (a name: through runner/runs/resolve.py, its note on stderr)."""
    from runner.rundir.layout import LATEST, RunDir
    from runner.runs import index as runs_index
    from runner.runs.status import is_run_dir, looks_like_a_file

    path = Path(target).expanduser()
    if path.is_dir():
        for candidate in (path, path / LATEST):
            if is_run_dir(candidate):
                return [candidate.resolve()]
        raise NoRun(f"{target} is not a run dir (no transitions.jsonl or agent.jsonl)",
                    fix="give <logs.dir>/<job>/<run> (`runner runs` lists them)")
    name = target
    if looks_like_a_file(target):
        from runner.cli.command import load

        spec = load(target)
        name = spec.name
        latest = RunDir.latest(spec.logs.dir, name).root
        if is_run_dir(latest) and (spec.rendezvous.backend == "local" or not runs_index.runs_of(name)):
            return [latest.resolve()]  # the spec's own logs folder, from here: its run, not one of the name elsewhere
    return by_name(name)


def by_name(name: str) -> list[Path]:
    """The run dirs of the run a job name means: the live one, or the newest (the others named on stderr)."""
    import sys

    from runner.runs.resolve import resolve as resolve_name

    resolved = resolve_name(name)  # UnknownRun or AmbiguousRun (exit 2) when it names no single run
    if resolved.note():
        print(f"runner: {resolved.note()}", file=sys.stderr)
    return [Path(r.run_dir) for r in sorted(resolved.runs, key=lambda r: r.node)]
