"""A dead agent is seen by its peers at once: its guard revokes its etcd lease (real agents, real etcd).

The lease TTL and last_call are set far beyond the tests' waits, so a survivor that restarts at all proves that
the lease was revoked (not expired) and that the re-formed round did not wait last_call. A machine that vanishes
(agent and guard gone together) still costs one TTL: tested with a short one. A guard whose etcd is down still
kills the workers and exits. Order, not time, is asserted (transitions.jsonl, etcd's lease table).
"""

from __future__ import annotations

import base64
import json
import re
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import alive, wait_for
from hypothesis import given
from hypothesis import strategies as st
from multinode_helpers import Cluster, Node, probe_args, spec_text

from runner.rendezvous.etcd.lease_revoke import GatewayEndpoint, RevokeError, RevokeTicket, revoke, revoke_grpc
from runner.testing.etcd_cluster import EtcdCluster
from runner.testing.etcd_server import EtcdServer, etcd_server
from runner.testing.hosts import Lab

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

LONG = "300s"  # lease_ttl and last_call that no wait below could sit out
SECRET = "dead-agent-Pa55"
RECOVERY_WAIT_S = 120.0  # a hang bound on a shared machine, far below LONG


def long_spec(endpoint: str, out: Path, *, nodes: str = "2:3", ttl: str = LONG, extra: str = "") -> str:
    """An elastic job whose workers sleep until stopped; lease_ttl `ttl`, last_call LONG."""
    text = spec_text(endpoint, nodes=nodes, args=probe_args(out, "--sleep", "600"), extra=extra)
    return (text.replace("lease_ttl: 3s", f"lease_ttl: {ttl}").replace("last_call: 1s", f"last_call: {LONG}")
            .replace("join_timeout: 90s", "join_timeout: 600s"))


