"""A job's keys and leases, read with etcdctl from the etcd the job uses.

That is the soak's own etcd, or with --hosted the etcd one of the agents hosts, at the job's endpoint (the agents'
`rendezvous.endpoints`; the soak reaches it from its own network namespace). A read that fails (etcd stopped,
frozen, restarting, or gone with its host) is None: the check that asked does not apply then, and says so.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

from runner.testing.etcd_server import etcd_binary

READ_TIMEOUT_S = 10.0


class EtcdReader:
    """etcdctl against one endpoint (host:port, plain http as the soak's etcds are), or several, comma-separated (the
    members of a cluster: --hosts --etcd-members 3)."""

    def __init__(self, endpoint: str, trust: tuple[Path, str] | None = None) -> None:
        self.endpoint = endpoint
        self.trust = trust  # a hosted etcd closed by the job's secret: (its CA file, root's password)
        self.error = ""  # why the last call failed ('' when it did not)

    def etcdctl(self, *args: str) -> str | None:
        """etcdctl's output, None when it failed or took too long."""
        scheme = "https" if self.trust else "http"
        endpoints = ",".join(f"{scheme}://{e}" for e in self.endpoint.split(","))
        argv = [etcd_binary("etcdctl"), f"--endpoints={endpoints}", "--dial-timeout=2s",
                "--command-timeout=3s", *(["--cacert", str(self.trust[0])] if self.trust else []), *args]
        env = {**os.environ, "ETCDCTL_API": "3"}
        if self.trust:
            env["ETCDCTL_USER"] = f"root:{self.trust[1]}"  # the environment, not the command line (ps shows that)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=READ_TIMEOUT_S, check=False,
                                  env=env)
        except (OSError, subprocess.TimeoutExpired) as e:
            self.error = str(e)
            return None
        self.error = "" if done.returncode == 0 else (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return done.stdout if done.returncode == 0 else None

    def keys(self, prefix: str) -> list[tuple[str, int]] | None:
        """(key, lease) of every key under `prefix`; None when etcd cannot be read."""
        out = self.etcdctl("get", "--prefix", prefix, "-w", "json")
        if out is None:
            return None
        try:
            kvs = json.loads(out).get("kvs", [])
            return [(base64.b64decode(kv["key"]).decode(errors="replace"), int(kv.get("lease", 0))) for kv in kvs]
        except (ValueError, KeyError, TypeError):
            return None

    def lease_ttl(self, lease: int) -> int | None:
        """Remaining TTL of a lease (-1: gone); None when etcd cannot be read."""
        out = self.etcdctl("lease", "timetolive", f"{lease:x}", "-w", "json")
        if out is None:
            return None
        try:
            return int(json.loads(out).get("ttl", -1))
        except (ValueError, TypeError):
            return None

    def members(self) -> list[tuple[str, bool]] | None:
        """(name, is a learner) of every member of the cluster (a learner not started yet has no name: ''); None when
        etcd cannot be read."""
        out = self.etcdctl("member", "list", "-w", "json")
        if out is None:
            return None
        try:
            return [(str(m.get("name", "")), bool(m.get("isLearner", False))) for m in json.loads(out)["members"]]
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
