"""EtcdRendezvous against a real etcd server (N rendezvous objects in one event loop)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from rdzv_helpers import WAIT_S, Node, close_all, make_spec, open_nodes, rounds, run

from runner.config.spec import TLS, Auth
from runner.errors import JobClosed, RendezvousError, RendezvousTimeout
from runner.events import MembershipChanged, PeerLost, StopRequested
from runner.outcomes import FailureClass
from runner.rendezvous.etcd.admin import read_status, request_stop
from runner.rendezvous.etcd.keys import JobKeys, dump, load
from runner.rendezvous.etcd.monitor import RoundMonitor
from runner.testing.etcd_server import EtcdServer, etcd_server, free_port

pytestmark = pytest.mark.integration


def test_two_nodes_agree_on_ranks_and_master(etcd: EtcdServer) -> None:
    """Two nodes get one result: ranks by node id, master = rank 0's address and port."""
    async def body() -> None:
        nodes = await open_nodes(make_spec(etcd.endpoint), ["b", "a"])
        res = await rounds(nodes)
        assert [r.group_rank for r in res] == [1, 0]
        assert res[0].nodes == res[1].nodes == ("a", "b")
        assert res[0].master_port == res[1].master_port > 0
        assert {r.group_world_size for r in res} == {2}
        await close_all(nodes)
    run(body)


def test_min_max_last_call_closes_with_min_nodes(etcd: EtcdServer) -> None:
    """With min=2, max=4 and two nodes, the round closes after last_call with two nodes."""
    async def body() -> None:
        nodes = await open_nodes(make_spec(etcd.endpoint, nmin=2, nmax=4), ["n1", "n2"])
        res = await rounds(nodes)
        assert [r.group_world_size for r in res] == [2, 2]
        await close_all(nodes)
    run(body)


def test_max_nodes_close_the_round_and_the_rest_wait(etcd: EtcdServer) -> None:
    """Three nodes with max=2: two form the round, the third times out waiting for the next one."""
    async def body() -> None:
        spec = make_spec(etcd.endpoint, nmin=1, nmax=2, join_timeout=3.0)
        nodes = await open_nodes(spec, ["a", "b", "c"])
        outcomes = await asyncio.gather(*(n.rdzv.next_round(0) for n in nodes), return_exceptions=True)
        results = [o for o in outcomes if not isinstance(o, BaseException)]
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        assert len(results) == 2 and {r.group_world_size for r in results} == {2}
        assert len(errors) == 1 and isinstance(errors[0], RendezvousTimeout)
        await close_all(nodes)
    run(body)


def test_join_timeout_raises_rendezvous_timeout(etcd: EtcdServer) -> None:
    """A lone node of a 2-node job gets RendezvousTimeout naming the counts."""
    async def body() -> None:
        (node,) = await open_nodes(make_spec(etcd.endpoint, join_timeout=1.5), ["solo"])
        with pytest.raises(RendezvousTimeout) as info:
            await node.rdzv.next_round(0)
        assert info.value.needed == 2 and info.value.joined == 1
        await node.rdzv.close("failed")
    run(body)


def test_late_node_triggers_membership_change_and_joins_next_round(etcd: EtcdServer) -> None:
    """A third node arriving while a 2-node round runs is announced and admitted in the next round."""
    async def body() -> None:
        spec = make_spec(etcd.endpoint, nmin=2, nmax=3)
        nodes = await open_nodes(spec, ["a", "b"])
        first = await rounds(nodes)
        late = await Node(spec, "c").open()
        late_round = asyncio.ensure_future(late.rdzv.next_round(0))
        changed = await nodes[0].event(MembershipChanged)
        assert changed.waiting == ("c",)
        assert (await nodes[1].event(MembershipChanged)).waiting == ("c",)
        second = await rounds(nodes, attempt=1)
        third = await late_round
        assert second[0].round == third.round == first[0].round + 1
        assert second[0].nodes == ("a", "b", "c") and third.group_rank == 2
        await close_all([*nodes, late])
    run(body)


def test_lost_lease_reports_peer_lost(etcd: EtcdServer) -> None:
    """When a node's lease is revoked without a clean close, the others get PeerLost for it."""
    async def body() -> None:
        nodes = await open_nodes(make_spec(etcd.endpoint), ["a", "b"])
        await rounds(nodes)
        await nodes[1].rdzv.lease.stop(revoke=True)
        lost = await nodes[0].event(PeerLost)
        assert lost.node == "b"
        await close_all(nodes, "failed")
    run(body)


