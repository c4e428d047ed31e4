"""rendezvous.status_interval: how often a node republishes its live status to etcd besides its changes, counted in
etcd's own record of the node's state key (its version: one per put) on a real one-node etcd job."""

from __future__ import annotations

import json
import time

import pytest
from conftest import wait_for
from multinode_helpers import Cluster, probe_args, spec_text

from runner.rendezvous.etcd.keys import JobKeys
from runner.testing.etcd_cluster import EtcdCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

RUN_S = 5  # the probe's sleep: time for several refreshes at 1 s


def puts_while_running(cluster: Cluster, host_etcd: EtcdCluster, interval: str, host: str) -> int:
    """Puts of the node's state key while its workers run, with `rendezvous.status_interval: <interval>`."""
    name = f"every-{interval.rstrip('s')}"  # a job of its own: the spec stored in etcd differs
    text = spec_text(cluster.endpoint, name=name, nodes="1", args=probe_args(cluster.out, "--sleep", str(RUN_S)))
    cluster.write(text.replace("  connect_timeout: 20s\n", f"  connect_timeout: 20s\n  status_interval: {interval}\n"))
    node = cluster.start(host)  # a host (and run dir) of its own
    key = JobKeys("/runner", name).state(host).decode()

    def version() -> int:
        kvs = json.loads(host_etcd.etcdctl("get", key, "-w", "json").stdout).get("kvs", [])
        return int(kvs[0]["version"]) if kvs else 0

    wait_for(lambda: node.state() == "RUNNING" and version() > 0, what=f"{host} RUNNING, its state published")
    first = last = version()
    deadline = time.monotonic() + RUN_S + 60
    while node.proc.poll() is None and node.state() == "RUNNING" and time.monotonic() < deadline:
        last = max(last, version())  # sampled until the workers end (the key goes with the agent's lease)
        time.sleep(0.2)
    assert node.wait(60) == 0, node.output()
    return last - first


def test_the_status_is_republished_every_interval_and_not_at_all_when_off(cluster: Cluster,
                                                                         host_etcd: EtcdCluster) -> None:
    """Every 1 s: a put per second or so while the workers run; null: none but the changes (there are none)."""
    assert puts_while_running(cluster, host_etcd, "1s", "a") >= RUN_S // 2
    assert puts_while_running(cluster, host_etcd, "null", "b") == 0
