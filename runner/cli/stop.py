"""`runner stop job.yaml [--graceful]`: ask every agent of the job to stop."""

from __future__ import annotations

import argparse

from runner.cli.command import Command, add_spec_argument, load


class StopCommand(Command):
    """Stop the job."""

    name = "stop"
    help = "stop every agent of the job"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """spec, --graceful."""
        add_spec_argument(parser)
        parser.add_argument("--graceful", action="store_true", help="let the workers finish; no restart")

    def run(self, args: argparse.Namespace) -> int:
        """Print what was done."""
        from runner.runs.control import request_stop

        print(request_stop(load(args.spec), args.graceful))
        return 0
