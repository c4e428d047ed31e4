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
    sleeps in it (both find it). Both nodes name rank 1 and its node; that node leaves with exit 3, the other
    restarts alone (nodes 1:2) and succeeds. The culprit may be rank 0 too: its node is group rank 0, whose end
    closes the job when the job ends; a node kept out only leaves (found by the chaos soak: the job closed `error`)."""
    waiter = 1 - culprit
    cluster.write(spec_text(cluster.endpoint, name="hcm", nodes="1:2", script=EXAMPLES / "hang_culprit.py",
                            args=json.dumps([mode, "--culprit", str(culprit)])[1:-1], restart="max_restarts: 1",
                            extra=EXTRA))
    a, b = cluster.start("a"), cluster.start("b")
    codes = cluster.wait_all()
    culprit_node = next(n for n in (a, b) if f'"rank": {culprit}' in json.dumps(
        [e for e in map(json.loads, (n.run_dir() / "agent.jsonl").read_text().splitlines())
         if e.get("event") == "worker_started"]))
    other = b if culprit_node is a else a
    assert codes[culprit_node.name] == 3, culprit_node.output()[-3000:]
    assert codes[other.name] == 0, other.output()[-3000:]
    for node in (a, b):
        hang = node.report()["failures"][0]["hang"]
        assert hang["finding"] == "never_entered"
        assert hang["culprits"] == [{"rank": culprit, "node": culprit_node.name}], node.name
        assert hang["waiting"] == [{"rank": waiter, "node": other.name}]
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
