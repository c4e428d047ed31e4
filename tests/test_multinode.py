"""Multi-node runs end to end: real `runner` processes, one per simulated host (own address, hostname, /tmp and
processes), against a real etcd on a host of its own; node ids from the hostnames, no loopback address anywhere.

The `Cluster` helper is tests/multinode_helpers.py's, the `cluster` fixture conftest.py's.
"""

from __future__ import annotations

import json
import signal

import pytest
from conftest import EXAMPLES, wait_for
from multinode_helpers import HELLO, Cluster, probe_args, spec_text

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_two_nodes_torch_hello_succeed(cluster: Cluster) -> None:
    """Two nodes x 2 gloo workers: all 4 ranks all_reduce and print, both agents exit 0."""
    cluster.write(spec_text(cluster.endpoint, nproc=2, script=HELLO))
    a, b = cluster.start("a"), cluster.start("b")
    codes = cluster.wait_all()
    assert codes == {"a": 0, "b": 0}, a.output() + b.output()
    printed = a.output() + b.output()
    for rank in range(4):
        assert f"rank {rank}/4: all_reduce=10 ok" in printed, printed
    assert a.report()["outcome"] == b.report()["outcome"] == "succeeded"


def test_late_node_is_admitted_without_charging_restarts(cluster: Cluster) -> None:
    """Elastic 2:3: a third node arriving while two run makes them go RESTARTING -> RENDEZVOUS; world size 3."""
    cluster.write(spec_text(cluster.endpoint, nodes="2:3", args=probe_args(cluster.out, "--sleep", "4")))
    a, b = cluster.start("a"), cluster.start("b")
    wait_for(lambda: a.state() == "RUNNING" and b.state() == "RUNNING", what="a and b RUNNING")
    c = cluster.start("c")
    assert cluster.wait_all() == {"a": 0, "b": 0, "c": 0}, a.output() + c.output()
    for node in (a, b):
        assert ("RUNNING", "membership_changed", "RESTARTING") in node.edges()
        assert ("RESTARTING", "restarted", "RENDEZVOUS") in node.edges()
        assert node.report()["restarts"] == 0
    last = [info for info in cluster.worker_files() if info["env"]["TORCHELASTIC_RESTART_COUNT"] == "1"]
    assert {info["env"]["WORLD_SIZE"] for info in last} == {"3"}
    assert c.report()["outcome"] == "succeeded"


def test_sigkill_of_one_agent_restarts_the_survivors(cluster: Cluster) -> None:
    """min 2 / max 3: SIGKILL of node c's agent -> a and b lose a peer, restart their workers, and complete."""
    cluster.write(spec_text(cluster.endpoint, nodes="2:3", args=probe_args(cluster.out, "--sleep", "6")))
    a, b, c = cluster.start("a"), cluster.start("b"), cluster.start("c")
    wait_for(lambda: all(n.state() == "RUNNING" for n in (a, b, c)), what="all RUNNING")
    c.proc.send_signal(signal.SIGKILL)
    c.wait()
    assert a.wait() == 0 and b.wait() == 0, a.output() + b.output()
    for node in (a, b):
        assert ("RUNNING", "peer_lost", "FAILED") in node.edges(), node.edges()
        assert node.report()["outcome"] == "succeeded"
    retried = [info for info in cluster.worker_files() if info["env"]["TORCHELASTIC_RESTART_COUNT"] == "1"]
    assert {info["env"]["WORLD_SIZE"] for info in retried} == {"2"}


def test_status_during_and_after_a_run(cluster: Cluster) -> None:
    """`runner status --json` shows round, world size, master and each node's state and workers, then the end."""
    cluster.write(spec_text(cluster.endpoint, nproc=2, args=probe_args(cluster.out, "--sleep", "5")))
    cluster.start("a"), cluster.start("b")
    wait_for(lambda: len(cluster.worker_files()) == 4, what="4 workers started")
    wait_for(lambda: all(n["state"] == "RUNNING" and len(n["workers"] or []) == 2
                         for n in cluster.status()["nodes"]), what="status shows RUNNING nodes")
    during = cluster.status()
    assert during["status"] == "running"
    assert during["world_size"] == 4 and during["round"] == 0
    assert [n["node"] for n in during["nodes"]] == ["a", "b"]  # the hostnames
    assert during["master_addr"] == "a" and isinstance(during["master_port"], int)  # group rank 0's own name
    workers = cluster.worker_files()
    assert {w["host"] for w in workers} == {"a", "b"}
    for w in workers:  # every rank reaches the master by the name rank 0's host has, never a loopback address
        assert w["env"]["MASTER_ADDR"] == "a", w
    for node in during["nodes"]:
        assert node["attempt"] == 0 and node["heartbeat"] > 0
        assert all(w["pid"] > 0 and w["exit_code"] is None for w in node["workers"])
    assert cluster.wait_all() == {"a": 0, "b": 0}
    after = cluster.status()
    assert after["status"] == "succeeded"
    assert {n["state"] for n in after["nodes"]} == {"SHUTDOWN"}
    assert all(w["exit_code"] == 0 for n in after["nodes"] for w in n["workers"])
    text = cluster.cli("status")
    assert text.returncode == 0 and "node a" in text.stdout, text.stdout + text.stderr


def test_multinode_example_trains_on_two_nodes(cluster: Cluster) -> None:
    """examples/jobs/multinode.yaml on two simulated nodes: DDP over 4 ranks converges toward w=3."""
    cluster.spec = EXAMPLES / "multinode.yaml"
    cluster.env.update(ETCD=cluster.endpoint, STEPS="30", JOB_NAME="mn-example")
    a, b = cluster.start("a"), cluster.start("b")
    assert cluster.wait_all() == {"a": 0, "b": 0}, a.output() + b.output()
    line = next(ln for ln in (a.output() + b.output()).splitlines() if "done: 30 steps on 4 ranks" in ln)
    assert 2.0 < float(line.split("w=")[1].split()[0]) < 4.0, line


def test_elastic_example_resumes_with_a_late_node(cluster: Cluster) -> None:
    """examples/jobs/elastic.yaml: 2 nodes start, a third arrives, training resumes from the checkpoint at 3."""
    cluster.spec = EXAMPLES / "elastic.yaml"
    ckpt = cluster.tmp / "elastic.pt"
    cluster.env.update(ETCD=cluster.endpoint, STEPS="4000", CKPT=str(ckpt), LAST_CALL="1s", JOB_NAME="el-example")
    a = cluster.start("a")
    cluster.start("b")
    wait_for(ckpt.exists, what="a first checkpoint")
    cluster.start("c")
    assert cluster.wait_all() == {"a": 0, "b": 0, "c": 0}, a.output()
    out = "".join(n.output() for n in cluster.nodes.values())
    assert "done: 4000 steps, last world size 3" in out, out
    resumed = [ln for ln in out.splitlines() if "rank 0/3: resuming at step" in ln]
    assert resumed and int(resumed[0].split("step ")[1].split()[0]) > 0, resumed
    report = a.report()
    assert report["restarts"] == 0, json.dumps({k: report.get(k) for k in ("failures", "attempts", "warnings")})[:6000]
