"""Replica groups on several nodes, read from a node's run dir: its group, its rank 0's log, its worker. Shared by
tests/agent/test_replica_groups_multinode.py (an etcd of the test's) and tests/agent/test_replica_groups_hosted.py (the job's
own, hosted over three members)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import wait_for
from ft_records import records
from multinode_helpers import Cluster, Node


def group_of(node: Node) -> int | None:
    """The group this node's agent runs (its run dir's only group_<k> folder), None before it has one."""
    try:
        found = [p.name for p in node.run_dir().glob("group_*")]
    except AssertionError:
        return None
    return int(found[0].split("_")[1]) if len(found) == 1 else None


def log_of(node: Node, attempt: int) -> Path:
    """stdout of rank 0 of this node's group, attempt `attempt`."""
    return node.run_dir() / f"group_{group_of(node)}" / f"attempt_{attempt}" / "rank_0" / "stdout.log"


def worker_pid(node: Node) -> int:
    """The pid of the node's current worker as this test's PID namespace numbers it (status.json has its host's),
    proven to run ft_train.py."""
    status = json.loads((node.run_dir() / f"group_{group_of(node)}" / "status.json").read_text())
    [worker] = status["workers"]
    pid = node.host.pids()[int(worker["pid"])]
    # a standby takes the script's command line as it hands off: it may still show its own title for a moment
    wait_for(lambda: "ft_train.py" in Path(f"/proc/{pid}/cmdline").read_text(), timeout=30,
             what=f"worker {pid} to run ft_train.py")
    return pid


def seated(c: Cluster, names: tuple[str, ...], timeout: float = 60) -> dict[int, Node]:
    """Wait until the nodes `names` took one seat each, the groups 0 to len(names) - 1; group -> node."""
    wait_for(lambda: all(group_of(c.nodes[n]) is not None for n in names), timeout=timeout,
             what=f"{len(names)} seats taken")
    by_group = {group_of(c.nodes[n]): c.nodes[n] for n in names}
    assert set(by_group) == set(range(len(names))), by_group
    return {k: v for k, v in by_group.items() if k is not None}


def both_seated(c: Cluster, names: tuple[str, str]) -> dict[int, Node]:
    """Wait until the two nodes took the two seats; group -> node."""
    return seated(c, names)


def ended_together(survivors: list[Node], steps: int) -> None:
    """Each survivor's group restarted once at most, and all ended at step `steps` with the same weights."""
    finals = []
    for node in survivors:
        attempts = sorted(int(p.name.split("_")[1]) for p in (node.run_dir() / f"group_{group_of(node)}").glob("attempt_*"))
        assert attempts in ([0], [0, 1]), (node.name, attempts)  # one restart at most
        finals.append(records(log_of(node, attempts[-1]), "final")[0])
    assert {f["step"] for f in finals} == {str(steps)}, finals
    assert len({f["params_sha"] for f in finals}) == 1, finals
