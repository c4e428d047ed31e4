"""A hosted rendezvous closed to strangers (docs/security.md): the job's secret, what derives from it, and an attacker
on simulated hosts (runner/testing/hosts.py) who knows the endpoint but not the secret.

The secret file lives in the lab's shared folder, which every host reads; the job's agents get it through
RUNNER_SECRET_FILE (the cluster's env) or rendezvous.secret_file; a stranger host gets none, or a wrong one.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import PROBE, RUNNER, wait_for
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from hosted_helpers import HOSTED_PORT, hosted_cluster, hosted_event, hosted_spec, job_secret_file, port_of, start_host
from hypothesis import given, settings
from hypothesis import strategies as st
from multinode_helpers import Cluster, probe_args

from runner.config.loader import load_spec
from runner.contract import SECRET_ENV
from runner.errors import RendezvousError
from runner.rendezvous.etcd.job_secret import SecretSource, derive, new_secret_file, read_secret
from runner.rendezvous.etcd.lease_revoke import GatewayEndpoint, RevokeTicket
from runner.rendezvous.spec_check import shared_tree
from runner.testing.hosts import Lab
from runner.workers.launch_plan import without_agent_secrets

ETCDCTL = str(Path(sys.executable).parent / "etcdctl")
cluster = pytest.fixture(hosted_cluster, name="cluster")  # host a hosts; every node has the secret


# --- the secret and what derives from it (no hosts) ---------------------------------------------------------------

def test_new_secret_is_private_and_never_overwritten(tmp_path: Path) -> None:
    """`runner secret --new` writes 64 hex digits, mode 0600; a second call refuses (exit 2) and keeps the file."""
    path = tmp_path / "s"
    done = subprocess.run([*RUNNER, "secret", "--new", str(path)], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    first = path.read_text()
    assert len(bytes.fromhex(first.strip())) == 32
    again = subprocess.run([*RUNNER, "secret", "--new", str(path)], capture_output=True,
                           text=True, check=False)
    assert again.returncode == 2 and "never overwritten" in again.stderr and "Traceback" not in again.stderr
    assert path.read_text() == first


def test_new_secret_says_an_export_line_that_works_in_any_folder(tmp_path: Path) -> None:
    """`runner secret --new job.secret` said `export RUNNER_SECRET_FILE=job.secret`: pasted on another node, in
    another folder, that names no file. The line it prints has the absolute path."""
    done = subprocess.run([*RUNNER, "secret", "--new", "job.secret"], capture_output=True,
                          text=True, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith(f"export RUNNER_SECRET_FILE={tmp_path / 'job.secret'}"), done.stdout


def test_a_secret_others_can_read_is_refused_naming_chmod(tmp_path: Path) -> None:
    path = tmp_path / "s"
    new_secret_file(path)
    path.chmod(0o640)
    with pytest.raises(RendezvousError) as caught:
        read_secret(SecretSource(str(path), "rendezvous.secret_file"))
    assert "rendezvous.secret_file" in caught.value.message and caught.value.fix == f"chmod 600 {path}"


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=200))
def test_any_file_content_is_read_or_refused_clearly(content: bytes) -> None:
    """Whatever a secret file holds: its 32 bytes, or a RendezvousError naming the field (never another error)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "s"
        path.write_bytes(content)
        path.chmod(0o600)
        try:
            assert len(read_secret(SecretSource(str(path), "rendezvous.secret_file"))) == 32
        except RendezvousError as exc:
            assert "rendezvous.secret_file" in exc.message and exc.fix


