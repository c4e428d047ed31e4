"""The hosted rendezvous's members without a network: the spec's field, the member count, the endpoints a session
learns, the last round a lingering member waits for (runner/rendezvous/etcd/members.py, client.py, hosted.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
import structlog
import structlog.testing
from hypothesis import given
from hypothesis import strategies as st
from rdzv_helpers import Node, make_spec, run

from runner.config import load_spec_text
from runner.config.clusters.kubernetes import agent_container
from runner.config.clusters.slurm import sbatch_script
from runner.contract import HOSTED_NODES_ENV
from runner.errors import RendezvousError, SpecError, SpecProblem
from runner.rendezvous.base import RendezvousResult
from runner.rendezvous.etcd.client import Credentials, EtcdSession, MemberInfo
from runner.rendezvous.etcd.hosted import HostedRendezvous, round_members, with_member_hosts
from runner.rendezvous.etcd.keys import JobKeys, dump
from runner.rendezvous.etcd.lease_revoke import RevokeTicket
from runner.rendezvous.etcd.members import (
    Membership,
    client_urls,
    lost_members,
    may_grow,
    peer_host,
    serving,
    target,
)
from runner.testing.etcd_server import EtcdServer, free_port

HOSTED = """\
name: job
entrypoint: train.py
nodes: "{nodes}"
rendezvous:
  backend: etcd
  hosted: true
  endpoints: {endpoints}
{more}"""


def spec(nodes: str = "2:8", endpoints: str = '["n0:29400"]', more: str = "") -> str:
    return HOSTED.format(nodes=nodes, endpoints=endpoints, more=more)


def problems(text: str) -> list[SpecProblem]:
    with pytest.raises(SpecError) as caught:
        load_spec_text(text, source="job.yaml", environ={})
    return caught.value.problems


def test_hosted_members_defaults_to_three_and_takes_one_three_or_five() -> None:
    assert load_spec_text(spec(), source="job.yaml", environ={}).rendezvous.hosted_members == 3
    for count in (1, 3, 5):
        loaded = load_spec_text(spec(more=f"  hosted_members: {count}\n"), source="job.yaml", environ={})
        assert loaded.rendezvous.hosted_members == count
    for count in (0, 2, 4, 6, -1):
        found = problems(spec(more=f"  hosted_members: {count}\n"))
        assert [p.path for p in found] == ["rendezvous.hosted_members"], found


def test_hosted_members_without_hosted_is_refused_as_doing_nothing() -> None:
    text = spec(more="  hosted_members: 1\n").replace("  hosted: true\n", "")
    (found,) = problems(text)
    assert found.path == "rendezvous.hosted_members" and "does nothing" in found.message, found


def test_hosted_endpoints_name_the_members_on_one_port_and_no_more_than_the_members() -> None:
    three = '["n0:29400", "n1:29400", "n2:29400"]'
    three_members = spec(endpoints=three, more="  hosted_members: 3\n")
    assert load_spec_text(three_members, source="job.yaml", environ={}).rendezvous.endpoints[2] == "n2:29400"
    assert load_spec_text(spec(endpoints=three), source="job.yaml", environ={}).rendezvous.hosted_members == 3
    (found,) = problems(spec(endpoints=three, more="  hosted_members: 1\n"))
    assert found.path == "rendezvous.endpoints" and "at most" in found.message, found
    (found,) = problems(spec(endpoints='["n0:29400", "n1:29401"]', more="  hosted_members: 3\n"))
    assert "one port" in found.message, found
    (found,) = problems(spec(endpoints='["n0:29400", "0.0.0.0:29400"]', more="  hosted_members: 3\n"))
    assert "no address" in found.message, found


@given(members=st.sampled_from([1, 3, 5]), nodes_max=st.integers(1, 64), secured=st.booleans())
def test_the_member_count_is_odd_never_above_the_nodes_and_one_without_the_secret(
        members: int, nodes_max: int, secured: bool) -> None:
    loaded = load_spec_text(spec(nodes=f"1:{nodes_max}", more=f"  hosted_members: {members}\n"), source="job.yaml",
                            environ={})
    count = target(loaded, secured=secured)
    assert count % 2 == 1 and 1 <= count <= max(1, min(members, nodes_max))
    assert count == (min(members, nodes_max) - (min(members, nodes_max) + 1) % 2 if secured else 1)


def member(i: int, ip: str, *, learner: bool = False) -> MemberInfo:
    return MemberInfo(i, f"n{i}", (f"https://{ip}:29401",), (f"https://{ip}:29400",), learner)


def test_members_grow_over_machines_not_nodes() -> None:
    """a and b share 10.0.0.1 (a hosts the founding member), c is alone on 10.0.0.3: one machine with no member is
    no reason to grow to two voters that would need each other (the old rule counted the nodes: c joined)."""
    founder = [member(1, "10.0.0.1")]
    assert not may_grow("10.0.0.3", founder, {"10.0.0.1", "10.0.0.3"})
    assert may_grow("10.0.0.3", founder, {"10.0.0.1", "10.0.0.3", "10.0.0.4"})  # d on a machine of its own
    assert not may_grow("10.0.0.1", founder, {"10.0.0.1", "10.0.0.3", "10.0.0.4"})  # b: its machine has one
    two = [member(1, "10.0.0.1"), member(3, "10.0.0.3")]
    assert may_grow("10.0.0.4", two, {"10.0.0.4"})  # an even count grows by any free machine (a lost member's)
    assert not may_grow("10.0.0.4", [*two, member(5, "10.0.0.5", learner=True)], {"10.0.0.4", "10.0.0.6"})


@given(machines=st.lists(st.integers(0, 5), min_size=1, max_size=12), goal=st.sampled_from([1, 3, 5]))
def test_growth_over_any_placement_ends_odd_one_per_machine_as_many_as_the_machines_allow(
    machines: list[int], goal: int
) -> None:
    """Node i runs on machine machines[i]; node 0 founds. The nodes join one at a time as the rule lets them (each
    re-reads the list, as reconcile does) until the goal: the count is odd, one member per machine, and as high as
    the distinct machines among the first 2 x goal nodes allow."""
    first = [f"10.0.0.{m}" for m in machines[:2 * goal]]
    members = [member(0, first[0])]
    while len(members) < goal:
        joining = next((ip for ip in first if may_grow(ip, members, set(first))), None)
        if joining is None:
            break
        members.append(member(len(members), joining))
    hosts = [peer_host(m) for m in members]
    assert len(set(hosts)) == len(hosts)
    assert len(members) % 2 == 1
    distinct = len(set(first))
    assert len(members) == min(goal, distinct if distinct % 2 else distinct - 1)


def test_learners_serve_no_client_and_a_member_is_known_by_its_peer_address() -> None:
    members = [member(1, "10.0.0.1"), member(2, "10.0.0.2", learner=True)]
    assert client_urls(members) == ["https://10.0.0.1:29400"]
    assert [peer_host(m) for m in members] == ["10.0.0.1", "10.0.0.2"]


def test_a_session_learns_members_keeps_the_given_endpoints_first_and_prefers_one_that_answered() -> None:
    session = EtcdSession(["n0:29400"], Credentials(), connect_timeout=1, probe_key=None,
                          log=structlog.get_logger("test"))
    session.learn(["https://10.0.0.2:29400", "https://10.0.0.3:29400", "https://n0:29400"])
    assert [str(e) for e in session.endpoints] == ["n0:29400", "10.0.0.2:29400", "10.0.0.3:29400"]
    session.learn(["https://10.0.0.3:29400"])  # 10.0.0.2 removed since
    assert [str(e) for e in session.endpoints] == ["n0:29400", "10.0.0.3:29400"]
    session.prefer(session.endpoints[1])
    assert session._next_endpoint == 1


@dataclass
class KV:
    key: bytes
    value: bytes


class Snapshot:
    """A session whose snapshot answers the rounds' result keys given."""

    def __init__(self, kvs: list[KV]) -> None:
        self.kvs = kvs

    async def call(self, op: object) -> tuple[int, list[list[KV]]]:
        return 1, [self.kvs]


