"""Jobs whose rendezvous one of their agents hosts (rendezvous.hosted), on simulated hosts: the spec, the job's
secret, the hosting node's `rendezvous_hosted` event and its listeners. Shared by tests/multinode/test_multinode_hosted.py and
tests/rendezvous/test_hosted_secret.py."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conftest import PROBE, wait_for
from multinode_helpers import Cluster, Node

from runner.contract import SECRET_ENV
from runner.rendezvous.etcd.job_secret import new_secret_file
from runner.system.served import tcp_listeners
from runner.testing.hosts import Host, Lab

HOSTED_PORT = 29400  # torchrun's c10d default: every host has its own ports


def hosted_spec(port: int, *, nodes: str = "2", args: str = "", restart: str = "max_restarts: 2",
                host: str = "a") -> str:
    """A job whose rendezvous one of its agents hosts on `host`:`port`."""
    return textwrap.dedent(f"""\
        version: 1
        name: hosted
        entrypoint:
          script: {PROBE}
          args: [{args}]
        nodes: "{nodes}"
        nproc_per_node: 1
        rendezvous:
          backend: etcd
          hosted: true
          endpoints: ["{host}:{port}"]
          last_call: 1s
          lease_ttl: 2s
          join_timeout: 60s
          connect_timeout: 10s
        restart:
          {restart}
          backoff: {{initial: 0.1s}}
          preload: []  # the probe imports nothing: preload nothing (docs/standby.md); still forked warm from the fork server
        shutdown: {{grace_period: 3s}}
        logs: {{dir: "${{LOGS}}", format: json}}
        """)


def job_secret_file(folder: Path, name: str = "job.secret") -> Path:
    """A job's secret in `folder` (made on first use; mode 0600)."""
    path = folder / name
    if not path.exists():
        new_secret_file(path)
    return path


def hosted_cluster(lab: Lab) -> Iterator[Cluster]:
    """A Cluster on simulated hosts whose endpoint is host a's port (no etcd: a hosts it); every agent and CLI gets
    the job's secret (RUNNER_SECRET_FILE, in the shared folder every host reads). A module's `cluster` fixture:
    `cluster = pytest.fixture(hosted_cluster, name="cluster")`.
    """
    c = Cluster(lab.shared / "cluster", lab, f"a:{HOSTED_PORT}")
    c.env[SECRET_ENV] = str(job_secret_file(lab.shared))
    try:
        yield c
    finally:
        c.close()


def port_of(cluster: Cluster) -> int:
    """The endpoint's port."""
    return int(cluster.endpoint.rpartition(":")[2])


def events_of(node: Node, name: str) -> list[dict[str, Any]]:
    """The node's agent's JSON log events called `name` (its console output, format json)."""
    found = []
    for line in node.output().splitlines():
        try:
            event = json.loads(line[line.index("{"):]) if name in line else None
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == name:
            found.append(event)
    return found


def hosted_event(node: Node) -> dict[str, Any] | None:
    """The `rendezvous_hosted` event of a node's agent (pid, client_urls, data_dir), None before it hosts."""
    try:
        lines = (node.run_dir() / "agent.jsonl").read_text().splitlines()
    except (AssertionError, OSError):
        return None
    for line in lines:
        event = json.loads(line)
        if event.get("event") == "rendezvous_hosted":
            return dict(event)
    return None


def start_host(cluster: Cluster, name: str = "a", on: str | None = None) -> tuple[Node, dict[str, Any]]:
    """Start the node that hosts (first, alone) and wait until its etcd listens on its host."""
    node = cluster.start(name, on=on)
    wait_for(lambda: hosted_event(node) is not None, what=f"{name} hosts etcd")
    event = hosted_event(node)
    assert event is not None
    assert host_listeners(node.host, port_of(cluster))
    return node, event


def host_listeners(host: Host, port: int) -> set[int]:
    """Inodes of the sockets listening on TCP `port` in `host`'s network namespace."""
    return {i for name in ("tcp", "tcp6")
            for _, p, i in tcp_listeners(Path(f"/proc/{host.init_pid}/net/{name}").read_text()) if p == port}