def test_every_node_derives_the_same_ca_and_password_and_only_it_signs() -> None:
    """Same secret and job: the same CA key and password on every node; the hosting node's server certificate is
    signed by that CA; another secret (or another job's name) gives another CA and password."""
    secret = os.urandom(32)
    one, two = derive(secret, "train"), derive(secret, "train")
    ca_one, ca_two = x509.load_pem_x509_certificate(one.ca_pem), x509.load_pem_x509_certificate(two.ca_pem)
    assert ca_one.public_key() == ca_two.public_key() and ca_one.subject == ca_two.subject
    assert one.password == two.password and len(one.password) == 64
    cert_pem, _ = one.server_credentials(("a", "10.0.0.5"))
    cert = x509.load_pem_x509_certificate(cert_pem)
    key = ca_two.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey)
    cert.verify_directly_issued_by(ca_two)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "a" in names.get_values_for_type(x509.DNSName)
    for other in (derive(os.urandom(32), "train"), derive(secret, "other")):
        assert other.password != one.password
        with pytest.raises((ValueError, TypeError, Exception)):
            cert.verify_directly_issued_by(x509.load_pem_x509_certificate(other.ca_pem))
    assert one.password not in repr(one) and secret.hex() not in repr(one)


def test_the_secret_path_reaches_no_worker_and_no_shared_tree(tmp_path: Path) -> None:
    secret = job_secret_file(tmp_path)
    spec_path = tmp_path / "job.yaml"
    spec_path.write_text(hosted_spec(HOSTED_PORT).replace("hosted: true", f"hosted: true\n  secret_file: {secret}"))
    spec = load_spec(spec_path, {"LOGS": str(tmp_path)})
    assert spec.rendezvous.secret_file == str(secret)
    assert "secret_file" not in json.dumps(shared_tree(spec))
    assert SECRET_ENV not in without_agent_secrets(spec, {SECRET_ENV: str(secret), "HOME": "/h"})


def test_a_secret_file_for_an_etcd_of_ones_own_is_refused(tmp_path: Path) -> None:
    """rendezvous.secret_file means nothing to an etcd the user runs (it has its own TLS and users): refused."""
    spec_path = tmp_path / "job.yaml"
    spec_path.write_text(hosted_spec(HOSTED_PORT).replace("hosted: true", "hosted: false\n  secret_file: s"))
    done = subprocess.run([*RUNNER, "validate", str(spec_path)], capture_output=True,
                          text=True, check=False, env={**os.environ, "LOGS": str(tmp_path)})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "secret_file applies to a hosted rendezvous" in done.stderr and "Traceback" not in done.stderr


def test_a_revoke_ticket_carries_the_ca_text() -> None:
    trust = derive(os.urandom(32), "train")
    ticket = RevokeTicket(7, (GatewayEndpoint("a", 1, https=False),), user="root", password=trust.password,
                          ca_pem=trust.ca_pem.decode())
    back = RevokeTicket.decode(ticket.encode())
    assert back == ticket and back.tls and trust.password not in repr(back)


# --- an attacker on simulated hosts -------------------------------------------------------------------------------



