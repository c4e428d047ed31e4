"""Multi-node runs end to end: real `runner` processes (one per simulated node) against a real etcd on loopback.

Also home of the `Cluster` helper the other tests/test_multinode_*.py modules use.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, PROBE, alive, wait_for

from runner.testing.etcd_server import EtcdServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

HELLO = EXAMPLES / "hello.py"
RUN_TIMEOUT_S = 120.0


def spec_text(endpoint: str, *, name: str = "mn", nodes: str = "2", nproc: int = 1, script: Path = PROBE,
              args: str = "", restart: str = "max_restarts: 2", extra: str = "") -> str:
    """A multi-node job spec on `endpoint`; logs go to ${LOGS} (set per node), probe output to ${OUT}."""
    arglist = f"args: [{args}]" if args else "args: []"
    preload = "preload: []  # the probe imports nothing: preload nothing (docs/standby.md); still forked warm from the fork server" if script == PROBE else ""
    return textwrap.dedent(f"""\
        version: 1
        name: {name}
        entrypoint:
          script: {script}
          {arglist}
        nodes: "{nodes}"
        nproc_per_node: {nproc}
        rendezvous:
          backend: etcd
          endpoints: ["{endpoint}"]
          master_addr: 127.0.0.1
          last_call: 1s
          lease_ttl: 3s
          join_timeout: 90s
          connect_timeout: 20s
        restart:
          {restart}
          backoff: {{initial: 0.1s}}
          {preload}
        shutdown: {{grace_period: 5s}}
        logs: {{dir: "${{LOGS}}", format: json}}
        """) + textwrap.dedent(extra)


def probe_args(out: Path, *more: str) -> str:
    """YAML list items for worker_probe.py: write into `out`, then `more`."""
    return ", ".join(json.dumps(a) for a in ("--dir", str(out), *more))


@dataclass
class Node:
    """One simulated node: a `runner` process with its own logs dir and output files."""

    name: str
    proc: subprocess.Popen[bytes]
    home: Path  # cwd of the agent; logs under home/logs (${LOGS}) or home/runner-logs (the default)
    stdout: Path
    stderr: Path

    def wait(self, timeout: float = RUN_TIMEOUT_S) -> int:
        """Wait for the agent to exit; its exit code."""
        return self.proc.wait(timeout=timeout)

    def run_dir(self) -> Path:
        """The node's (only) run dir."""
        dirs = [d for d in self.home.glob("*logs/*/*") if d.is_dir() and not d.is_symlink()]
        assert len(dirs) == 1, dirs
        return dirs[0]

    def transitions(self) -> list[dict[str, Any]]:
        """Every transition this node's agent logged so far."""
        try:
            path = self.run_dir() / "transitions.jsonl"
            return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        except (AssertionError, OSError, ValueError):
            return []

    def edges(self) -> list[tuple[str, str, str]]:
        """(src, trigger, dst) of every transition so far."""
        return [(t["src"], t["trigger"], t["dst"]) for t in self.transitions()]

    def state(self) -> str:
        """The state entered last ('INIT' before the first transition)."""
        edges = self.edges()
        return edges[-1][2] if edges else "INIT"

    def report(self) -> dict[str, Any]:
        """report.json written at SHUTDOWN."""
        return dict(json.loads((self.run_dir() / "report.json").read_text()))

    def output(self) -> str:
        """stdout + stderr so far."""
        return self.stdout.read_text(errors="replace") + self.stderr.read_text(errors="replace")


