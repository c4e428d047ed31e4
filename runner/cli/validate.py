"""`runner validate job.yaml`: check a spec and report every problem at once (exit 2)."""

from __future__ import annotations

import argparse

from runner.cli.command import Command, add_spec_argument, load


class ValidateCommand(Command):
    """Check a job spec."""

    name = "validate"
    help = "check a job spec and report every problem"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Spec."""
        add_spec_argument(parser)

    def run(self, args: argparse.Namespace) -> int:
        """0 and one line when the spec is valid; a SpecError (exit 2) otherwise."""
        spec = load(args.spec)
        print(f"{args.spec}: ok (job '{spec.name}', {spec.nodes.min}-{spec.nodes.max} node(s) x {spec.nproc_per_node})")
        return 0
