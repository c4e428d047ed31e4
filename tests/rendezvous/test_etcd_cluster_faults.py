"""etcd as production runs it: a 3-member cluster on 3 hosts of its own, and a job of 2 nodes on 2 more hosts.

The leader's host lost while the job trains and while it rendezvouses, a member cut off (a minority member has no
leader: its answers must not be trusted), a member killed and brought back. Each time the job goes on and nothing
is decided twice: one world per attempt (one MASTER_ADDR:MASTER_PORT, ranks 0..N-1 each held by one host). The
stall each fault costs the running job is printed (docs/multinode.md quotes it; the benchmark of record is
bench/multinode_hosts.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import etcd_on_hosts, wait_for
from hosted_helpers import events_of
from multinode_helpers import Cluster, Node, probe_args, spec_text

from runner.testing.etcd_cluster import EtcdCluster, Member
from runner.testing.hosts import Lab

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture
def etcd3(lab: Lab) -> Iterator[EtcdCluster]:
    """Three etcd members, each on a host of its own (e1, e2, e3)."""
    with etcd_on_hosts(lab, ["e1", "e2", "e3"]) as server:
        yield server


@pytest.fixture
def job(lab: Lab, etcd3: EtcdCluster) -> Iterator[Cluster]:
    """A Cluster on the 3-member etcd (every member in rendezvous.endpoints)."""
    c = Cluster(lab.shared / "cluster", lab, etcd3.endpoints)
    try:
        yield c
    finally:
        c.close()


LEASE_TTL_S = 3.0  # multinode_helpers.spec_text's lease_ttl


def one_world_per_attempt(c: Cluster, world: int) -> dict[int, list[dict[str, Any]]]:
    """Every attempt's workers: one master, ranks 0..world-1 each once, each held by one host."""
    by_attempt: dict[int, list[dict[str, Any]]] = {}
    for w in c.worker_files():
        by_attempt.setdefault(int(w["env"]["TORCHELASTIC_RESTART_COUNT"]), []).append(w)
    for attempt, workers in by_attempt.items():
        masters = {(w["env"]["MASTER_ADDR"], w["env"]["MASTER_PORT"]) for w in workers}
        assert len(masters) == 1, (attempt, masters)
        assert sorted(int(w["env"]["RANK"]) for w in workers) == list(range(world)), (attempt, workers)
        assert len({w["host"] for w in workers}) == world, (attempt, workers)
    return by_attempt


def beat_gap(c: Cluster, since: float) -> float:
    """How long `runner status` (through etcd) could not be read after `since`: the stall a user sees."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if c.cli("status", "--json", timeout=30).returncode == 0:
            return time.monotonic() - since
        time.sleep(0.1)
    raise AssertionError("runner status never answered again")


def connected_to(node: Node) -> tuple[int, str | None]:
    """How many times the node's agent said `etcd_connected`, and the endpoint it said last (the one it uses)."""
    said = [str(e["endpoint"]) for e in events_of(node, "etcd_connected")]
    return len(said), (said[-1] if said else None)


def test_the_member_an_agent_uses_lost_while_training_it_fails_over_without_a_restart(
        job: Cluster, etcd3: EtcdCluster) -> None:
    """The host of the member agent a is connected to (a says which in its log) is lost mid-training: a connects to
    another member within the lease's TTL (its `etcd_connected` names it), `runner status` answers again within a
    bound, the workers are never restarted and the job succeeds. Without failover in the client (a session that never
    moves off its endpoint) a says no new connection and the test fails."""
    job.write(spec_text(job.endpoints, args=probe_args(job.out, "--sleep", "10")))
    a, b = job.start("a"), job.start("b")
    wait_for(lambda: a.state() == "RUNNING" and b.state() == "RUNNING", what="a and b RUNNING")
    before, used = connected_to(a)
    member = next(m for m in etcd3.members if m.endpoint == used)
    t0 = time.monotonic()
    member.host.lose()
    wait_for(lambda: connected_to(a)[0] > before, timeout=LEASE_TTL_S, what="a connected to another member")
    assert connected_to(a)[1] not in (None, used), events_of(a, "etcd_connected")
    stall = beat_gap(job, t0)
    print(f"member {member.name} (a's) lost while training: status answered again after {stall:.2f} s")
    assert stall < LEASE_TTL_S + 5, stall
    assert job.wait_all() == {"a": 0, "b": 0}, a.output() + b.output()
    for node in (a, b):
        report = node.report()
        assert (report["outcome"], report["attempts"], report["restarts"]) == ("succeeded", 1, 0), report
    assert list(one_world_per_attempt(job, 2)) == [0]


def test_leader_lost_while_rendezvousing_one_round_one_set_of_ranks(job: Cluster, etcd3: EtcdCluster) -> None:
    """The leader's host lost while b has joined the round and a has not yet arrived: the round completes once a
    joins (on the members left) with one set of ranks, and the job succeeds."""
    job.write(spec_text(job.endpoints, args=probe_args(job.out, "--sleep", "2")))
    b = job.start("b")
    wait_for(lambda: b.state() == "RENDEZVOUS", what="b waiting in the round")
    etcd3.leader().host.lose()
    a = job.start("a")
    assert job.wait_all() == {"a": 0, "b": 0}, a.output() + b.output()
    assert list(one_world_per_attempt(job, 2)) == [0]


def test_a_member_cut_off_and_a_member_killed_and_back(job: Cluster, etcd3: EtcdCluster) -> None:
    """A follower cut off (it has no leader: a minority of one, which must not be trusted) and later another
    member killed and started again while the job trains: no restart, the job succeeds, the cut-off member heals."""
    job.write(spec_text(job.endpoints, args=probe_args(job.out, "--sleep", "10")))
    a, b = job.start("a"), job.start("b")
    wait_for(lambda: a.state() == "RUNNING" and b.state() == "RUNNING", what="a and b RUNNING")
    leader = etcd3.leader()
    cut, killed = [m for m in etcd3.members if m is not leader][:2]
    cut.host.cut()
    try:
        status = job.cli("status", "--json")
        assert status.returncode == 0, status.stderr
        minority = etcd3.ctl(cut, "get", "/nothing", "--consistency=l")
        assert minority.returncode != 0, minority.stdout  # no leader there: a linearizable read is refused
    finally:
        cut.host.heal()
    etcd3.kill(killed)
    restart_member(etcd3, killed)
    assert job.wait_all() == {"a": 0, "b": 0}, a.output() + b.output()
    for node in (a, b):
        assert node.report()["attempts"] == 1, node.edges()
    assert list(one_world_per_attempt(job, 2)) == [0]


def restart_member(etcd3: EtcdCluster, member: Member) -> None:
    """Start a killed member again on its data; it rejoins the cluster."""
    etcd3.restart(member)
    assert member.up
