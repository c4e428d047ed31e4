"""`runner convert -- torchrun [options] script.py [args]`: the job.yaml equivalent to a torchrun command line."""

from __future__ import annotations

import argparse
import os
import sys

from runner.cli.command import Command


class ConvertCommand(Command):
    """Convert a torchrun (or `python -m torch.distributed.run|launch`) command line."""

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
        """Print the YAML on stdout; each note (what differs from torchrun) also on stderr.

        PET_* variables and the other variables torchrun reads come from this environment, and the current
        folder is recorded as the spec's cwd, as torchrun would run from here.
        """
        from runner.config.torchrun import ConvertError, convert, to_yaml

        argv = args.torchrun[1:] if args.torchrun[:1] == ["--"] else args.torchrun
        if not argv:
            raise ConvertError(
                "no torchrun command line given", "runner convert -- torchrun --nproc-per-node 2 train.py"
            )
        environ, cwd = dict(os.environ), os.getcwd()
        _, notes = convert(argv, environ, cwd)
        for note in notes:
            print(f"runner convert: note: {note}", file=sys.stderr)
        print(to_yaml(argv, environ, cwd), end="")
        return 0