def test_an_agent_started_again_never_takes_its_predecessors_seat(etcd: EtcdServer) -> None:
    """Both agents of a round die without a word (their keys live on until the lease lapses); an agent started
    again under one of their names must not take the dead one's rank in that round (a world whose other member is
    gone, beside any next one): it joins the next round, which closes once the dead are seen gone."""
    async def body() -> None:
        spec = make_spec(etcd.endpoint, nmin=1, nmax=2)
        nodes = await open_nodes(spec, ["a", "b"])
        first = await rounds(nodes)
        assert {r.group_world_size for r in first} == {2}
        for n in nodes:
            await n.rdzv.lease.stop(revoke=False)  # dead: no keep-alive, no revoke; keys stay for the TTL
        again = await Node(spec, "a").open()
        res = await asyncio.wait_for(again.rdzv.next_round(0), WAIT_S)
        assert (res.round, res.group_world_size, res.nodes) == (first[0].round + 1, 1, ("a",))
        await close_all([again], "failed")
    run(body)


def test_monitor_replays_changes_since_the_leaders_view(etcd: EtcdServer) -> None:
    """A monitor started after a member already left still reports it: it watches from the result's "rev"."""
    async def body() -> None:
        spec = make_spec(etcd.endpoint)
        nodes = await open_nodes(spec, ["a", "b"])
        res = await rounds(nodes)
        keys = JobKeys(spec.rendezvous.prefix, spec.name)
        raw = await nodes[0].rdzv.session.call(lambda c: c.get(keys.result(res[0].round)))
        since = load(raw.value)["rev"]
        assert 0 < since <= raw.mod_revision
        await nodes[1].rdzv.lease.stop(revoke=True)  # b leaves before the late monitor starts
        queue: asyncio.Queue[Any] = asyncio.Queue()
        late = RoundMonitor(nodes[0].rdzv.session, keys, res[0], 2, queue, since=since)
        await late.start()
        try:
            lost = await asyncio.wait_for(queue.get(), WAIT_S)
        finally:
            await late.stop()
        assert isinstance(lost, PeerLost) and lost.node == "b"
        await close_all(nodes, "failed")
    run(body)


@pytest.mark.parametrize("same_run", [True, False], ids=["its-own-lease", "another-lease"])
def test_a_state_naming_no_round_is_a_replacement_only_on_another_lease(etcd: EtcdServer, same_run: bool) -> None:
    """b's run in this round publishes on its lease; then a state of b naming no round arrives after b's join record
    of the round is gone (a run leaving: what a SIGTERMed peer's last states can look like). On b's own lease it is
    b's run, not a replacement: a hears nothing until b leaves, and then that b was stopped (preempted, CI 2026-12-01:
    read as "started again under its name", node_lost). On another lease it is another run of b: replaced.
    Seen failing without the lease rule (its-own-lease: a PeerLost "started again under its name" at once)."""
    async def body() -> None:
        spec = make_spec(etcd.endpoint)
        nodes = await open_nodes(spec, ["a", "b"])
        res = await rounds(nodes)
        a, b = nodes
        await b.rdzv.publish({"state": "RUNNING", "attempt": 0})
        keys, session = JobKeys(spec.rendezvous.prefix, spec.name), b.rdzv.session
        lease = b.rdzv.lease.lease_id if same_run else await session.call(lambda c: c.lease_grant(30))
        await session.call(lambda c: c.delete(keys.join(res[1].round, "b")))
        await session.call(lambda c: c.put(keys.state("b"), dump({"state": "SHUTDOWN", "node": "b", "round": None}),
                                           lease=lease))
        if not same_run:
            lost = await a.event(PeerLost)
            assert (lost.node, lost.why) == ("b", "started again under its name: its run in this round is gone")
            await close_all(nodes, "failed")
            return
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(a.event(PeerLost), 3.0)
        await b.rdzv.close("stopped")
        lost = await a.event(PeerLost)
        assert (lost.node, lost.why) == ("b", "node ended (stopped)")
        await a.rdzv.close("failed")
    run(body)


def test_failed_state_reports_peer_lost(etcd: EtcdServer) -> None:
    """A node publishing FAILED for the running round is reported as lost to the others."""
    async def body() -> None:
        nodes = await open_nodes(make_spec(etcd.endpoint), ["a", "b"])
        await rounds(nodes)
        await nodes[0].rdzv.publish({"state": "FAILED", "attempt": 0})
        lost = await nodes[1].event(PeerLost)
        assert (lost.node, lost.why) == ("a", "reported FAILED")
        await close_all(nodes, "failed")
    run(body)