def test_the_last_member_waits_only_for_the_last_rounds_nodes() -> None:
    keys = JobKeys("/runner", "job")
    kvs = [KV(keys.result(r), dump({"nodes": nodes})) for r, nodes in ((0, ["a", "b", "c"]), (1, ["b", "c"]))]
    kvs += [KV(keys.result(12), dump({"nodes": ["c", "d"]})), KV(keys.join(1, "b"), b"{}")]
    assert asyncio.run(round_members(Snapshot(kvs), keys)) == {"c", "d"}  # type: ignore[arg-type]
    assert asyncio.run(round_members(Snapshot(kvs[:2]), keys)) == {"b", "c"}  # type: ignore[arg-type]


def test_learnt_members_reach_the_guards_revoke_ticket(etcd: EtcdServer) -> None:
    """A node that learns the members (EtcdRendezvous.learn) hands its guard a revoke ticket listing them, so that a
    dead agent's lease is revoked through any live member; an unchanged list sends nothing new."""
    tickets: list[RevokeTicket] = []

    async def body() -> None:
        node = Node(make_spec(etcd.endpoint, nmin=1, nmax=1), "a")
        node.rdzv.on_lease(tickets.append)
        await node.open()
        try:
            assert [f"{e.host}:{e.port}" for e in tickets[-1].endpoints] == [etcd.endpoint]
            sent = len(tickets)
            node.rdzv.learn(["https://10.9.9.9:2379", "https://10.9.9.8:2379"])
            assert [f"{e.host}:{e.port}" for e in tickets[-1].endpoints] == [
                etcd.endpoint, "10.9.9.9:2379", "10.9.9.8:2379"]
            assert tickets[-1].lease == tickets[sent - 1].lease != 0
            node.rdzv.learn(["https://10.9.9.9:2379", "https://10.9.9.8:2379"])
            assert len(tickets) == sent + 1
        finally:
            await node.rdzv.close("succeeded")

    run(body)


