"""`runner reset job.yaml [--force]`: forget an ended etcd job's shared state so its name can run again."""

from __future__ import annotations

import argparse

from runner.cli.command import Command, add_spec_argument, load


class ResetCommand(Command):
    """Reset an ended etcd job."""

    name = "reset"
    help = "forget an ended etcd job's shared state so its name can run again"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """spec, --force."""
        add_spec_argument(parser)
        parser.add_argument("--force", action="store_true", help="even while nodes are live")

    def run(self, args: argparse.Namespace) -> int:
        """Print how many keys were deleted."""
        from runner.runs.control import reset

        print(reset(load(args.spec), args.force))
        return 0
