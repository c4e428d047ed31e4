"""`runner stop` against a running multi-node job, a late node after the stop, and a node with another spec."""

from __future__ import annotations

import pytest
from conftest import wait_for
from multinode_helpers import Cluster, probe_args, spec_text

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

EXIT_INFRA = 3
EXIT_STOPPED_TERM = 143


def start_running_pair(cluster: Cluster, sleep: str) -> None:
    """Start nodes a and b on a probe job that sleeps `sleep` seconds; wait until both run their workers."""
    cluster.write(spec_text(cluster.endpoint, args=probe_args(cluster.out, "--sleep", sleep)))
    a, b = cluster.start("a"), cluster.start("b")
    wait_for(lambda: a.state() == "RUNNING" and b.state() == "RUNNING", what="a and b RUNNING")
    wait_for(lambda: len(cluster.worker_files()) == 2, what="both workers started")


def test_stop_ends_every_node_and_closes_the_job(cluster: Cluster) -> None:
    """`runner stop` twice: both agents stop their workers and exit 143; a late node then exits 3 ('closed')."""
    start_running_pair(cluster, "600")
    first, second = cluster.cli("stop"), cluster.cli("stop")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert cluster.wait_all(60) == {"a": EXIT_STOPPED_TERM, "b": EXIT_STOPPED_TERM}
    for node in cluster.nodes.values():
        assert node.edges()[-1] == ("RUNNING", "stop_requested", "SHUTDOWN"), node.edges()
    assert cluster.status()["status"] == "stopped"
    late = cluster.start("late")
    assert late.wait(60) == EXIT_INFRA
    assert "closed" in late.output(), late.output()


def test_graceful_stop_lets_workers_finish(cluster: Cluster) -> None:
    """`runner stop --graceful`: workers are not signalled, they finish, and no restart happens."""
    start_running_pair(cluster, "4")
    done = cluster.cli("stop", "--graceful")
    assert done.returncode == 0, done.stderr
    assert cluster.wait_all(60) == {"a": 0, "b": 0}
    assert not list(cluster.out.glob("*.signals")), "a worker got SIGTERM during a graceful stop"
    for node in cluster.nodes.values():
        assert node.report()["attempts"] == 1
        assert "graceful_stop" in node.output()


def test_node_with_another_spec_is_refused(cluster: Cluster) -> None:
    """A node whose nproc_per_node differs refuses to join, naming the field; the job itself is untouched."""
    start_running_pair(cluster, "3")
    other = cluster.write(spec_text(cluster.endpoint, nproc=2, args=probe_args(cluster.out, "--sleep", "3")),
                          "other.yaml")
    odd = cluster.start("odd", spec=other)
    assert odd.wait(60) == EXIT_INFRA
    assert "nproc_per_node" in odd.output(), odd.output()
    assert cluster.nodes["a"].wait() == 0 and cluster.nodes["b"].wait() == 0
    assert "odd" not in {n["node"] for n in cluster.status()["nodes"]}


def test_reset_lets_a_stopped_job_name_run_again(cluster: Cluster) -> None:
    """`runner reset` is refused while nodes are live; after a stop it deletes the job's keys, and the same job
    name then runs to success on two new agents."""
    start_running_pair(cluster, "600")
    refused = cluster.cli("reset")
    assert refused.returncode == 3 and "live node" in refused.stderr, refused.stderr
    assert cluster.cli("stop").returncode == 0
    assert cluster.wait_all(60) == {"a": EXIT_STOPPED_TERM, "b": EXIT_STOPPED_TERM}
    done = cluster.cli("reset")
    assert done.returncode == 0 and "key(s) deleted" in done.stdout, done.stderr
    assert cluster.status()["nodes"] == []
    rerun = cluster.write(spec_text(cluster.endpoint, args=probe_args(cluster.out, "--sleep", "0")), name="rerun.yaml")
    cluster.nodes.clear()
    cluster.start("c", spec=rerun)
    cluster.start("d", spec=rerun)
    assert cluster.wait_all(120) == {"c": 0, "d": 0}
