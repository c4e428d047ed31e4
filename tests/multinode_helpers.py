"""Multi-node test helpers: a `Cluster` of real `runner run` processes (one per simulated node) on one etcd, the
probe job's spec. Imported as `multinode_helpers` (tests/ is on the path) by every multi-node test; the `cluster`
fixture that builds one per test is in conftest.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conftest import EXAMPLES, PROBE, alive

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
