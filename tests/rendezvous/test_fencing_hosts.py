"""A cut-off host fences itself (issue 29's point 6), on simulated hosts: a 3-node job trains; host c's link goes
down. c's agent can reach neither etcd nor a peer: it stops its worker before its lease lapses, writes its report
(class infra, kind fenced) and exits 3 without waiting for etcd. a and b go on as a round of two; c's worker was
gone before theirs of the new round started (no rank held by two hosts). When c's link heals nothing of c comes
back. The other side of the rule (etcd away for every node, peers reachable: the workers keep training) is
tests/multinode/test_multinode_etcd.py's etcd-gone test and the SIGSTOP test of tests/multinode/test_multinode_hosted.py.
"""

from __future__ import annotations

import time

import pytest
from conftest import wait_for
from multinode_helpers import Cluster, probe_args, spec_text

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TTL_S = 10.0  # the default; a status refresh (every 5 s) is then waiting on etcd when the fence fires


def test_a_cut_off_host_stops_its_workers_before_its_lease_lapses_and_leaves(cluster: Cluster) -> None:
    cluster.write(spec_text(cluster.endpoint, nodes="2:3", args=probe_args(cluster.out, "--sleep", "14", "--sleep-later", "2"))
                  .replace("lease_ttl: 3s", f"lease_ttl: {TTL_S:g}s"))
    a, b, c = cluster.start("a"), cluster.start("b"), cluster.start("c")
    wait_for(lambda: len(cluster.worker_files()) == 3, timeout=60, what="3 workers of attempt 0")
    wait_for(lambda: {n.state() for n in (a, b, c)} == {"RUNNING"}, what="a, b and c RUNNING")
    old = next(w for w in cluster.worker_files() if w["host"] == "c")
    cut = time.monotonic()
    c.host.cut()
    try:
        dead_at = new_at = None
        deadline = cut + 60
        while (dead_at is None or new_at is None) and time.monotonic() < deadline:  # who went first, in one poll
            now = time.monotonic()
            if dead_at is None and not cluster.alive(old):
                dead_at = now
            if new_at is None and any(w["env"]["TORCHELASTIC_RESTART_COUNT"] != "0" for w in cluster.worker_files()):
                new_at = now
            time.sleep(0.02)
        assert dead_at is not None, c.output()[-3000:]
        assert new_at is not None, a.output()[-3000:]
        assert dead_at <= new_at, (dead_at - cut, new_at - cut)  # c's rank was free before the new round's started
        assert dead_at - cut < TTL_S + 2, dead_at - cut  # within the lease's TTL, plus a bounded margin
        # and leaves at once: no etcd call (a status publish in flight) waits out the connect timeout (20 s)
        assert c.wait(8) == 3, c.output()[-3000:]
    finally:
        c.host.heal()
    report = c.report()
    assert report["outcome"] == "failed" and report["failures"][-1]["kind"] == "fenced", report
    assert "cut off" in report["failures"][-1]["reason"], report
    assert "fenced" in c.output()
    # a and b: a round of two (ranks 0 and 1 on a and b), to the end; nothing of c came back after the heal
    assert {"a": a.wait(60), "b": b.wait(60)} == {"a": 0, "b": 0}, a.output()[-3000:] + b.output()[-3000:]
    later = [w for w in cluster.worker_files() if w["env"]["TORCHELASTIC_RESTART_COUNT"] != "0"]
    assert sorted((w["host"], w["env"]["WORLD_SIZE"]) for w in later) == [("a", "2"), ("b", "2")], later
    assert sorted(int(w["env"]["RANK"]) for w in later) == [0, 1]
