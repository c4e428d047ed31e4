"""`runner status job.yaml|JOB [--json] [--watch]`: the job's state, nodes and workers, while it runs and after.

A job name works from any directory: the per-user runs index (runner/runs/index.py) knows where its run dir is.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from runner.cli.command import Command

MIN_INTERVAL = 0.2  # seconds: --watch never refreshes faster


class StatusCommand(Command):
    """Show the job's state."""

    name = "status"
    help = "show the job's state, nodes and workers (while it runs and after)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Target (spec or job name), --json, --watch, --interval."""
        parser.add_argument("spec", metavar="job.yaml|JOB|RUN_DIR",
                            help="job spec (YAML), a job name from `runner runs`, or a run dir")
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        parser.add_argument("-w", "--watch", action="store_true", help="refresh a live table until the job ends")
        parser.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (--watch)")

    def run(self, args: argparse.Namespace) -> int:
        """Print the status as a table or JSON (once, or until the job ends with --watch)."""
        from runner.runs.status import read

        if args.watch:
            return watch(args.spec, max(MIN_INTERVAL, args.interval))
        status = read(args.spec, note=to_stderr)
        if args.json:
            print(json.dumps(status, indent=2, default=str))
            return 0
        print_status(status)
        return 0


def print_status(status: dict[str, Any]) -> None:
    """The one-shot text form: a header line, then one line per node (and its replica groups, if any)."""
    from runner.runs.status import ettr, ettr_legend, groups_table, ledger_table, ledgers_of, unhealthy_reasons

    head = {k: v for k, v in status.items() if k not in TABLED}
    print("  ".join(f"{k}={plain(v)}" for k, v in head.items()))
    for group in status.get("groups") or []:  # replica groups on several nodes: each group's own rendezvous
        print(f"  group {plain(group.get('group'))}: {plain(group.get('status'))} round {plain(group.get('round'))}  "
              f"world size {plain(group.get('world_size'))}  restarts {plain(group.get('restarts'))}")
    for node in status.get("nodes", []):
        workers = ", ".join(
            f"rank {plain(w.get('rank'))} pid {plain(w.get('pid'))}"
            + (f" exit {w['exit_code']}" if w.get("exit_code") is not None else "")
            for w in node.get("workers") or [] if isinstance(w, dict)
        )
        group = f" (group {node['group']})" if node.get("group") is not None else ""
        shown = f"  ETTR {ettr(node['ledger'])}" if isinstance(node.get("ledger"), dict) else ""  # docs/goodput.md
        print(f"  node {plain(node.get('node'))}{group}: {node_state(node)}"
              + (f"  [{workers}]" if workers else "") + shown)
        for reason in unhealthy_reasons(node):  # out of the round until its health checks pass (docs/health.md)
            print(f"    unhealthy: {reason}")
        for line in groups_table(node.get("groups")):
            print(f"    {line}" if line else "")
    for line in ettr_legend(ledgers_of(status)):  # ETTR spelt out once, under the lines that show it
        print(f"  {line}")
    for line in ledger_table(status.get("ledger"), time.time()):  # docs/hangs.md
        print(f"  {line}" if line else "")


def node_state(node: dict[str, Any]) -> str:
    """A node's state in words: `RUNNING attempt 1`, `SHUTDOWN (succeeded)`, `SHUTDOWN (died: ...)`; never `None`."""
    text = plain(node.get("state"))
    if node.get("attempt") is not None:
        text += f" attempt {node['attempt']}"
    outcome = node.get("outcome")
    if outcome == "died":  # its guard's mark (runner/rendezvous/etcd/lease_revoke.py): the agent died
        text += " (died: its agent ended without a word; its guard marked it)"
    elif outcome is not None:
        text += f" ({plain(outcome)})"
    return text


TABLED = ("nodes", "groups", "ledger")  # shown as tables below the header line, never as `key=value`


def to_stderr(text: str) -> None:
    """A note beside the status (the other runs of a job name): on stderr, so stdout stays the status alone."""
    print(f"runner: {text}", file=sys.stderr)


def once(say: Callable[[str], None]) -> Callable[[str], None]:
    """`say`, that says each text once (--watch resolves the name at every refresh)."""
    said: set[str] = set()

    def note(text: str) -> None:
        if text not in said:
            said.add(text)
            say(text)

    return note


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
    note = once(to_stderr)
    while True:
        status = read(target, note=note)
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
