"""`runner validate job.yaml`: check a spec and report every problem at once (exit 2).

What depends on this machine (the script exists, the program is on PATH, logs.dir is writable...) is
printed as a warning and does not change the exit code: the spec may be meant for another machine. `runner
run` refuses the same findings (runner/config/preflight.py).
"""

from __future__ import annotations

import argparse
import sys

from runner.cli.command import Command, add_spec_argument


class ValidateCommand(Command):
    """Check a job spec."""

    name = "validate"
    help = "check a job spec and report every problem"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Spec."""
        add_spec_argument(parser)

    def run(self, args: argparse.Namespace) -> int:
        """0 and one line when the spec is valid (warnings on stderr); a SpecError (exit 2) otherwise."""
        from runner.config.cluster_checks import validate_warnings
        from runner.config.loader import load_spec_document
        from runner.config.preflight import preflight, required
        from runner.errors import SpecError

        spec, doc = load_spec_document(args.spec, devices_here=False)  # gpu: counted where it runs (a warning here)
        missing = required(spec, doc)  # a feature the spec asks for, whose package is not installed here
        if missing:
            raise SpecError(args.spec, missing)
        for problem in [*preflight(spec, doc), *validate_warnings(spec, doc)]:
            where = ":".join(str(part) for part in (args.spec, problem.line, problem.column) if part is not None)
            fix = f" — {problem.fix}" if problem.fix else ""
            print(f"{where}: warning: {problem.path}: {problem.message}{fix}", file=sys.stderr)
        groups = spec.replica_groups
        shape = (f"{groups.count} replica group(s) of {groups.nodes_per_group} node(s) x {groups.nproc_per_node}"
                 if groups is not None else f"{spec.nodes.min}-{spec.nodes.max} node(s) x {spec.nproc_per_node}")
        print(f"{args.spec}: ok (job '{spec.name}', {shape})")
        return 0