def as_stranger(cluster: Cluster, *args: str, secret: Path | None = None,
                spec: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`runner ARGS job.yaml` on host c, without the job's secret (or with `secret`, a wrong one)."""
    saved = dict(cluster.env)
    cluster.env.clear()
    if secret is not None:
        cluster.env[SECRET_ENV] = str(secret)
    try:
        return cluster.cli(*args, on="c", spec=spec, timeout=60)
    finally:
        cluster.env.clear()
        cluster.env.update(saved)


def etcdctl(cluster: Cluster, *flags: str) -> subprocess.CompletedProcess[str]:
    """etcdctl on the stranger's host, reading every key of the hosted etcd."""
    host = cluster.host("c")
    return host.run([ETCDCTL, f"--endpoints={cluster.endpoint}", "--dial-timeout=2s", "--command-timeout=3s",
                     *flags, "get", "--prefix", ""], timeout=30)


def test_a_stranger_can_neither_join_read_nor_stop_and_the_job_runs_on(cluster: Cluster, lab: Lab) -> None:
    """a and b run with the secret; c, who knows the endpoint, tries to join without a secret and with a wrong one,
    to read the keys with etcdctl (plain, then TLS without verifying), and to stop the job: each is refused with a
    clear message, the job keeps world size 2, and `runner status` / `runner stop` from a login host with the secret
    work."""
    cluster.write(hosted_spec(port_of(cluster), args=probe_args(cluster.out, "--sleep", "60")))
    a, event = start_host(cluster)
    assert event["client_urls"].startswith("https://")
    b = cluster.start("b")
    wait_for(lambda: a.state() == "RUNNING" and b.state() == "RUNNING", what="a and b RUNNING")

    joined = as_stranger(cluster, "run")
    assert joined.returncode == 3, joined.stdout + joined.stderr
    assert "needs the job's secret" in joined.stderr and "rendezvous.secret_file" in joined.stderr
    assert "runner secret --new" in joined.stderr and "Traceback" not in joined.stderr

    wrong = lab.shared / "wrong.secret"
    new_secret_file(wrong)
    spec_wrong = cluster.write(cluster.spec.read_text().replace("hosted: true", f"hosted: true\n  secret_file: {wrong}"),
                               "wrong.yaml")
    joined = as_stranger(cluster, "run", spec=spec_wrong)
    assert joined.returncode == 3, joined.stdout + joined.stderr
    assert "is not this job's rendezvous" in joined.stderr and "rendezvous.secret_file" in joined.stderr
    assert "Traceback" not in joined.stderr

    plain = etcdctl(cluster)
    assert plain.returncode != 0 and "hosted" not in plain.stdout, plain.stdout
    unverified = etcdctl(cluster, "--insecure-skip-tls-verify", "--insecure-transport=false")
    assert unverified.returncode != 0 and "hosted" not in unverified.stdout, unverified.stdout
    assert "user name is empty" in unverified.stderr or "permission denied" in unverified.stderr, unverified.stderr
    guessed = etcdctl(cluster, "--insecure-skip-tls-verify", "--insecure-transport=false", "--user=root:root")
    assert guessed.returncode != 0 and "authentication failed" in guessed.stderr, guessed.stderr

    stop = as_stranger(cluster, "stop")
    assert stop.returncode == 3 and "needs the job's secret" in stop.stderr, stop.stdout + stop.stderr
    stop = as_stranger(cluster, "stop", secret=wrong)
    assert stop.returncode == 3 and "is not this job's rendezvous" in stop.stderr, stop.stdout + stop.stderr
    status = as_stranger(cluster, "status")
    assert status.returncode == 3 and "Traceback" not in status.stderr, status.stdout + status.stderr

    seen = cluster.status()  # from the login host, with the secret
    assert seen["status"] == "running" and seen["world_size"] == 2, seen
    assert [n["node"] for n in seen["nodes"]] == ["a", "b"]
    assert a.state() == b.state() == "RUNNING"

    stopped = cluster.cli("stop")
    assert stopped.returncode == 0, stopped.stderr
    codes = cluster.wait_all()
    assert codes["a"] == codes["b"] != 0, codes
    secret_hex = Path(cluster.env[SECRET_ENV]).read_text().strip()
    password = derive(bytes.fromhex(secret_hex), "hosted").password
    for node in (a, b):
        texts = [node.output(), *(p.read_text(errors="replace") for p in node.run_dir().rglob("*") if p.is_file())]
        assert not any(secret_hex in t or password in t for t in texts), node.name
    assert {info["env"]["WORLD_SIZE"] for info in cluster.worker_files()} == {"2"}


def test_the_real_nodes_refuse_a_host_posing_as_theirs(cluster: Cluster, lab: Lab) -> None:
    """x binds the endpoint first with an etcd of its own (a runner job with its own secret, same name and port): the
    job's nodes, whose endpoint names x, refuse it (its certificate is not signed by the job's CA) and start no
    worker."""
    port = port_of(cluster)
    cluster.endpoint = f"x:{port}"
    spec = cluster.write(hosted_spec(port, host="x", args=probe_args(cluster.out)))
    impostor_secret = lab.shared / "impostor.secret"
    new_secret_file(impostor_secret)
    impostor_spec = cluster.write(spec.read_text().replace("hosted: true", f"hosted: true\n  secret_file: "
                                                           f"{impostor_secret}"), "impostor.yaml")
    impostor = cluster.start("x", spec=impostor_spec)
    wait_for(lambda: hosted_event(impostor) is not None, what="x hosts its own etcd")
    a, b = cluster.start("a"), cluster.start("b")
    assert a.wait(60) == 3 and b.wait(60) == 3, a.output() + b.output()
    for node in (a, b):
        out = node.output()
        assert f"the etcd at x:{port} is not this job's rendezvous" in out, out
        assert "RUNNER_SECRET_FILE" in out and "Traceback" not in out, out
    assert cluster.worker_files() == []
    impostor.proc.terminate()
    impostor.wait(60)


def test_a_secret_given_by_field_and_a_spec_without_one_for_one_node(tmp_path: Path) -> None:
    """The field wins over the variable; a single-node (or loopback) hosted job needs no secret: it starts as
    before (tested end to end by tests/multinode/test_multinode_hosted.py's loopback tests)."""
    secret = job_secret_file(tmp_path)
    spec_path = tmp_path / "job.yaml"
    spec_path.write_text(textwrap.dedent(f"""\
        version: 1
        name: one
        entrypoint: {{script: {PROBE}}}
        rendezvous: {{backend: etcd, hosted: true, endpoints: ["127.0.0.1:29400"], secret_file: {secret.name}}}
        """))
    spec = load_spec(spec_path, {})
    assert spec.rendezvous.secret_file == str(secret)


def test_the_guard_revokes_a_lease_on_a_secret_etcd_by_gateway_and_by_grpc(tmp_path: Path) -> None:
    """A dead agent's guard holds only the ticket (the CA as PEM text, root's password): both routes, the JSON
    gateway over https and gRPC, verify the hosted etcd against the job's CA and revoke the lease; a ticket with
    another job's CA revokes nothing."""
    import asyncio

    from runner.rendezvous.etcd.client import Credentials, EtcdSession
    from runner.rendezvous.etcd.hosted_server import HostedEtcd
    from runner.rendezvous.etcd.lease_revoke import RevokeError, revoke, revoke_grpc
    from runner.testing.etcd_server import free_port

    trust = derive(os.urandom(32), "train")
    port = free_port()
    creds = Credentials(ca=trust.ca_pem, user="root", password=trust.password, trust_from="test")

    def ticket(lease: int, ca: str = trust.ca_pem.decode()) -> RevokeTicket:
        return RevokeTicket(lease, (GatewayEndpoint("127.0.0.1", port, https=False),), user="root",
                            password=trust.password, ca_pem=ca)

    async def scenario() -> None:
        server = HostedEtcd(tmp_path / "etcd", ("127.0.0.1",), port, f"127.0.0.1:{port}", trust=trust,
                            host="127.0.0.1")
        assert await server.start(20)
        session = EtcdSession([f"127.0.0.1:{port}"], creds, connect_timeout=10, probe_key=b"/x")
        try:
            await session.connect()
            leases = [await session.call(lambda c: c.lease_grant(30)) for _ in range(3)]
            other = derive(os.urandom(32), "train").ca_pem.decode()
            with pytest.raises(RevokeError):
                await asyncio.to_thread(revoke, ticket(leases[2], other))
            assert await asyncio.to_thread(revoke, ticket(leases[0])) == "revoked"
            assert await asyncio.to_thread(revoke_grpc, ticket(leases[1]), 3.0) == "revoked"
            for lease in leases[:2]:
                assert await session.call(lambda c, lease=lease: c.lease_keepalive(lease)) <= 0
            assert await session.call(lambda c: c.lease_keepalive(leases[2])) > 0
        finally:
            await session.close()
            await server.stop()

    asyncio.run(scenario())