class Cluster:
    """Nodes of one job, each a real `python -m runner job.yaml --node NAME` process; all reaped by close()."""

    def __init__(self, tmp: Path, endpoint: str) -> None:
        self.tmp, self.endpoint = tmp, endpoint
        self.out = tmp / "out"
        self.out.mkdir(parents=True, exist_ok=True)
        self.spec = tmp / "job.yaml"
        self.nodes: dict[str, Node] = {}
        self.env: dict[str, str] = {}

    def write(self, text: str, name: str = "job.yaml") -> Path:
        """Write a spec file; the first one becomes the cluster's spec."""
        path = self.tmp / name
        path.write_text(text)
        return path

    def _env(self, logs: Path) -> dict[str, str]:
        return {**os.environ, "LOGS": str(logs), "OUT": str(self.out), "PYTHONUNBUFFERED": "1", **self.env}

    def start(self, name: str, *args: str, spec: Path | None = None) -> Node:
        """Start node `name` (its logs under tmp/nodes/NAME)."""
        home = self.tmp / "nodes" / name
        home.mkdir(parents=True, exist_ok=True)
        stdout, stderr = home / "stdout", home / "stderr"
        with stdout.open("wb") as out, stderr.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "runner", str(spec or self.spec), "--node", name, *args],
                cwd=home, env=self._env(home / "logs"), stdout=out, stderr=err)
        node = Node(name, proc, home, stdout, stderr)
        self.nodes[name] = node
        return node

    def cli(self, *args: str, spec: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run `runner ARGS job.yaml` (status, stop) to completion."""
        return subprocess.run(
            [sys.executable, "-m", "runner", *args, str(spec or self.spec)], cwd=self.tmp,
            env=self._env(self.tmp / "cli-logs"), capture_output=True, text=True, timeout=timeout, check=False)

    def status(self) -> dict[str, Any]:
        """`runner status --json`, parsed."""
        done = self.cli("status", "--json")
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))

    def wait_all(self, timeout: float = RUN_TIMEOUT_S) -> dict[str, int]:
        """Wait for every node; name -> exit code."""
        deadline = time.monotonic() + timeout
        return {n: node.wait(max(1.0, deadline - time.monotonic())) for n, node in self.nodes.items()}

    def worker_files(self) -> list[dict[str, Any]]:
        """What every probe worker recorded (pid, env)."""
        found = []
        for path in sorted(self.out.glob("rank*.attempt*.json")):
            try:
                found.append(json.loads(path.read_text()))
            except ValueError:
                continue
        return found

    def close(self) -> None:
        """SIGKILL every agent still running, reap it, and kill any worker left behind."""
        for node in self.nodes.values():
            if node.proc.poll() is None:
                node.proc.kill()
            node.proc.wait()
        for info in self.worker_files():
            for pid in (info.get("pid"), info.get("child_pid")):
                if pid and alive(pid):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def cluster(tmp_path: Path, etcd: EtcdServer) -> Iterator[Cluster]:
    """A Cluster on the test's etcd; every node process and worker is reaped afterwards."""
    c = Cluster(tmp_path / "cluster", etcd.endpoint)
    try:
        yield c
    finally:
        c.close()


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
    assert during["master_addr"] == "127.0.0.1" and isinstance(during["master_port"], int)
    assert [n["node"] for n in during["nodes"]] == ["a", "b"]
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
    a, b = cluster.start("a", "--advertise-addr", "127.0.0.1"), cluster.start("b", "--advertise-addr", "127.0.0.1")
    assert cluster.wait_all() == {"a": 0, "b": 0}, a.output() + b.output()
    line = next(ln for ln in (a.output() + b.output()).splitlines() if "done: 30 steps on 4 ranks" in ln)
    assert 2.0 < float(line.split("w=")[1].split()[0]) < 4.0, line


def test_elastic_example_resumes_with_a_late_node(cluster: Cluster) -> None:
    """examples/jobs/elastic.yaml: 2 nodes start, a third arrives, training resumes from the checkpoint at 3."""
    cluster.spec = EXAMPLES / "elastic.yaml"
    ckpt = cluster.tmp / "elastic.pt"
    cluster.env.update(ETCD=cluster.endpoint, STEPS="4000", CKPT=str(ckpt), LAST_CALL="1s", JOB_NAME="el-example")
    a = cluster.start("a", "--advertise-addr", "127.0.0.1")
    cluster.start("b", "--advertise-addr", "127.0.0.1")
    wait_for(ckpt.exists, what="a first checkpoint")
    cluster.start("c", "--advertise-addr", "127.0.0.1")
    assert cluster.wait_all() == {"a": 0, "b": 0, "c": 0}, a.output()
    out = "".join(n.output() for n in cluster.nodes.values())
    assert "done: 4000 steps, last world size 3" in out, out
    resumed = [ln for ln in out.splitlines() if "rank 0/3: resuming at step" in ln]
    assert resumed and int(resumed[0].split("step ")[1].split()[0]) > 0, resumed
    report = a.report()
    assert report["restarts"] == 0, json.dumps({k: report.get(k) for k in ("failures", "attempts", "warnings")})[:6000]
