"""`runner graph`: the agent's state machine as a Mermaid diagram."""

from __future__ import annotations

import argparse

from runner.cli.command import Command


class GraphCommand(Command):
    """Print the state machine."""

    name = "graph"
    help = "print the agent's state machine as a Mermaid diagram"

    def run(self, args: argparse.Namespace) -> int:  # noqa: ARG002 - uniform signature
        """Print the transition table as Mermaid."""
        from runner.core.machine import mermaid

        print(mermaid())
        return 0
