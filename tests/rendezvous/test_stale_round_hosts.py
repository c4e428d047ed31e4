"""A node that comes back after its lease lapsed does not start workers of a round the job has left (found by the chaos
soak on hosts: `bench/chaos.py --hosts --seed 1 --duration 40 --job-window 40 --failure-every 5 --steps 150 --classes
host_loss,link_cut,kill_worker`, docs/faults.md "On simulated hosts").

Three nodes train (round 0, `nodes: "2:5"`); a fourth arrives and opens round 1, which, with a newcomer in it and
fewer nodes than the maximum, waits `last_call` (4 s) before it closes. Node c joins round 1 and its agent is frozen at
once (SIGSTOP: as a host cut off, it hears nothing more): round 1 closes with
c in it, c never reads the result; its lease then lapses, and the others, seeing it lost, form round 2 without it.
Thawed, c's lease keeper grants a new lease and puts its join record of round 1 again. c must not start workers of
round 1 (a world the others left: two worlds would live at once); it joins the job's current round instead.
"""

from __future__ import annotations

import signal

import pytest
from conftest import wait_for
from multinode_helpers import Cluster, Node, probe_args, spec_text

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TTL_S = 12.0  # the frozen node's lease outlives round 1's last_call: the round closes with it


def joined(node: Node, round_: int) -> bool:
    """The node logged its join of round `round_`."""
    return any('"rendezvous_joined"' in line and f'"round": {round_},' in line for line in node.output().splitlines())


def test_a_node_back_after_its_lease_lapsed_starts_no_worker_of_a_round_the_job_left(cluster: Cluster) -> None:
    spec = spec_text(cluster.endpoint, nodes="2:5", args=probe_args(cluster.out, "--sleep", "90"))  # 4 < max
    cluster.write(spec.replace("lease_ttl: 3s", f"lease_ttl: {TTL_S:g}s").replace("last_call: 1s", "last_call: 4s"))
    a, b, c = cluster.start("a"), cluster.start("b"), cluster.start("c")
    wait_for(lambda: len(cluster.worker_files()) == 3, timeout=60, what="3 workers of round 0")
    d = cluster.start("d")  # a newcomer: it opens round 1, which waits last_call for newcomers
    wait_for(lambda: joined(c, 1), timeout=30, what="c joined round 1")
    c.proc.send_signal(signal.SIGSTOP)
    assert "round 1: 4 node(s)" not in c.output(), "c read round 1's result before it was frozen: no test"
    try:
        wait_for(lambda: all("round 2: 3 node(s)" in n.output() for n in (a, b, d)), timeout=90,
                 what="a, b and d in round 2, without the frozen c")
    except AssertionError:
        for n in (a, b, c, d):
            print(n.name, [(t["src"], t["trigger"], t["dst"], t.get("reason", "")[:80]) for t in n.transitions()])
        raise
    finally:
        c.proc.send_signal(signal.SIGCONT)
    assert "round 1: 4 node(s)" in a.output(), a.output()[-3000:]  # round 1 did close with c in it
    # it sees that the job moved on, and says so (a stale round would be taken up instead: then it never says it)
    wait_for(lambda: "rendezvous_round_left" in c.output() or "round 1: 4 node(s)" in c.output(), timeout=30,
             what="c's decision about round 1")
    assert "round 1: 4 node(s)" not in c.output(), c.output()[-3000:]
    assert "rendezvous_round_left" in c.output(), c.output()[-3000:]
    wait_for(lambda: joined(c, 3), timeout=30, what="c joined the open round (3)")