def test_both_templates_name_the_members_hosts_of_a_hosted_job() -> None:
    """A hosted job of up to five nodes: sbatch exports the allocation's first three hosts, Kubernetes the first three
    pods' stable names, in RUNNER_HOSTED_NODES; a two-node job names one host; a job on an etcd of one's own none."""
    five = load_spec_text(spec(nodes="3:5", more="  hosted_members: 3\n") + "cluster: {kubernetes: {image: img:1}}\n",
                          source="job.yaml", environ={})
    script = sbatch_script(five, "job.yaml")
    assert 'export RUNNER_HOSTED_NODES="$(scontrol show hostnames "${SLURM_JOB_NODELIST}" | head -n 3 | paste' in script
    env = {e["name"]: e.get("value") for e in agent_container(five, "job.yaml")["env"]}  # type: ignore[union-attr]
    assert env[HOSTED_NODES_ENV] == ",".join(f"job-{i}.job.default.svc" for i in range(3))
    two = load_spec_text(spec(nodes="2", more="  hosted_members: 3\n"), source="job.yaml", environ={})
    assert "head -n 1 | paste" in sbatch_script(two, "job.yaml")
    own = load_spec_text(spec().replace("  hosted: true\n", ""), source="job.yaml", environ={})
    assert HOSTED_NODES_ENV not in sbatch_script(own, "job.yaml")
    assert HOSTED_NODES_ENV not in str(agent_container(own, "job.yaml"))


@given(hint=st.text(max_size=300))
def test_any_member_hosts_value_adds_endpoints_or_is_refused_naming_the_variable(hint: str) -> None:
    """Whatever $RUNNER_HOSTED_NODES holds: its host names become endpoints on the first endpoint's port (once each,
    after the spec's own), or a RendezvousError names the variable; never anything else."""
    base = load_spec_text(spec(endpoints='["n0:29400"]'), source="job.yaml", environ={})
    added, error = with_member_hosts(base, hint)
    if error is not None:
        assert HOSTED_NODES_ENV in error.message and added is base
        return
    endpoints = added.rendezvous.endpoints
    assert endpoints[0] == "n0:29400" and len(set(endpoints)) == len(endpoints)
    assert all(e.endswith(":29400") for e in endpoints)
    assert {e.rsplit(":", 1)[0] for e in endpoints[1:]} == {n.strip() for n in hint.split(",") if n.strip()} - {"n0"}


