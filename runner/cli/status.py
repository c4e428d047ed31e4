"""`runner status job.yaml|JOB [--json] [--watch]`: the job's state, nodes and workers, while it runs and after.

A job name works from any directory: the per-user runs index (runner/runs/index.py) knows where its run dir is.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from runner.cli.command import Command

MIN_INTERVAL = 0.2  # seconds: --watch never refreshes faster


class StatusCommand(Command):
    """Show the job's state."""

    name = "status"
    help = "show the job's state, nodes and workers (while it runs and after)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Target (spec or job name), --json, --watch, --interval."""
        parser.add_argument("spec", metavar="job.yaml|JOB", help="job spec (YAML), or a job name from `runner runs`")
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        parser.add_argument("-w", "--watch", action="store_true", help="refresh a live table until the job ends")
        parser.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (--watch)")

    def run(self, args: argparse.Namespace) -> int:
        """Print the status as a table or JSON (once, or until the job ends with --watch)."""
        from runner.runs.status import read

        if args.watch:
            return watch(args.spec, max(MIN_INTERVAL, args.interval))
        status = read(args.spec)
        if args.json:
            print(json.dumps(status, indent=2, default=str))
            return 0
        print_status(status)
        return 0


def print_status(status: dict[str, Any]) -> None:
    """The one-shot text form: a header line, then one line per node (and its replica groups, if any)."""
    from runner.runs.status import basis_legend, ettr, groups_table, ledger_table, ledgers_of, unhealthy_reasons

    head = {k: v for k, v in status.items() if k not in TABLED}
    print("  ".join(f"{k}={plain(v)}" for k, v in head.items()))
    for group in status.get("groups") or []:  # replica groups on several nodes: each group's own rendezvous
        print(f"  group {group.get('group')}: {group.get('status')} round {group.get('round')}  "
              f"world size {group.get('world_size')}  restarts {group.get('restarts')}")
    for node in status.get("nodes", []):
        workers = ", ".join(
            f"rank {w.get('rank')} pid {w.get('pid')}"
            + (f" exit {w['exit_code']}" if w.get("exit_code") is not None else "")
            for w in node.get("workers") or []
        )
        group = f" (group {node['group']})" if node.get("group") is not None else ""
        shown = f"  ETTR {ettr(node['ledger'])}" if isinstance(node.get("ledger"), dict) else ""  # docs/goodput.md
        state = f"{node.get('state')} attempt {node.get('attempt')}"
        print(f"  node {node.get('node')}{group}: {state}  [{workers}]{shown}")
        for reason in unhealthy_reasons(node):  # out of the round until its health checks pass (docs/health.md)
            print(f"    unhealthy: {reason}")
        for line in groups_table(node.get("groups")):
            print(f"    {line}" if line else "")
    for line in basis_legend(ledgers_of(status)):
        print(f"  {line}")
    for line in ledger_table(status.get("ledger"), time.time()):  # docs/hangs.md
        print(f"  {line}" if line else "")


TABLED = ("nodes", "groups", "ledger")  # shown as tables below the header line, never as `key=value`


def plain(value: object) -> str:
    """A header value for people: `-` for none, a list of names joined by commas; never a Python repr."""
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ",".join(plain(v) for v in value) or "-"
    if isinstance(value, dict):
        return ",".join(f"{k}:{plain(v)}" for k, v in value.items()) or "-"
    return str(value)


def watch(target: str, interval: float) -> int:
    """Redraw the table every `interval` s until the job ends (on a terminal); otherwise print it on each change.

    A change is a state, an exit, a new event: not the clocks alone, so a log of it stays short.
    """
    from runner.runs.status import ended, read, table, watch_key

    tty = sys.stdout.isatty()
    shown = ""
    while True:
        status = read(target)
        lines = table(status)
        if tty:
            sys.stdout.write("\x1b[H\x1b[2J" + "\n".join(lines) + "\n")
            sys.stdout.flush()
        else:
            key = watch_key(status)  # a change, not the clocks (uptime, "3s ago", the live ETTR)
            if key != shown:
                print("\n".join(lines), flush=True)
                shown = key
        if ended(status):
            return 0
        time.sleep(interval)