@pytest.mark.parametrize(("published", "expected"), [("signal", FailureClass.SIGNAL), ("exception", FailureClass.EXCEPTION),
                                                   ("no such class", None), (7, None)])
def test_a_failed_peers_class_reaches_every_member(etcd: EtcdServer, published: object,
                                                   expected: FailureClass | None) -> None:
    """a fails with its root cause and class (a worker killed by a signal); c, watching a, finds it and writes the
    round's `lost` key; b hears it from that key. Both carry a's class (not node_lost): a node that charges the round
    before a does (a slow a, under load) charges it as what it was (CI, 2026-11-28: a collective mismatch's SIGABRT
    charged as node_lost on the other node). A value that is not a class's name is none."""
    async def body() -> None:
        nodes = await open_nodes(make_spec(etcd.endpoint, nmin=3, nmax=3), ["a", "b", "c"])
        await rounds(nodes)
        await nodes[0].rdzv.publish({"state": "FAILED", "attempt": 0, "cause": "rank 0 killed by SIGABRT",
                                     "class": published})
        for other in (nodes[1], nodes[2]):
            got = await other.event(PeerLost)
            assert (got.node, got.cause, got.failure_class) == ("a", "rank 0 killed by SIGABRT", expected), other.name
        await close_all(nodes, "failed")
    run(body)


@pytest.mark.parametrize(("lost", "expected"), [
    ({"node": "c", "why": "node ended (stopped)"}, ("c", "node ended (stopped)", "")),
    ({"node": "c", "why": "reported FAILED", "cause": "rank 4 exited with code 1"},
     ("c", "reported FAILED", "rank 4 exited with code 1")),
    ({"node": "a", "why": "lease expired or node left"}, ("b", "reported FAILED", "")),  # a is alive: b's failure
    ({"node": "stranger", "why": "x"}, ("b", "reported FAILED", "")),  # not a member: b's own word only
    ({"node": "c", "why": 7}, ("b", "reported FAILED", "")),
], ids=["stopped", "chain", "self", "stranger", "malformed"])
def test_a_waiters_failed_state_names_the_peer_it_lost(etcd: EtcdServer, lost: dict[str, object],
                                                       expected: tuple[str, str, str]) -> None:
    """b failed because it lost c: a, watching b, may see b's FAILED before the round's `lost` key; b's state names c
    (`lost`), so a's PeerLost names the culprit c with c's loss (a stopped node is preempted), never the waiter b."""
    async def body() -> None:
        nodes = await open_nodes(make_spec(etcd.endpoint, nmin=3, nmax=3), ["a", "b", "c"])
        await rounds(nodes)
        await nodes[1].rdzv.publish({"state": "FAILED", "attempt": 0, "lost": lost})
        got = await nodes[0].event(PeerLost)
        assert (got.node, got.why, got.cause) == expected
        await close_all(nodes, "failed")
    run(body)


def test_spec_mismatch_names_the_fields(etcd: EtcdServer) -> None:
    """A node with another nproc_per_node is refused and told which field differs."""
    async def body() -> None:
        spec = make_spec(etcd.endpoint)
        (first,) = await open_nodes(spec, ["a"])
        other = Node(dataclasses.replace(spec, nproc_per_node=8, cwd="/elsewhere"), "b")
        with pytest.raises(RendezvousError, match="nproc_per_node") as info:
            await other.open()
        assert "cwd" not in info.value.message
        await other.rdzv.close("failed")
        await first.rdzv.close("failed")
    run(body)


def test_unreachable_etcd_fails_after_connect_timeout() -> None:
    """No etcd at the endpoint: RendezvousError naming the endpoint, with a fix."""
    async def body() -> None:
        endpoint = f"127.0.0.1:{free_port()}"
        node = Node(make_spec(endpoint, connect_timeout=1.0), "a")
        with pytest.raises(RendezvousError) as info:
            await node.open()
        assert endpoint in info.value.message and "endpoints" in info.value.fix
    run(body)


