"""`runner plan job.yaml [--json]`: the resolved spec and every rank's argv/env, secrets redacted."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from runner.cli.command import Command, add_spec_argument, load

if TYPE_CHECKING:
    from runner.config.spec import JobSpec

PORT_PLACEHOLDER = 0  # the real MASTER_PORT is picked fresh at every rendezvous round


def plan_view(spec: JobSpec, node: str = "node0") -> dict[str, Any]:
    """The resolved spec plus, for each node of a job of nodes.min nodes, each rank's argv, cwd and env."""
    # Imported here: every `runner` command imports this module (the list of commands), few need these.
    from runner.config.redact import redact, redact_argv, spec_for_disk
    from runner.rendezvous.base import RendezvousResult
    from runner.workers.launch_plan import build_plan

    resolved = spec_for_disk(spec)
    nodes = []
    for group_rank in range(spec.nodes.min):
        result = RendezvousResult(
            round=0,
            node=f"node{group_rank}" if spec.nodes.min > 1 else node,
            group_rank=group_rank,
            group_world_size=spec.nodes.min,
            nproc_per_node=spec.nproc_per_node,
            master_addr=spec.rendezvous.master_addr or "<group rank 0's address>",
            master_port=PORT_PLACEHOLDER,
        )
        plan = build_plan(
            spec, result, attempt=0, run_dir="<run dir>", base_env={}
        )
        ranks = [
            {
                "rank": w.rank,
                "local_rank": w.local_rank,
                "argv": redact_argv(w.argv),
                "cwd": w.cwd,
                "env": {k: redact(k, v) for k, v in w.env},
                "logs": w.log_dir,
            }
            for w in plan.workers
        ]
        nodes.append({"node": result.node, "group_rank": group_rank, "ranks": ranks})
    return {
        "spec": resolved,
        "note": "MASTER_PORT 0 stands for the free port picked at each rendezvous round",
        "nodes": nodes,
    }


class PlanCommand(Command):
    """Show what `runner job.yaml` would run."""

    name = "plan"
    help = "print the resolved spec and each rank's argv and environment"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """spec, --json."""
        add_spec_argument(parser)
        parser.add_argument("--json", action="store_true", help="machine-readable output")

    def run(self, args: argparse.Namespace) -> int:
        """Print the plan as YAML or JSON."""
        view = plan_view(load(args.spec))
        if args.json:
            print(json.dumps(view, indent=2))
        else:
            import yaml

            print(yaml.safe_dump(view, sort_keys=False, width=120), end="")
        return 0