def test_member_hosts_from_the_template_join_the_endpoints_and_a_bad_value_is_refused_at_open() -> None:
    base = load_spec_text(spec(endpoints='["n0:29400"]'), source="job.yaml", environ={})
    added, error = with_member_hosts(base, "n0, n1,n2")
    assert error is None and added.rendezvous.endpoints == ("n0:29400", "n1:29400", "n2:29400")
    rdzv = HostedRendezvous(base, "a", advertise_addr="127.0.0.1", environ={HOSTED_NODES_ENV: "n1; rm -rf /"})
    with pytest.raises(RendezvousError, match=HOSTED_NODES_ENV):
        asyncio.run(rdzv.open(asyncio.Queue()))


async def with_a_learner(etcd: EtcdServer, target: int) -> tuple[Node, MemberInfo, Membership]:
    """Node b joined to `etcd` (its one voter), a learner added that nobody starts, and b's Membership (which never
    grows the cluster here)."""
    async def start(_plan: object) -> object:
        raise AssertionError("this node never grows the cluster here")

    node = await Node(make_spec(etcd.endpoint, nmin=1, nmax=2), "b").open()
    learner, _ = await node.rdzv.session.call(lambda c: c.member_add(f"http://127.0.0.1:{free_port()}", learner=True))
    members = Membership("b", JobKeys("/runner", "job"), target=target, place=None, start=start,  # type: ignore[arg-type]
                         promote_timeout=5.0, log=structlog.get_logger())
    return node, learner, members


def test_a_node_keeps_reading_the_members_while_one_is_still_a_learner(etcd: EtcdServer) -> None:
    """Two members wanted; the etcd has one voter and one learner (added, never promoted). A node reading the
    members after its round must not stop there (the learner serves no client: a node that stopped then never
    learnt the member's endpoint once it was promoted, as b never learnt c's in a five-node test): it goes on
    reading, and teaches only the voter's URL meanwhile."""
    async def body() -> None:
        node, learner, members = await with_a_learner(etcd, target=2)
        session = node.rdzv.session
        members.round = RendezvousResult(0, "b", 1, 2, 1, "127.0.0.1", 1, nodes=("test", "b"))
        taught: list[list[str]] = []
        reading = asyncio.ensure_future(members.reconcile(session, lambda: 0, taught.append))
        try:
            await asyncio.sleep(2.5)
            assert not reading.done()  # a learner is no member yet: it reads again
            assert len(taught) >= 2 and all(urls == [f"http://{etcd.endpoint}"] for urls in taught), taught
        finally:
            reading.cancel()
            await session.call(lambda c: c.member_remove(learner.id))
            await node.rdzv.close("succeeded")

    run(body)


def test_a_member_whose_etcd_answers_stays_though_its_nodes_lease_lapsed(etcd: EtcdServer) -> None:
    """The round's first node prunes members. The etcd's own member (named "test") has no live state key, as a node
    whose lease lapsed under load, but its etcd answers: it stays (before, it was removed while its node lived on,
    and a job of three members went on with one: CI, stop 44). The learner nobody starts is removed as ever."""
    async def body() -> None:
        node, learner, members = await with_a_learner(etcd, target=3)
        session = node.rdzv.session
        result = RendezvousResult(0, "b", 0, 2, 1, "127.0.0.1", 1, nodes=("b", "test"))
        try:
            with structlog.testing.capture_logs() as logs:
                left = await members._prune(session, await session.call(lambda c: c.members()), result)
            assert [m.name for m in left] == ["test"], left
            assert [m.name for m in await session.call(lambda c: c.members())] == ["test"]
            assert [e["member"] for e in logs if e["event"].startswith("rendezvous_member_")] == [hex(learner.id)], logs
        finally:
            await node.rdzv.close("succeeded")

    run(body)


def test_serving_is_a_client_url_that_accepts_a_connection() -> None:
    """`serving`: a member listening on a client URL answers; one on a closed port, with a bad URL or none, does not."""
    import socket

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        members = [MemberInfo(1, "up", (), (f"http://127.0.0.1:{port}",), learner=False),
                   MemberInfo(2, "closed", (), (f"http://127.0.0.1:{free_port()}",), learner=False),
                   MemberInfo(3, "bad", (), ("http://127.0.0.1:notaport",), learner=False),
                   MemberInfo(4, "none", (), (), learner=False)]
        assert asyncio.run(serving(members)) == {1}
    assert lost_members(members, {1}).keys() == {2, 3, 4}