def test_etcd_restart_keeps_lease_and_rendezvous(etcd: EtcdServer) -> None:
    """After etcd stops and starts on the same data dir, nodes keep their lease and finish a new round."""
    async def body() -> None:
        nodes = await open_nodes(make_spec(etcd.endpoint, lease_ttl=5.0), ["a", "b"])
        await rounds(nodes)
        leases = [n.rdzv.lease.lease_id for n in nodes]
        await asyncio.to_thread(etcd.restart)
        await asyncio.sleep(2.5)  # a few keep-alive periods after the restart
        await nodes[0].rdzv.publish({"state": "RUNNING"})
        second = await rounds(nodes, attempt=1)
        assert second[0].round == 1 and second[0].nodes == ("a", "b")
        assert [n.rdzv.lease.lease_id for n in nodes] == leases
        assert nodes[0].events.empty() or not isinstance(nodes[0].events.get_nowait(), PeerLost)
        await close_all(nodes)
    run(body)


def test_stop_request_reaches_running_nodes_and_closes_the_job(etcd: EtcdServer) -> None:
    """request_stop gives StopRequested to running nodes and JobClosed to a node arriving later."""
    async def body() -> None:
        spec = make_spec(etcd.endpoint)
        nodes = await open_nodes(spec, ["a", "b"])
        await rounds(nodes)
        await request_stop(spec, graceful=False)
        await request_stop(spec, graceful=False)  # harmless twice
        stop = await nodes[0].event(StopRequested)
        assert stop == StopRequested(signum=0, graceful=False)
        await close_all(nodes, "stopped")
        with pytest.raises(JobClosed, match="stopped"):
            await Node(spec, "late").open()
    run(body)


def test_restart_budget_charged_once_per_round(etcd: EtcdServer) -> None:
    """Three nodes charging the same round's failure spend one restart; the budget runs out."""
    async def body() -> None:
        nodes = await open_nodes(make_spec(etcd.endpoint, nmin=3, nmax=3), ["a", "b", "c"])
        await rounds(nodes)
        counts = [c.count for c in await asyncio.gather(*(n.rdzv.charge_restart(1) for n in nodes))]
        assert counts == [1, 1, 1]
        await rounds(nodes, attempt=1)
        spent = await asyncio.gather(*(n.rdzv.charge_restart(1) for n in nodes))
        assert [c.count for c in spent] == [None, None, None]
        await close_all(nodes, "failed")
    run(body)


def test_read_status_reports_round_and_nodes(etcd: EtcdServer) -> None:
    """read_status shows the round, master, world size and each node's published state."""
    async def body() -> None:
        spec = make_spec(etcd.endpoint)
        nodes = await open_nodes(spec, ["a", "b"])
        res = await rounds(nodes)
        await nodes[1].rdzv.publish({"state": "RUNNING", "attempt": 0, "workers": [{"pid": 42}]})
        status = await read_status(spec)
        assert status["status"] == "running" and status["world_size"] == 2
        assert (status["master_addr"], status["master_port"]) == ("127.0.0.1", res[0].master_port)
        by_name = {n["node"]: n for n in status["nodes"]}
        assert by_name["b"]["workers"] == [{"pid": 42}] and by_name["b"]["live"]
        await close_all(nodes)
        after = await read_status(spec)
        assert after["status"] == "succeeded"
        final = {n["node"]: n for n in after["nodes"]}
        assert final["a"]["outcome"] == "succeeded" and not final["a"]["live"]
    run(body)


def test_tls_connection(tmp_path: Path) -> None:
    """Nodes reach an etcd that requires client certificates (TLS from the spec)."""
    with etcd_server(tmp_path, tls=True) as server:
        assert server.certs is not None
        tls = TLS(ca=server.certs.ca, cert=server.certs.client_cert, key=server.certs.client_key)

        async def body() -> None:
            nodes = await open_nodes(make_spec(server.endpoint, tls=tls), ["a", "b"])
            assert {r.group_world_size for r in await rounds(nodes)} == {2}
            await close_all(nodes)
        run(body)


def test_auth_connection_and_wrong_password(etcd: EtcdServer, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """With auth on, the password from the env var works; a wrong one from a file is refused clearly."""
    etcd.enable_auth("s3cret")
    monkeypatch.setenv("RDZV_TEST_PW", "s3cret")
    wrong = tmp_path / "pw"
    wrong.write_text("nope\n")

    async def body() -> None:
        spec = make_spec(etcd.endpoint, auth=Auth(user="root", password_env="RDZV_TEST_PW"))
        nodes = await open_nodes(spec, ["a", "b"])
        assert len(await rounds(nodes)) == 2
        await close_all(nodes)
        bad = Node(make_spec(etcd.endpoint, auth=Auth(user="root", password_file=str(wrong))), "c")
        with pytest.raises(RendezvousError, match="refused") as info:
            await bad.open()
        assert "nope" not in info.value.message
    run(body)
