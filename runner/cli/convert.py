"""`runner convert -- torchrun [options] script.py [args]`: the job.yaml equivalent to a torchrun command line."""

from __future__ import annotations

import argparse

from runner.cli.command import Command


class ConvertCommand(Command):
    """Convert a torchrun command line."""

    name = "convert"
    help = "print the job.yaml equivalent to a torchrun command line"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The torchrun command line, after `--`."""
        parser.add_argument(
            "torchrun",
            nargs=argparse.REMAINDER,
            help="the torchrun command line, after `--`: runner convert -- torchrun ... train.py",
        )

    def run(self, args: argparse.Namespace) -> int:
        """Print the YAML."""
        from runner.config.torchrun import ConvertError, to_yaml

        argv = args.torchrun[1:] if args.torchrun[:1] == ["--"] else args.torchrun
        if not argv:
            raise ConvertError(
                "no torchrun command line given", "runner convert -- torchrun --nproc-per-node 2 train.py"
            )
        print(to_yaml(argv), end="")
        return 0