def agent_events(node: Node, event: str) -> list[dict[str, Any]]:
    """The node's agent.jsonl records named `event`."""
    lines = (node.run_dir() / "agent.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("event") == event]


def lease_of(node: Node) -> int:
    """The node's current lease (its last etcd_lease_granted)."""
    return int(agent_events(node, "etcd_lease_granted")[-1]["lease"], 16)


def lease_alive(server: EtcdServer | EtcdCluster, lease: int, *, user: str | None = None) -> bool:
    """Whether etcd still knows `lease` (etcdctl lease timetolive)."""
    args = ("lease", "timetolive", f"{lease:x}")
    done = server.etcdctl(*args, user=user) if isinstance(server, EtcdServer) else server.etcdctl(*args)
    return "already expired" not in done.stdout


def guard_of(node: Node) -> tuple[int, list[str]]:
    """(pid, argv) of the node's guard: the agent's child running shepherd_main."""
    for child in Path(f"/proc/{node.agent_pid}/task").glob("*/children"):
        for pid in map(int, child.read_text().split()):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().rstrip("\0").split("\0")
            if any("shepherd_main" in a for a in argv):
                return pid, argv
    raise AssertionError(f"no guard under agent {node.agent_pid}")


def workers(c: Cluster, attempt: int) -> list[dict[str, Any]]:
    """What the probe workers of `attempt` recorded."""
    return [w for w in c.worker_files() if w["env"]["TORCHELASTIC_RESTART_COUNT"] == str(attempt)]


def wait_workers(c: Cluster, attempt: int, count: int, live: tuple[Node, ...], timeout: float = 60.0) -> None:
    """Wait until `count` workers of `attempt` started; an agent of `live` that exits meanwhile fails the test."""
    def ready() -> bool:
        ended = [n for n in live if n.proc.poll() is not None]
        assert not ended, "".join(f"node {n.name} exited: {n.output()}" for n in ended)
        return len(workers(c, attempt)) == count
    wait_for(ready, timeout, f"{count} worker(s) of attempt {attempt}")


def triggers_after_running(node: Node) -> list[str]:
    """The node's triggers from its first RUNNING on."""
    edges = node.edges()
    first = next(i for i, e in enumerate(edges) if e[2] == "RUNNING")
    return [e[1] for e in edges[first + 1:]]


def last_round(node: Node) -> int:
    """The round the node last ran in (-1 before its first)."""
    line = next((t.get("reason", "") for t in reversed(node.transitions()) if t["dst"] == "RUNNING"), "")
    return int(line.split()[1].rstrip(":")) if line.startswith("round ") else -1


def kill_agent(node: Node) -> int:
    """SIGKILL the node's agent and reap it; the pid of its guard, which lives on."""
    guard, _ = guard_of(node)
    node.proc.send_signal(signal.SIGKILL)
    node.wait()
    return guard


def finish(c: Cluster, *survivors: Node) -> None:
    """Stop the job (runner stop) and wait for the survivors."""
    done = c.cli("stop")
    assert done.returncode == 0, done.stderr
    for node in survivors:
        node.wait()


def assert_peer_lost_then_running(node: Node, victim: str) -> None:
    """After the kill: the node failed on peer_lost naming the victim, then ran again (no timeout in between)."""
    after = triggers_after_running(node)
    assert "peer_lost" in after, node.edges()
    lost = next(t for t in node.transitions() if t["trigger"] == "peer_lost")
    assert f"node {victim} lost" in lost["reason"], lost
    assert "rendezvous_complete" in after[after.index("peer_lost"):], node.edges()
    assert "rendezvous_timeout" not in after, node.edges()


def test_sigkill_of_an_agent_is_seen_before_its_lease_expires(cluster: Cluster, host_etcd: EtcdCluster) -> None:
    """3 nodes (2:3), lease_ttl 300 s: SIGKILL c's agent -> its guard kills its worker and revokes its lease, a and
    b fail on peer_lost, re-form the round without last_call and run 2-node workers."""
    cluster.write(long_spec(cluster.endpoint, cluster.out))
    a, b, c = (cluster.start(n) for n in "abc")
    wait_workers(cluster, 0, 3, (a, b, c))
    lease = lease_of(c)
    assert lease_alive(host_etcd, lease)
    guard = kill_agent(c)
    wait_workers(cluster, 1, 2, (a, b), RECOVERY_WAIT_S)
    assert not lease_alive(host_etcd, lease)  # revoked: 300 s have not passed
    wait_for(lambda: not alive(guard), 30, "c's guard to exit")
    assert not any(cluster.alive(w) for w in workers(cluster, 0) if w["host"] == "c")  # its guard killed it
    assert {w["env"]["WORLD_SIZE"] for w in workers(cluster, 1)} == {"2"}
    for node in (a, b):
        assert_peer_lost_then_running(node, "c")
    assert "could not be revoked" not in c.output()
    finish(cluster, a, b)


@pytest.fixture
def etcd_here(lab: Lab) -> Iterator[EtcdServer]:
    """An etcd of this machine that the lab's hosts reach through the bridge."""
    with etcd_server(lab.shared / "etcd-here", also_on=lab.bridge_ip) as server:
        yield server


@pytest.fixture(params=["tls", "no-tls"])
def auth_etcd(request: pytest.FixtureRequest, lab: Lab) -> Iterator[EtcdServer]:
    """etcd with user/password auth, with TLS (client certificates required: the guard's gRPC route) or without
    (the guard's JSON-gateway route)."""
    with etcd_server(lab.shared / "auth-etcd", tls=request.param == "tls", also_on=lab.bridge_ip) as server:
        server.enable_auth(SECRET)
        yield server


def test_revoked_with_auth(lab: Lab, auth_etcd: EtcdServer) -> None:
    """Auth on (and TLS or not), 2 nodes (1:2): b's guard authenticates with the password it got over the agent's
    pipe and revokes b's lease; a carries on alone. No password in the guard's environment or command line."""
    extra = "  auth: {user: root, password_env: ETCD_PASSWORD}\n"
    if auth_etcd.certs is not None:
        certs = auth_etcd.certs
        extra += f"  tls: {{ca: {certs.ca}, cert: {certs.client_cert}, key: {certs.client_key}}}\n"
    c = Cluster(lab.shared / "cluster", lab, auth_etcd.at(lab.bridge_ip))  # https when rendezvous.tls is set
    c.env = {"ETCD_PASSWORD": SECRET}
    try:
        text = long_spec(c.endpoint, c.out, nodes="1:2")
        c.write(text.replace("  connect_timeout: 20s\n", "  connect_timeout: 20s\n" + extra))
        a, b = c.start("a"), c.start("b")
        wait_workers(c, 0, 2, (a, b))
        lease = lease_of(b)
        guard, argv = guard_of(b)
        assert SECRET not in " ".join(argv)
        assert SECRET.encode() not in Path(f"/proc/{guard}/environ").read_bytes()
        kill_agent(b)
        wait_workers(c, 1, 1, (a,), RECOVERY_WAIT_S)
        assert not lease_alive(auth_etcd, lease, user=f"root:{SECRET}")
        assert_peer_lost_then_running(a, "b")
        assert "could not be revoked" not in b.output()
        finish(c, a)
    finally:
        c.close()


class Silent:
    """A TCP listener that accepts and never answers: an etcd that hangs."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1") -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])

    def close(self) -> None:
        """Stop listening (the guard's pending connections are reset)."""
        self.sock.close()


@pytest.mark.parametrize("down", ["refused", "silent"])
def test_guard_kills_workers_and_exits_when_etcd_is_down(lab: Lab, etcd_here: EtcdServer, down: str) -> None:
    """etcd gone (nothing listens, or a listener that never answers) when the agent dies: the guard still kills the
    worker, gives up on the lease within its bound, says so, and exits. (etcd runs on this machine, reached through
    the bridge, so that the silent listener can take its place.)"""
    cluster = Cluster(lab.shared / "cluster", lab, etcd_here.at(lab.bridge_ip))
    try:
        cluster.write(long_spec(cluster.endpoint, cluster.out, nodes="1"))
        a = cluster.start("a")
        wait_workers(cluster, 0, 1, (a,))
        worker = workers(cluster, 0)[0]
        etcd_here.kill()
        silent = Silent(etcd_here.client_port, lab.bridge_ip) if down == "silent" else None
        try:
            guard = kill_agent(a)
            wait_for(lambda: not cluster.alive(worker), 30, "the worker killed by the guard")
            wait_for(lambda: not alive(guard), 30, "the guard to give up on etcd and exit")
        finally:
            if silent is not None:
                silent.close()
    finally:
        cluster.close()
    assert "its etcd lease could not be revoked" in a.output(), a.output()
    assert "Traceback" not in a.output()


def test_vanished_machine_costs_one_ttl(cluster: Cluster, host_etcd: EtcdCluster) -> None:
    """Host c lost (every process of it killed at once, agent and guard together: nothing left to revoke): the
    lease outlives them until its TTL; then a and b see c lost and run on without it."""
    cluster.write(long_spec(cluster.endpoint, cluster.out, ttl="6s"))
    a, b, c = (cluster.start(n) for n in "abc")
    wait_workers(cluster, 0, 3, (a, b, c))
    lease = lease_of(c)
    c.host.lose()
    c.wait()
    assert lease_alive(host_etcd, lease)  # nobody revoked it: it runs out its TTL (6 s, at least 4 s left)
    wait_workers(cluster, 1, 2, (a, b), RECOVERY_WAIT_S)
    assert not lease_alive(host_etcd, lease)
    for node in (a, b):
        assert_peer_lost_then_running(node, "c")
    finish(cluster, a, b)


def test_a_machine_back_under_its_name_within_its_ttl_is_still_seen_lost(cluster: Cluster, host_etcd: EtcdCluster,
                                                                         lab: Lab) -> None:
    """Host c lost, and a new c (a rebooted machine, a scheduler's requeue) started at once under the same name, while
    the dead run's lease still runs: the new agent's live state takes the dead one's key (on its own lease), so that
    key never vanishes. a and b must still see c lost when the dead run's lease lapses (its join record of their
    round goes with it), and form the next round with the new c. Found by the hosted soak on hosts (CI, 2026-11-28:
    the others waited 225 s in a world with the dead c, the new c alone in the next round)."""
    cluster.write(long_spec(cluster.endpoint, cluster.out, ttl="12s"))
    a, b, c = (cluster.start(n) for n in "abc")
    wait_workers(cluster, 0, 3, (a, b, c))
    lease = lease_of(c)
    rounds = {n.name: last_round(n) for n in (a, b, c)}
    assert len(set(rounds.values())) == 1, rounds
    c.host.lose()
    c.wait()
    lab.add("c")  # the same name, a new machine
    again = cluster.start("c")
    wait_for(lambda: any('"rendezvous_joined"' in line for line in again.output().splitlines()), 30,
             "the new c joined")
    assert lease_alive(host_etcd, lease), "the dead c's lease lapsed before the new c joined: no test"
    for node in (a, b, again):  # a round after the loss, of three nodes: the new c with a and b
        wait_for(lambda n=node: any(int(r) > rounds["a"] for r in re.findall(r"round (\d+): 3 node\(s\)", n.output())),
                 RECOVERY_WAIT_S, f"{node.name} in a later round of 3 nodes")
    for node in (a, b):
        assert_peer_lost_then_running(node, "c")
    finish(cluster, a, b, again)


endpoints = st.lists(st.tuples(st.text(min_size=1, max_size=20), st.integers(1, 65535), st.booleans()),
                     min_size=1, max_size=3)
texts = st.none() | st.text(max_size=40)


@given(st.integers(1, 2**63 - 1), endpoints, texts, texts, texts, texts, texts)
def test_ticket_round_trips_on_one_line(lease: int, eps: list[tuple[str, int, bool]], ca: str | None,
                                        cert: str | None, key: str | None, user: str | None,
                                        password: str | None) -> None:
    """Any ticket (newlines in the password included) encodes to one line and decodes to itself."""
    ticket = RevokeTicket(lease, tuple(GatewayEndpoint(*e) for e in eps), ca, cert, key, user, password)
    line = ticket.encode()
    assert b"\n" not in line
    assert RevokeTicket.decode(line) == ticket
    assert "password=" not in repr(ticket)


@given(st.binary(max_size=200))
def test_anything_else_is_refused_as_a_ticket(data: bytes) -> None:
    """Bytes that are not a ticket raise ValueError, never anything else."""
    try:
        RevokeTicket.decode(data)
    except ValueError:
        pass


def test_revoke_gives_up_within_its_budget_on_a_silent_endpoint() -> None:
    """A listener that never answers: RevokeError naming the endpoint, after the budget (an injected clock)."""
    silent = Silent()
    port = silent.port
    now = [0.0]

    def clock() -> float:
        now[0] += 0.6  # each look at the clock: 0.6 s later
        return now[0]

    try:
        with pytest.raises(RevokeError, match=f"127.0.0.1:{port}"):
            revoke(RevokeTicket(7, (GatewayEndpoint("127.0.0.1", port, https=False),)), budget=2.0, clock=clock)
    finally:
        silent.close()


def granted(server: EtcdServer) -> int:
    """A new 300 s lease, with a key on it."""
    lease = int(server.etcdctl("lease", "grant", "300").stdout.split()[1], 16)
    server.etcdctl("put", "--lease", f"{lease:x}", "/dead-agent/k", "v")
    return lease


@pytest.mark.parametrize("route", ["gateway", "grpc"])
def test_both_routes_revoke_and_a_gone_lease_is_fine(etcd: EtcdServer, route: str) -> None:
    """The JSON gateway and the gRPC route each revoke a real lease (its key vanishes); a lease already gone is no
    error for either."""
    lease = granted(etcd)
    final = f"/dead-agent/final/{route}"
    ticket = RevokeTicket(lease, (GatewayEndpoint("127.0.0.1", etcd.client_port, https=False),),
                          path=tuple(sys.path), final_key=base64.b64encode(final.encode()).decode())
    call = revoke if route == "gateway" else lambda t: revoke_grpc(t, 5.0)
    assert call(ticket) == "revoked"
    assert not lease_alive(etcd, lease)
    assert etcd.etcdctl("get", "/dead-agent/k").stdout == ""
    # the node is marked dead in its final state, on a lease of its own (a hosting node's linger reads it)
    mark = json.loads(etcd.etcdctl("get", "--print-value-only", final).stdout)
    assert (mark["state"], mark["outcome"], mark["by"]) == ("SHUTDOWN", "died", "guard")
    got = json.loads(etcd.etcdctl("get", final, "-w", "json").stdout)
    assert int(got["kvs"][0]["lease"]) != 0
    assert call(ticket) in ("revoked", "already gone")


class NoGatewayEtcd(EtcdServer):
    """etcd with its JSON gateway turned off (--enable-grpc-gateway=false): only gRPC answers."""

    def _argv(self) -> list[str]:
        return [*super()._argv(), "--enable-grpc-gateway=false"]


def test_without_a_gateway_the_grpc_route_revokes(tmp_path: Path) -> None:
    """What answers HTTP on the port is not etcd's gateway: revoke() falls back to gRPC and revokes the lease."""
    server = NoGatewayEtcd(tmp_path / "etcd-data")
    try:
        server.start()
        lease = granted(server)
        ticket = RevokeTicket(lease, (GatewayEndpoint("127.0.0.1", server.client_port, https=False),),
                              path=tuple(sys.path))
        assert revoke(ticket) == "revoked"
        assert not lease_alive(server, lease)
    finally:
        server.kill()
