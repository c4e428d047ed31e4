"""`runner runs [JOB] [-n N] [--json]`: this user's recent runs on this machine, newest last, from any directory."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from runner.cli.command import Command


class RunsCommand(Command):
    """List recent runs."""

    name = "runs"
    help = "list your recent runs (job, node, start, state, outcome, run dir) from the runs index"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Optional job name, -n, --json."""
        parser.add_argument("job", nargs="?", help="only the runs of this job")
        parser.add_argument("-n", "--limit", type=int, default=20, help="how many runs (default 20)")
        parser.add_argument("--json", action="store_true", help="machine-readable output")

    def run(self, args: argparse.Namespace) -> int:
        """Print the table (or JSON lines)."""
        from runner.rundir.layout import index_path
        from runner.runs import index as runs_index
        from runner.runs.status import pid_alive

        runs = runs_index.read()
        if args.job:
            runs = [r for r in runs if r.job == args.job]
        runs = runs[-max(1, args.limit):]
        rows: list[dict[str, Any]] = []
        for r in runs:
            state = "ended" if r.ended is not None else "running" if pid_alive(r.pid) else "gone"
            rows.append({
                "job": r.job, "node": r.node, "started": r.started, "state": state,
                "outcome": r.outcome or "-", "exit_code": r.exit_code, "attempts": r.attempts,
                "restarts": r.restarts, "run_dir": r.run_dir,
            })
        if args.json:
            for row in rows:
                print(json.dumps(row))
            return 0
        if not rows:
            print(f"no runs yet in {index_path()}")
            return 0
        table: list[tuple[str, ...]] = [("JOB", "NODE", "STARTED", "STATE", "OUTCOME", "RUN DIR")]
        table += [
            (str(r["job"]), str(r["node"]), time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(r["started"]))),
             str(r["state"]), str(r["outcome"]), str(r["run_dir"]))
            for r in rows
        ]
        widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
        for line in table:
            print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
        return 0
