"""`runner validate job.yaml`: check a spec and report every problem at once (exit 2).

What `runner run` refuses before it starts anything (the script exists, the program is on PATH, logs.dir is
writable...) is refused here too, with the same message from the same check (runner/config/preflight.py), except
a finding that may hold on the node the job runs on (a field that depends on a `${VAR}`, a spec with a `cluster`
section): that one is a warning saying why, and does not change the exit code.
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
        from runner.config.preflight import validate

        spec, doc = load_spec_document(args.spec, devices_here=False)  # gpu: counted where it runs (a warning here)
        findings = [*validate(spec, args.spec, doc),  # what run would refuse: a SpecError, the same text
                    *((p, "a cluster layout this machine cannot confirm") for p in validate_warnings(spec, doc))]
        for problem, why in findings:
            where = ":".join(str(part) for part in (args.spec, problem.line, problem.column) if part is not None)
            fix = f" — {problem.fix}" if problem.fix else ""
            print(f"{where}: warning: {problem.path}: {problem.message}{fix} (not refused: {why})", file=sys.stderr)
        groups = spec.replica_groups
        shape = (f"{groups.count} replica group(s) of {groups.nodes_per_group} node(s) x {groups.nproc_per_node}"
                 if groups is not None else f"{spec.nodes.min}-{spec.nodes.max} node(s) x {spec.nproc_per_node}")
        print(f"{args.spec}: ok (job '{spec.name}', {shape})")
        return 0
