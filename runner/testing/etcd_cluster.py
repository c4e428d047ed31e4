"""A real etcd cluster on simulated hosts (runner/testing/hosts.py): one member per host, as production runs it.

For tests and benchmarks only (the runner never imports it). Each member listens for clients on its host's address,
port 2379, and for peers on port 2380; its data lives in the host's own /tmp, so a lost host loses its member's
disk as a machine would (`restart` keeps the data: the process ends, the host stays). One member is the one-member
etcd the multi-node tests use; three is the production shape: `leader()` says which member leads (etcd's own
status), so a test can kill its host.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from runner.testing.etcd_server import etcd_binary

if TYPE_CHECKING:
    from runner.testing.hosts import Host, Lab

CLIENT_PORT = 2379
PEER_PORT = 2380
HEALTH_TIMEOUT_S = 30.0
HOST_DATA = "/tmp/etcd-data"  # noqa: S108 - in the host's own /tmp: a lost host loses it


@dataclass
class Member:
    """One etcd member on its host."""

    host: Host
    proc: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        """The member's name: its host's."""
        return self.host.name

    @property
    def endpoint(self) -> str:
        """host:port its clients connect to."""
        return f"{self.host.ip}:{CLIENT_PORT}"

    @property
    def up(self) -> bool:
        """Started and not exited (a lost host's member is not up)."""
        return self.proc is not None and self.proc.poll() is None


class EtcdCluster:
    """etcd members on `hosts`, one each; `start()` waits until every member is healthy."""

    def __init__(self, hosts: list[Host], token: str = "runner-test") -> None:  # noqa: S107 - etcd's cluster token
        self.members = [Member(h) for h in hosts]
        self.token = token

    @property
    def endpoints(self) -> list[str]:
        """Every member's client endpoint, as a spec's rendezvous.endpoints lists them."""
        return [m.endpoint for m in self.members]

    def _argv(self, m: Member, state: str) -> list[str]:
        peers = ",".join(f"{x.name}=http://{x.host.ip}:{PEER_PORT}" for x in self.members)
        return [etcd_binary(), "--name", m.name, "--data-dir", HOST_DATA,
                "--listen-client-urls", f"http://{m.endpoint}", "--advertise-client-urls", f"http://{m.endpoint}",
                "--listen-peer-urls", f"http://{m.host.ip}:{PEER_PORT}",
                "--initial-advertise-peer-urls", f"http://{m.host.ip}:{PEER_PORT}",
                "--initial-cluster", peers, "--initial-cluster-state", state,
                "--initial-cluster-token", self.token, "--log-level", "warn",
                "--heartbeat-interval", "100", "--election-timeout", "1000"]

    def start(self) -> None:
        """Start every member and wait until each answers healthy."""
        for m in self.members:
            self._spawn(m, "new")
        for m in self.members:
            self._wait_healthy(m)

    def _spawn(self, m: Member, state: str) -> None:
        log = m.host.lab.shared / f".etcd-{m.name}.log"
        with log.open("ab") as out:
            m.proc = m.host.popen(self._argv(m, state), stdout=out, stderr=subprocess.STDOUT)

    def _wait_healthy(self, m: Member) -> None:
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        while time.monotonic() < deadline:
            if not m.up:
                msg = f"etcd member {m.name} exited; see {m.host.lab.shared}/.etcd-{m.name}.log"
                raise RuntimeError(msg)
            if self.ctl(m, "endpoint", "health").returncode == 0:
                return
            time.sleep(0.1)
        msg = f"etcd member {m.name} not healthy after {HEALTH_TIMEOUT_S} s"
        raise RuntimeError(msg)

    def ctl(self, via: Member, *args: str, endpoints: list[str] | None = None,
            timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
        """Run etcdctl on `via`'s host against `endpoints` (default: `via` alone)."""
        argv = [etcd_binary("etcdctl"), f"--endpoints={','.join(endpoints or [via.endpoint])}",
                "--dial-timeout=2s", "--command-timeout=3s", *args]
        return via.host.run(argv, timeout=timeout, env=via.host.env({"ETCDCTL_API": "3"}))

    # The one-member cluster stands in for runner/testing/etcd_server.py's EtcdServer in the multi-node tests:
    @property
    def endpoint(self) -> str:
        """The first member's client endpoint."""
        return self.members[0].endpoint

    def etcdctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run etcdctl against every member, on the first member's host; CalledProcessError if `check` and it fails."""
        done = self.ctl(self.members[0], *args, endpoints=self.endpoints)
        if check and done.returncode:
            raise subprocess.CalledProcessError(done.returncode, ["etcdctl", *args], done.stdout, done.stderr)
        return done

    def stop(self) -> None:
        """SIGTERM every member and wait for it (data kept)."""
        for m in self.members:
            if m.up and m.proc is not None:
                m.proc.terminate()
                m.proc.wait(timeout=15)

    def restart_all(self) -> None:
        """Stop every member, then start each again on its data."""
        self.stop()
        for m in self.members:
            self._spawn(m, "existing")
        for m in self.members:
            self._wait_healthy(m)

    def restart_empty(self) -> None:
        """Stop every member, delete their data, start a new cluster on the same addresses (every key forgotten)."""
        self.stop()
        for m in self.members:
            m.host.run(["rm", "-rf", HOST_DATA])
        self.token = f"{self.token}-again"
        self.start()

    def leader(self) -> Member:
        """The member that leads now, per etcd's own status of the members still up."""
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        while time.monotonic() < deadline:
            for m in self.members:
                if not m.up or m.host.cut_off:
                    continue
                done = self.ctl(m, "endpoint", "status", "-w", "json")
                with contextlib.suppress(ValueError, KeyError, IndexError):
                    status = json.loads(done.stdout)[0]["Status"]
                    lead = int(status["leader"])
                    if lead:
                        return self._by_id(m, lead)
            time.sleep(0.2)
        msg = "no etcd member reports a leader"
        raise RuntimeError(msg)

    def _by_id(self, via: Member, member_id: int) -> Member:
        done = self.ctl(via, "member", "list", "-w", "json")
        for entry in json.loads(done.stdout)["members"]:
            if int(entry["ID"]) == member_id:
                return next(m for m in self.members if m.name == entry["name"])
        msg = f"leader id {member_id:x} is no member"
        raise RuntimeError(msg)

    def kill(self, m: Member) -> None:
        """SIGKILL one member's process (its host and data stay)."""
        if m.proc is not None and m.proc.poll() is None:
            m.proc.kill()
            m.proc.wait(timeout=15)

    def restart(self, m: Member) -> None:
        """Start a killed member again on its data (it rejoins the cluster it was part of)."""
        self.kill(m)
        self._spawn(m, "existing")
        self._wait_healthy(m)

    def say_why(self) -> None:
        """Print each member's exit status and the end of its log (a test failed with this cluster up)."""
        for m in self.members:
            status = "never started" if m.proc is None else m.proc.poll()
            log = m.host.lab.shared / f".etcd-{m.name}.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
            print(f"etcd member {m.name} ({m.endpoint}): exit status {status}; its log ends:\n{tail}")

    def close(self) -> None:
        """Kill every member still running (never raises)."""
        for m in self.members:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                self.kill(m)


@contextlib.contextmanager
def etcd_on_hosts(lab: Lab, names: list[str]) -> Iterator[EtcdCluster]:
    """An etcd of one member per name, each on a new host of that name; killed afterwards."""
    server = EtcdCluster([lab.add(name) for name in names])
    try:
        server.start()
        yield server
    except BaseException:
        server.say_why()
        raise
    finally:
        server.close()
