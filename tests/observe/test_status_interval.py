"""rendezvous.status_interval: how often a node republishes its live status to etcd besides its changes, counted in
etcd's own record of the node's state key (its version: one per put) on a real one-node etcd job."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

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

    def read() -> tuple[int, dict[str, Any]]:
        """The state key's version and value."""
        kvs = json.loads(host_etcd.etcdctl("get", key, "-w", "json").stdout).get("kvs", [])
        return (int(kvs[0]["version"]), json.loads(base64.b64decode(kvs[0]["value"]))) if kvs else (0, {})

    def version() -> int:
        return read()[0]

    def launched() -> bool:
        """RUNNING, and its last change published: its workers started (their pids). RUNNING and the launch are
        two changes, published in turn (CI once sampled between them). The probe never says it is ready (no
        heartbeat): that change never comes."""
        workers = read()[1].get("workers") or []
        return node.state() == "RUNNING" and bool(workers) and all(w.get("pid") for w in workers)

    def running(record: dict[str, Any]) -> bool:
        """The record of a node whose workers all still run: the puts of their exit and of the end are changes,
        made before the console says so (CI counted both, under load, while the console still read RUNNING)."""
        workers = record.get("workers") or []
        return record.get("state") == "RUNNING" and all(w.get("exit_code") is None for w in workers)

    wait_for(launched, what=f"{host} RUNNING, its workers' launch published")
    first = last = version()
    deadline = time.monotonic() + RUN_S + 60
    while node.proc.poll() is None and time.monotonic() < deadline:
        now, record = read()
        if not running(record):
            break
        last = max(last, now)  # sampled until the workers end (the key goes with the agent's lease)
        time.sleep(0.2)
    assert node.wait(60) == 0, node.output()
    return last - first


def test_the_status_is_republished_every_interval_and_not_at_all_when_off(cluster: Cluster,
                                                                         host_etcd: EtcdCluster) -> None:
    """Every 1 s: a put per second or so while the workers run; null: none but the changes (there are none)."""
    assert puts_while_running(cluster, host_etcd, "1s", "a") >= RUN_S // 2
    assert puts_while_running(cluster, host_etcd, "null", "b") == 0
