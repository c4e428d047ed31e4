"""`runner job.yaml` / `runner run job.yaml`: run the job on this node, print the summary, exit with its code."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

from runner.cli.command import Command, add_spec_argument, load
from runner.outcomes import Outcome

if TYPE_CHECKING:
    from runner.core.context import Context


class RunCommand(Command):
    """Run the job on this node."""

    name = "run"
    help = "run the job on this node (the default: `runner job.yaml`)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """spec, --node, --advertise-addr."""
        add_spec_argument(parser)
        parser.add_argument(
            "--node", help="this node's id (default: $RUNNER_NODE, $SLURM_NODEID, pod index, hostname)"
        )
        parser.add_argument("--advertise-addr", help="address other nodes reach this one at (multi-node)")
        loud = parser.add_mutually_exclusive_group()
        loud.add_argument("-q", "--quiet", action="store_true", help="console: only warnings, errors and the summary")
        loud.add_argument("-v", "--verbose", action="store_true", help="console: every event, debug included")

    def run(self, args: argparse.Namespace) -> int:
        """Exit code per README "Exit codes"."""
        import asyncio

        from runner.agent import agent
        from runner.config.preflight import require
        from runner.core.context import Context
        from runner.observe import logs, logs_dir

        spec = load(args.spec)
        require(spec, args.spec)  # what the spec needs from this machine: exit 2 before anything is created
        logs.configure(spec.logs.format, verbosity="quiet" if args.quiet else "verbose" if args.verbose else "normal")
        spec = logs_dir.choose(spec, args.spec)  # a full logs.dir: this run's logs go to the temp dir
        ctx = asyncio.run(agent.run(spec, node=args.node, advertise_addr=args.advertise_addr))
        # The console may be gone (`| head`, a closed terminal): the summary is then lost, never the exit code.
        with contextlib.suppress(OSError):
            if isinstance(ctx, Context):
                print_summary(ctx)
            else:
                print("\n".join([*ctx.summary(), *disk_warnings(())]), file=sys.stderr)
        # Every worker is reaped and every file closed by now: skip the interpreter's teardown (tens of ms).
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError):
                stream.flush()
        os._exit(int(ctx.exit_code))


def print_summary(ctx: Context) -> None:
    """The short report a human reads at the end: outcome, attempts, each root cause, where the logs are."""
    attempts = ctx.run.attempt + 1
    out = sys.stderr
    print(
        f"runner: job '{ctx.spec.name}' {ctx.outcome} after {attempts} attempt(s), "
        f"{ctx.run.restarts} restart(s); exit code {ctx.exit_code}",
        file=out,
    )
    failures = ctx.run.failures  # SHUTDOWN adds a fatal failure that skipped FAILED
    for f in failures[:-1]:
        print(f"runner:   attempt {f.attempt}: {f.reason}", file=out)
    if failures and ctx.outcome is not Outcome.SUCCEEDED:
        print("runner: " + failures[-1].report().replace("\n", "\nrunner: "), file=out)
    elif failures:
        print(f"runner:   attempt {failures[-1].attempt}: {failures[-1].reason}", file=out)
    if recovered := ctx.recovery.line():
        print(f"runner: {recovered}", file=out)
    from runner.system import soft_io  # structlog: only a run needs it (`runner validate` never imports it)

    details = "details above" if "agent_log_write_failed" in soft_io.failures() else "details in agent.jsonl"
    for warning in ctx.warnings.seen:
        what = warning.replace("_", " ")
        print(f"runner: warning: {what} (the job's result stands; {details})", file=out)
    for line in disk_warnings(ctx.warnings.seen):
        print(line, file=out)
    print(f"runner: logs: {ctx.inputs.run_dir}", file=out)
    if ctx.report_path is None:
        print("runner: warning: report.json could not be written anywhere", file=out)
    elif ctx.report_path.parent != ctx.inputs.run_dir:
        print(f"runner: report: {ctx.report_path} (the run dir could not take it)", file=out)


def disk_warnings(seen: Iterable[str]) -> list[str]:
    """A line per kind of write the disk refused (runner/system/soft_io.py) that is not among `seen` already."""
    from runner.system import soft_io

    skip = set(seen)
    return [f"runner: warning: {kind.replace('_', ' ')}: {detail} (the job's result stands)"
            for kind, detail in soft_io.failures().items() if kind not in skip]
