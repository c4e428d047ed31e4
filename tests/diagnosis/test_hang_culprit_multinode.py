"""A hang across two nodes with etcd (docs/hangs.md): every node's flight recorder is read, the culprit's node named
and kept out of the next round, and the job finishes on the other node."""

from __future__ import annotations

import json

import pytest
from conftest import EXAMPLES
from multinode_helpers import spec_text

pytestmark = pytest.mark.integration

EXTRA = """\
watchdog:
  heartbeat_timeout: 3s
"""


@pytest.mark.parametrize(("mode", "culprit"), [("skip", 1), ("sleep", 1), ("sleep", 0)])
def test_the_culprits_node_is_named_kept_out_and_the_job_finishes_on_the_other(cluster, mode, culprit):
    """Rank 1 (the second node) skips step 3's all_reduce (alive and beating: only the first node finds the hang) or
    sleeps in it (both find it). Both nodes name rank 1 and its node, in the attempt's line and the failure alike
    (the node that did not find the hang itself too: was `node a lost: reported FAILED`, class node_lost); that node leaves with exit 3, the other
    restarts alone (nodes 1:2) and succeeds. The culprit may be rank 0 too: its node is group rank 0, whose end
    closes the job when the job ends; a node kept out only leaves (found by the chaos soak: the job closed `error`)."""
    waiter = 1 - culprit
    # last_call 10 s: the first round waits for b (it closes as b joins: nodes.max); with 1 s, a loaded machine let
    # a train alone first, and b's join cost the other node an attempt more (CI)
    cluster.write(spec_text(cluster.endpoint, name="hcm", nodes="1:2", script=EXAMPLES / "hang_culprit.py",
                            args=json.dumps([mode, "--culprit", str(culprit)])[1:-1], restart="max_restarts: 1",
                            extra=EXTRA).replace("last_call: 1s", "last_call: 10s"))
    a, b = cluster.start("a"), cluster.start("b")
    codes = cluster.wait_all()
    culprit_node = next(n for n in (a, b) if f'"rank": {culprit}' in json.dumps(
        [e for e in map(json.loads, (n.run_dir() / "agent.jsonl").read_text().splitlines())
         if e.get("event") == "worker_started"]))
    other = b if culprit_node is a else a
    assert codes[culprit_node.name] == 3, culprit_node.output()[-3000:]
    assert codes[other.name] == 0, other.output()[-3000:]
    story = f"hang: rank {culprit} (node {culprit_node.name}) never entered all_reduce #4 (process group 0)"
    for node in (a, b):  # one story on every node: the same culprit and finding, on the console and in the summary
        first = node.report()["failures"][0]
        hang = first["hang"]
        assert hang["finding"] == "never_entered"
        assert hang["culprits"] == [{"rank": culprit, "node": culprit_node.name}], node.name
        assert hang["waiting"] == [{"rank": waiter, "node": other.name}]
        assert first["class"] == "hang" and first["reason"].startswith(story), (node.name, first["reason"])
        failed = next(t for t in node.transitions() if t["dst"] == "FAILED")  # the console's attempt line
        assert failed["reason"].startswith(story), (node.name, failed["reason"])
        assert "reported FAILED" not in failed["reason"]
        if node is other:  # the culprit's stacks are its own node's: here, a line says where they are
            assert (f"rank {culprit} (culprit): no stack: it runs on node {culprit_node.name}: its stacks are in "
                    "that node's report") in first["stacks"]
    left = culprit_node.report()
    assert "kept out of the next round: this node held up the hang of attempt 0" in left["failures"][-1]["reason"]
    assert f"hang: rank {culprit} (node {culprit_node.name}) never entered all_reduce #4" in other.output()
    assert other.report()["attempts"] == 2
    ledger = {r["node"]: r for r in cluster.status()["ledger"]}  # the node ledger, in etcd (docs/hangs.md)
    assert ledger[culprit_node.name]["counts"] == {"hang": 1}
    assert ledger[culprit_node.name]["marks"][0]["culprit"] is True
    assert ledger[other.name]["counts"] == {}  # it only waited: not its doing
    if mode == "skip":  # its rank kept beating: it found no hang itself, it answered the other node's query
        assert '"event": "hang_query"' in (culprit_node.run_dir() / "agent.jsonl").read_text()


