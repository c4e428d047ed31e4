"""etcd faults and security with real runner processes: etcd down at start, restarted mid-run (with and without its
data), gone when the workers finish; node ids with slashes; TLS + auth."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import wait_for
from multinode_helpers import Cluster, probe_args, spec_text

from runner.testing.etcd_cluster import EtcdCluster
from runner.testing.etcd_server import EtcdServer, etcd_server
from runner.testing.hosts import Lab

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

EXIT_INFRA = 3
SECRET = "s3cret-Pa55-do-not-log"


def test_etcd_down_at_start_names_the_endpoints(lab: Lab) -> None:
    """Nothing listens on the endpoint (host etcd is up, its etcd is not): after connect_timeout the node exits 3
    naming the endpoint."""
    c = Cluster(lab.shared / "cluster", lab, "etcd:2379")
    c.host("etcd")
    try:
        c.write(spec_text(c.endpoint, args=probe_args(c.out), extra="") .replace("connect_timeout: 20s",
                                                                                   "connect_timeout: 2s"))
        node = c.start("a")
        assert node.wait(60) == EXIT_INFRA
        err = node.stderr.read_text()
        assert f"cannot reach etcd at {c.endpoint}" in err, err
        assert "Traceback" not in node.output()
        assert not c.worker_files()
    finally:
        c.close()


def test_etcd_restart_mid_run_keeps_workers(cluster: Cluster, host_etcd: EtcdCluster) -> None:
    """etcd stopped and started again (same data dir) while workers run: no restart, the job completes."""
    cluster.write(spec_text(cluster.endpoint, args=probe_args(cluster.out, "--sleep", "8")))
    a, b = cluster.start("a"), cluster.start("b")
    wait_for(lambda: len(cluster.worker_files()) == 2, what="both workers started")
    wait_for(lambda: a.state() == "RUNNING" and b.state() == "RUNNING", what="a and b RUNNING")
    host_etcd.restart_all()
    assert cluster.wait_all() == {"a": 0, "b": 0}, a.output() + b.output()
    for node in (a, b):
        assert node.report()["attempts"] == 1, node.edges()
        assert node.report()["outcome"] == "succeeded"
    assert len(cluster.worker_files()) == 2  # nobody was restarted


@pytest.fixture
def secure_etcd(lab: Lab) -> Iterator[EtcdServer]:
    """etcd with TLS, client certificates required, and user/password auth (user root), on this machine: the hosts
    reach it through the bridge (its certificate names that address)."""
    with etcd_server(lab.shared / "etcd", tls=True, also_on=lab.bridge_ip) as server:
        server.enable_auth(SECRET)
        yield server


def secure_extra(server: EtcdServer, password_env: str = "ETCD_PASSWORD") -> str:
    """The rendezvous.tls / rendezvous.auth part of the spec (appended under rendezvous)."""
    assert server.certs is not None
    return (f"  tls: {{ca: {server.certs.ca}, cert: {server.certs.client_cert}, key: {server.certs.client_key}}}\n"
            f"  auth: {{user: root, password_env: {password_env}}}\n")


def secure_spec(server: EtcdServer, c: Cluster) -> str:
    """A 2-node spec on the TLS + auth etcd, reached through the bridge (TLS is on because rendezvous.tls is set)."""
    text = spec_text(c.endpoint, args=probe_args(c.out, "--sleep", "1"))
    return text.replace("  connect_timeout: 20s\n", "  connect_timeout: 20s\n" + secure_extra(server))


def test_tls_and_auth_job_completes_without_leaking_the_password(lab: Lab, secure_etcd: EtcdServer) -> None:
    """Two nodes over TLS with client certs and a password from password_env: success; password in no file."""
    c = Cluster(lab.shared / "cluster", lab, secure_etcd.at(lab.bridge_ip))
    c.env["ETCD_PASSWORD"] = SECRET
    try:
        c.write(secure_spec(secure_etcd, c))
        c.start("a"), c.start("b")
        assert c.wait_all() == {"a": 0, "b": 0}, c.nodes["a"].output()
        status = c.cli("status", "--json")
        assert status.returncode == 0 and '"succeeded"' in status.stdout, status.stderr
        for path in c.tmp.rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), f"password leaked into {path}"
        assert SECRET not in status.stdout + status.stderr
    finally:
        c.close()


def test_wrong_password_is_a_clear_error(lab: Lab, secure_etcd: EtcdServer) -> None:
    """A wrong password: exit 3, a message about auth, no traceback, and the wrong password is not echoed."""
    c = Cluster(lab.shared / "cluster", lab, secure_etcd.at(lab.bridge_ip))
    c.env["ETCD_PASSWORD"] = "wrong-" + SECRET
    try:
        c.write(secure_spec(secure_etcd, c))
        node = c.start("a")
        assert node.wait(60) == EXIT_INFRA
        out = node.output()
        assert "rendezvous.auth" in out and "Traceback" not in out, out
        assert SECRET not in out
    finally:
        c.close()


def test_etcd_wiped_mid_run_both_nodes_restart_together(cluster: Cluster, host_etcd: EtcdCluster) -> None:
    """etcd restarted on an EMPTY data dir while workers run: both agents see the job's keys gone (PeerLost 'etcd'),
    fail the attempt, and meet in a new one in the new etcd, on a fresh MASTER_PORT; the job then succeeds."""
    cluster.write(spec_text(cluster.endpoint, args=probe_args(cluster.out, "--sleep", "6")))
    a, b = cluster.start("a"), cluster.start("b")
    wait_for(lambda: len(cluster.worker_files()) == 2, what="both workers started")
    wait_for(lambda: a.state() == "RUNNING" and b.state() == "RUNNING", what="a and b RUNNING")
    host_etcd.restart_empty()
    assert cluster.wait_all() == {"a": 0, "b": 0}, a.output() + b.output()
    for node in (a, b):
        report = node.report()
        assert report["outcome"] == "succeeded" and report["attempts"] == 2, node.edges()
        assert ("RUNNING", "peer_lost", "FAILED") in node.edges()
        assert "etcd lost the job's keys" in report["failures"][0]["reason"], report["failures"]
    ports = {int(w["env"]["TORCHELASTIC_RESTART_COUNT"]): set() for w in cluster.worker_files()}
    for w in cluster.worker_files():
        ports[int(w["env"]["TORCHELASTIC_RESTART_COUNT"])].add(w["env"]["MASTER_PORT"])
    assert sorted(ports) == [0, 1] and len(cluster.worker_files()) == 4
    assert len(ports[0]) == len(ports[1]) == 1 and ports[0] != ports[1], ports  # one world each, fresh port
    status = cluster.status()
    assert status["status"] == "succeeded" and status["restarts"] == 0, status  # data loss: node_lost, uncharged


def test_node_ids_with_slashes_run_and_show_in_status(cluster: Cluster) -> None:
    """`--node rack1/a` and `--node rack1/b` (ids that used to wait out the join timeout) run the job; status shows
    the ids as given."""
    cluster.write(spec_text(cluster.endpoint, args=probe_args(cluster.out)))
    cluster.start("rack1/a", on="a"), cluster.start("rack1/b", on="b")
    assert cluster.wait_all() == {"rack1/a": 0, "rack1/b": 0}, cluster.nodes["rack1/a"].output()
    assert [n["node"] for n in cluster.status()["nodes"]] == ["rack1/a", "rack1/b"]


def test_etcd_gone_when_workers_finish_exits_0_with_a_report(cluster: Cluster, host_etcd: EtcdCluster) -> None:
    """etcd killed (past the connect timeout) while the workers run to success: each agent still exits 0, writes
    report.json with outcome succeeded, and warns that etcd could not be told."""
    text = spec_text(cluster.endpoint, args=probe_args(cluster.out, "--sleep", "5"))
    cluster.write(text.replace("connect_timeout: 20s", "connect_timeout: 2s"))
    a, b = cluster.start("a"), cluster.start("b")
    wait_for(lambda: len(cluster.worker_files()) == 2, what="both workers started")
    wait_for(lambda: a.state() == "RUNNING" and b.state() == "RUNNING", what="a and b RUNNING")
    host_etcd.close()  # killed
    assert cluster.wait_all(60) == {"a": 0, "b": 0}, a.output() + b.output()
    for node in (a, b):
        assert node.report()["outcome"] == "succeeded"
        out = node.output()
        assert "warning" in out and f"cannot reach etcd at {cluster.endpoint} within 2 s" in out, out
        assert "Traceback" not in node.output()
