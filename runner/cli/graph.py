"""`runner graph`: the agent's state machine (or, with --job, the machine of a job of replica groups) as Mermaid."""

from __future__ import annotations

import argparse

from runner.cli.command import Command


class GraphCommand(Command):
    """Print a state machine."""

    name = "graph"
    help = "print the agent's state machine as a Mermaid diagram (--job: the replica groups' job machine)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """--job."""
        parser.add_argument("--job", action="store_true",
                            help="the machine of a job of replica groups, above each group's (docs/replica_groups.md)")

    def run(self, args: argparse.Namespace) -> int:
        """Print the transition table as Mermaid."""
        if args.job:
            from runner.core.job_machine import job_mermaid

            print(job_mermaid())
        else:
            from runner.core.machine import mermaid

            print(mermaid())
        return 0