def test_a_collective_timeout_across_two_nodes_names_the_same_rank_on_both(cluster):
    """No watchdog: 2 nodes of 2 ranks, init_process_group(timeout=3s); rank 3 sleeps before the 4th all_reduce.
    The three waiters time out at about the same moment and leave, on both nodes; each node reads its own ranks,
    shares them, and both name rank 3, never a waiter, in the same words."""
    cluster.write(spec_text(cluster.endpoint, name="hct", nodes="1:2", nproc=2, script=EXAMPLES / "hang_culprit.py",
                            args=json.dumps(["sleep", "--culprit", "3", "--pg-timeout", "3"])[1:-1],
                            restart="max_restarts: 1"))
    a, b = cluster.start("a"), cluster.start("b")
    codes = cluster.wait_all()
    culprit_node = next(n for n in (a, b) if '"rank": 3' in json.dumps(
        [e for e in map(json.loads, (n.run_dir() / "agent.jsonl").read_text().splitlines())
         if e.get("event") == "worker_started"]))
    other = b if culprit_node is a else a
    assert codes[culprit_node.name] == 3, culprit_node.output()[-3000:]  # kept out: it held up the hang
    assert codes[other.name] == 0, other.output()[-3000:]
    for node in (a, b):
        first = node.report()["failures"][0]
        assert first["class"] == "hang", (node.name, first["reason"])
        assert first["hang"]["culprits"] == [{"rank": 3, "node": culprit_node.name}], (node.name, first["reason"])
        assert first["reason"].startswith(f"hang: rank 3 (node {culprit_node.name}) "), (node.name, first["reason"])
        assert 3 not in [w["rank"] for w in first["hang"]["waiting"]]


def test_a_mismatch_that_aborts_across_two_nodes_names_the_same_rank_on_both(cluster):
    """2 nodes of 2 ranks; every rank calls all_gather, rank 3 with 20 floats, the others 10: gloo aborts rank 0
    (it receives more than its call expects). Its node reads its own live rank and asks the other node, whose
    ranks answer; both nodes name rank 3 with both calls, in the same words. The class is the death's (signal) on
    both: the other node saw a lost peer, and counts it as the round's charge says (issue 40): a mismatch is not a
    hang."""
    cluster.write(spec_text(cluster.endpoint, name="hmm", nodes="2", nproc=2, script=EXAMPLES / "hang_culprit.py",
                            args=json.dumps(["size", "--pg-timeout", "5"])[1:-1], restart="max_restarts: 0"))
    a, b = cluster.start("a"), cluster.start("b")
    cluster.wait_all()
    first = {node.name: node.report()["failures"][0] for node in (a, b)}
    dying = next(name for name, f in first.items() if f.get("rank") == 0 and f.get("signal") == "SIGABRT")
    other = next(name for name in first if name != dying)
    culprit_node = next(n for n in (a, b) if '"rank": 3' in json.dumps(
        [e for e in map(json.loads, (n.run_dir() / "agent.jsonl").read_text().splitlines())
         if e.get("event") == "worker_started"]))
    assert first[dying]["reason"] == first[other]["reason"], first
    assert first[dying]["reason"].startswith(
        f"collective mismatch #4 (process group 0): rank 3 (node {culprit_node.name}) called all_gather [[20]] while ")
    assert first[dying]["reason"].endswith(f"called all_gather [[10]]; rank 0 (node {dying}) died of it")
    assert first[dying]["class"] == first[other]["class"] == "signal"
    assert first[other]["evidence"] == f"as node {dying} charged this round", first[other]
    assert first[other]["detected"] == f"node {dying} reported FAILED"
