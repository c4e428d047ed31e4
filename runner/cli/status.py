"""`runner status job.yaml [--json]`: the job's state, nodes and workers, while it runs and after."""

from __future__ import annotations

import argparse
import json

from runner.cli.command import Command, add_spec_argument, load


class StatusCommand(Command):
    """Show the job's state."""

    name = "status"
    help = "show the job's state, nodes and workers (while it runs and after)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """spec, --json."""
        add_spec_argument(parser)
        parser.add_argument("--json", action="store_true", help="machine-readable output")

    def run(self, args: argparse.Namespace) -> int:
        """Print the status as a table or JSON."""
        from runner.control import read_status

        status = read_status(load(args.spec))
        if args.json:
            print(json.dumps(status, indent=2, default=str))
            return 0
        head = {k: v for k, v in status.items() if k != "nodes"}
        print("  ".join(f"{k}={v}" for k, v in head.items()))
        for node in status.get("nodes", []):
            workers = ", ".join(
                f"rank {w.get('rank')} pid {w.get('pid')}"
                + (f" exit {w['exit_code']}" if w.get("exit_code") is not None else "")
                for w in node.get("workers", [])
            )
            print(f"  node {node.get('node')}: {node.get('state')} attempt {node.get('attempt')}  [{workers}]")
        return 0
