"""Multi-node test helpers: a `Cluster` of real `runner` processes, one per simulated host (runner/testing/hosts.py:
own network namespace and address, hostname, /tmp and processes), on one etcd, and the probe job's spec. Each node's
identity is its hostname (no `--node`), each node advertises its own address (no loopback anywhere); `runner status`
and `runner stop` run from a "login" host that runs no agent. Imported as `multinode_helpers` (tests/ is on the path)
by every multi-node test; the `lab` and `cluster` fixtures that build them per test are in conftest.py.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conftest import EXAMPLES, PROBE, RUNNER

from runner.testing.hosts import Host, HostProcess, Lab

HELLO = EXAMPLES / "hello.py"
RUN_TIMEOUT_S = 120.0


def spec_text(endpoint: str | list[str], *, name: str = "mn", nodes: str = "2", nproc: int = 1, script: Path = PROBE,
              args: str = "", restart: str = "max_restarts: 2", extra: str = "") -> str:
    """A multi-node job spec on `endpoint`; logs go to ${LOGS} (set per node), probe output to ${OUT}."""
    arglist = f"args: [{args}]" if args else "args: []"
    preload = "preload: []  # the probe imports nothing: preload nothing (docs/standby.md); still forked warm from the fork server" if script == PROBE else ""
    endpoints = json.dumps([endpoint] if isinstance(endpoint, str) else endpoint)
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
          endpoints: {endpoints}
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
    """One simulated node: a `runner` process on its own host, with its own logs dir and output files."""

    name: str
    proc: HostProcess  # signals reach the agent itself; its exit status is the agent's
    home: Path  # cwd of the agent (in the shared folder); logs under home/logs (${LOGS}) or home/runner-logs
    stdout: Path
    stderr: Path
    host: Host

    @property
    def agent_pid(self) -> int:
        """The agent's pid as this test's PID namespace numbers it (0 once it exited)."""
        return self.proc.inner_pid()

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
    """Nodes of one job, each a real `python -m runner job.yaml` process on a host of its own (named as the node);
    every agent and host is reaped by close()."""

    def __init__(self, tmp: Path, lab: Lab, endpoint: str | list[str] = "") -> None:
        self.tmp, self.lab = tmp, lab
        self.endpoint = endpoint if isinstance(endpoint, str) else endpoint[0]
        self.endpoints = [endpoint] if isinstance(endpoint, str) else endpoint
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

    def host(self, name: str) -> Host:
        """The host called `name`, started on first use."""
        return self.lab.hosts.get(name) or self.lab.add(name)

    def _env(self, host: Host, logs: Path) -> dict[str, str]:
        return host.env({"LOGS": str(logs), "OUT": str(self.out), "PYTHONUNBUFFERED": "1", **self.env})

    def start(self, name: str, *args: str, spec: Path | None = None, on: str | None = None) -> Node:
        """Start the agent of node `name` on host `name` (its logs under tmp/nodes/NAME); its id is the hostname.

        `on`: another host to start it on, beside the agents already there; its id is then given with --node.
        """
        host = self.host(on or name)
        home = self.tmp / "nodes" / name
        home.mkdir(parents=True, exist_ok=True)
        stdout, stderr = home / "stdout", home / "stderr"
        named = ("--node", name) if on else ()
        with stdout.open("wb") as out, stderr.open("wb") as err:
            proc = host.popen([*RUNNER, str(spec or self.spec), *named, *args], cwd=home,
                              env=self._env(host, home / "logs"), stdout=out, stderr=err)
        node = Node(name, proc, home, stdout, stderr, host)
        self.nodes[name] = node
        return node

    def cli(self, *args: str, spec: Path | None = None, timeout: float = 60,
            on: str = "login") -> subprocess.CompletedProcess[str]:
        """Run `runner ARGS job.yaml` (status, stop) to completion on host `on` (a login host: no agent runs there)."""
        host = self.host(on)
        return host.run([*RUNNER, *args, str(spec or self.spec)], cwd=self.tmp,
                        env=self._env(host, self.tmp / "cli-logs"), timeout=timeout)

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
        """What every probe worker recorded (pid on its host, host, env)."""
        found = []
        for path in sorted(self.out.glob("rank*.attempt*.json")):
            try:
                found.append(json.loads(path.read_text()))
            except ValueError:
                continue
        return found

    def alive(self, info: dict[str, Any], key: str = "pid") -> bool:
        """Whether the process a worker file names (its `key` pid, on its `host`) still lives there."""
        pid = info.get(key)
        host = self.lab.hosts.get(str(info.get("host")))
        return bool(pid) and host is not None and host.alive(int(pid))

    def close(self) -> None:
        """SIGKILL every agent still running and reap it; the lab's close then kills whatever its hosts still run."""
        for node in self.nodes.values():
            if node.proc.poll() is None:
                node.proc.kill()
            try:
                node.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                subprocess.Popen.kill(node.proc)
                node.proc.wait()
