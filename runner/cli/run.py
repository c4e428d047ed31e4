"""`runner job.yaml` / `runner run job.yaml`: run the job on this node, print the summary, exit with its code."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from runner.cli.command import Command, add_spec_argument
from runner.errors import UsageError


class RunCommand(Command):
    """Run the job on this node."""

    name = "run"
    help = "run the job on this node (the default: `runner job.yaml`)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """spec, --node, --advertise-addr."""
        add_spec_argument(parser)
        parser.add_argument(
            "--node", help="this node's id (default: $RUNNER_NODE, $SLURM_NODEID, pod index, hostname)"
        )
        parser.add_argument("--advertise-addr", help="address other nodes reach this one at (multi-node)")
        loud = parser.add_mutually_exclusive_group()
        loud.add_argument("-q", "--quiet", action="store_true", help="console: only warnings, errors and the summary")
        loud.add_argument("-v", "--verbose", action="store_true", help="console: every event, debug included")

    def run(self, args: argparse.Namespace) -> int:
        """Exit code per README "Exit codes"."""
        import asyncio

        from runner.agent import agent
        from runner.config.loader import load_spec_document
        from runner.config.preflight import require
        from runner.observe import logs, logs_dir

        spec, doc = load_spec_document(args.spec)
        if args.advertise_addr is not None and spec.rendezvous.backend == "local" and spec.replica_groups is None:
            raise UsageError(f"--advertise-addr {args.advertise_addr}: a job of one node (rendezvous.backend local) "
                             "has no other node to reach it: the option would do nothing",
                             "remove --advertise-addr, or set rendezvous.backend: etcd for a job of several nodes")
        require(spec, args.spec, doc)  # what the spec needs from this machine: exit 2 before anything is created
        logs.configure(spec.logs.format, verbosity="quiet" if args.quiet else "verbose" if args.verbose else "normal")
        spec = logs_dir.choose(spec, args.spec)  # a full logs.dir: this run's logs go to the temp dir
        result = asyncio.run(agent.run(spec, node=args.node, advertise_addr=args.advertise_addr))
        # The console may be gone (`| head`, a closed terminal): the summary is then lost, never the exit code.
        with contextlib.suppress(OSError):
            print("\n".join(result.summary), file=sys.stderr)
        # Every worker is reaped and every file closed by now: skip the interpreter's teardown (tens of ms).
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError):
                stream.flush()
        os._exit(int(result.exit_code))

