"""The rendezvous backend a spec asks for (the agent layer picks it: the rendezvous layer imports no backend).

For a job of one group, and for each replica group (its own rendezvous, under the job's keys with etcd).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from runner.config.spec import JobSpec, Nodes
from runner.rendezvous.base import Rendezvous

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger


def make_rendezvous(spec: JobSpec, node: str, advertise_addr: str, run_dir: Path | None = None, *,
                    node_named: bool = False) -> Rendezvous:
    """The backend the spec asks for (imports etcd support only when used).

    `run_dir`: where a hosting node keeps its etcd's data and log (rendezvous.hosted); by default the run dir of
    the agent's log. `node_named`: the node id was given by hand (--node, $RUNNER_NODE), as several agents of one
    machine need: only then may a hosted rendezvous on a loopback endpoint admit more than one node.
    """
    if spec.rendezvous.backend == "etcd" and spec.rendezvous.hosted:
        from runner.rendezvous.etcd.hosted import HostedRendezvous

        return HostedRendezvous(spec, node, advertise_addr=advertise_addr, run_dir=run_dir, node_named=node_named)
    if spec.rendezvous.backend == "etcd":
        from runner.rendezvous.etcd.backend import EtcdRendezvous

        return EtcdRendezvous(spec, node, advertise_addr=advertise_addr)
    from runner.rendezvous.local import LocalRendezvous
    from runner.rendezvous.node_ledger import LocalLedger
    from runner.rundir.layout import ledger_path

    return LocalRendezvous(
        node, spec.nproc_per_node, spec.rendezvous.master_addr or "127.0.0.1", spec.rendezvous.master_port,
        ledger=LocalLedger(ledger_path(spec.name, spec.identity())),
    )


def group_rendezvous(spec: JobSpec, k: int, node: str, advertise_addr: str, log: FilteringBoundLogger, *,
                     seated: bool) -> tuple[JobSpec, str, Rendezvous]:
    """Replica group k's view of the spec (its nproc_per_node), its node id and its own rendezvous.

    One node (`seated` False): every group on this node, each with an embedded rendezvous of its own and a fresh
    master port every attempt. Several nodes (etcd, this node seated in group k): the group's rendezvous among its
    nodes_per_group nodes, under the job's keys (`runner reset` removes them).
    """
    groups = spec.replica_groups
    assert groups is not None
    view = dataclasses.replace(spec, nproc_per_node=groups.nproc_per_node)
    if not seated:
        from runner.rendezvous.local import LocalRendezvous

        name = f"{node}/g{k}"
        return view, name, LocalRendezvous(name, view.nproc_per_node, "127.0.0.1", None)
    from runner.rendezvous.etcd.backend import EtcdRendezvous
    from runner.rendezvous.etcd.seats import group_keys

    view = dataclasses.replace(view, nodes=Nodes(groups.nodes_per_group, groups.nodes_per_group))
    return view, node, EtcdRendezvous(view, node, advertise_addr=advertise_addr, log=log.bind(group=k),
                                      keys=group_keys(spec, k))
