"""`runner plan job.yaml [--json]`: the resolved spec and every rank's argv/env, secrets redacted."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from runner.cli.command import Command, add_spec_argument, load

if TYPE_CHECKING:
    from runner.config.spec import JobSpec

PORT_PLACEHOLDER = 0  # the real MASTER_PORT is picked fresh at every rendezvous round


def plan_view(spec: JobSpec, node: str = "node0") -> dict[str, object]:
    """The resolved spec plus, for each node of a job of nodes.min nodes, each rank's argv, cwd and env.

    With replica groups: each group's ranks instead (its own world, store and torchft variables).
    """
    from runner.config.redact import spec_for_disk

    if spec.replica_groups is not None:
        return {"spec": spec_for_disk(spec), "note": NOTE, "groups": groups_view(spec, node)}
    return {"spec": spec_for_disk(spec), "note": NOTE, "nodes": nodes_view(spec, node)}


NOTE = "MASTER_PORT 0 (and TORCHFT_MANAGER_PORT 0) stand for the free ports picked at each attempt"


def groups_view(spec: JobSpec, node: str) -> list[dict[str, object]]:
    """Every replica group's ranks: RANK/WORLD_SIZE within the group, the torchft variables on top."""
    import dataclasses

    from runner.core.context import Replica

    groups = spec.replica_groups
    assert groups is not None
    light, several = groups.lighthouse, spec.rendezvous.backend != "local"
    host = "<the address of the node in seat 0 of group 0>" if several else "127.0.0.1"
    address = light.address or f"http://{host}:{light.port or '<free port>'} (hosted)"
    one = dataclasses.replace(spec, nproc_per_node=groups.nproc_per_node)
    per_group = groups.nodes_per_group if several else 1
    views = []
    for k in range(groups.count):
        env = Replica(k, groups.count, address).env(PORT_PLACEHOLDER)
        for i in range(per_group):
            name = f"<seat {k}/{i}>" if several else f"{node}/g{k}"
            views.append({"group": k, "node": name, "group_rank": i,
                          "ranks": ranks_view(one, name, i, per_group, env, run_dir=f"<run dir>/group_{k}")})
    return views


def nodes_view(spec: JobSpec, node: str) -> list[dict[str, object]]:
    """Each node's ranks, for a job of nodes.min nodes."""
    nodes = []
    for group_rank in range(spec.nodes.min):
        name = f"node{group_rank}" if spec.nodes.min > 1 else node
        nodes.append({"node": name, "group_rank": group_rank,
                      "ranks": ranks_view(spec, name, group_rank, spec.nodes.min, None)})
    return nodes


def ranks_view(spec: JobSpec, node: str, group_rank: int, nodes: int, extra_env: dict[str, str] | None, *,
               run_dir: str = "<run dir>") -> list[dict[str, object]]:
    """One node's ranks (argv, cwd, env with secrets redacted, logs) for attempt 0."""
    # Imported here: every `runner` command imports this module (the list of commands), few need these.
    from runner.config.redact import redact, redact_argv
    from runner.rendezvous.base import RendezvousResult
    from runner.workers.launch_plan import build_plan

    result = RendezvousResult(
        round=0,
        node=node,
        group_rank=group_rank,
        group_world_size=nodes,
        nproc_per_node=spec.nproc_per_node,
        master_addr=spec.rendezvous.master_addr or "<group rank 0's address>",
        master_port=PORT_PLACEHOLDER,
    )
    plan = build_plan(spec, result, attempt=0, run_dir=run_dir, base_env={}, extra_env=extra_env)
    return [
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
