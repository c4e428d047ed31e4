"""Replica groups on several nodes (etcd): each node takes a seat, i.e. one group's share; seat (0, 0) hosts the
lighthouse first. Real agents on simulated hosts, a real etcd, real TorchFT training (examples/jobs/ft_train.py).

- A group's worker SIGKILLed: that node's group restarts alone; the other node's group commits steps meanwhile
  (from its own output); the restarted group rejoins with the survivor's weights.
- A whole node SIGKILLed: its guard kills its workers and frees its seat; a node started in its place takes that
  seat, so it joins the group that lost a node, and the job ends with both groups at the same step.
- The lighthouse's host lost whole (three groups, never replaced): a survivor hosts the next lighthouse, the other
  follows; each group restarts once at most and both end with the same weights.
- The spec's checks: nodes must be count x nodes_per_group; a hosted etcd is refused (it would die with a node).
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, RUNNER, alive, kill_proven, wait_for
from ft_records import committed, records
from groups_helpers import both_seated, ended_together, group_of, log_of, worker_pid
from multinode_helpers import Cluster
from torchft_mark import needs_torchft

STEPS = 300


def spec(endpoint: str, extra_args: str = "", standby: str = "true") -> str:
    """Two groups of one node and one worker each, on the test's etcd."""
    return f"""
version: 1
name: ftmulti
entrypoint:
  script: "{EXAMPLES / 'ft_train.py'}"
  args: ["--steps", "{STEPS}", "--sha-every", "50", "--step-sleep", "0.03"{extra_args}]
nodes: 2
rendezvous: {{backend: etcd, endpoints: ["{endpoint}"], last_call: 0s, lease_ttl: 3s, join_timeout: 90s}}
replica_groups: {{count: 2, nproc_per_node: 1, nodes_per_group: 1, min_active: 1,
                  lighthouse: {{heartbeat_timeout: 1s}}}}
env: {{OMP_NUM_THREADS: "1"}}
restart: {{max_restarts: 3, backoff: {{initial: 0s}}, standby: {standby}}}
shutdown: {{grace_period: 5s}}
logs: {{dir: "${{LOGS}}"}}
"""


def stepping_together(log: Path) -> bool:
    """Both groups took part in a step (after some warm-up)."""
    return any(n == 2 and s >= 20 for s, _, n in committed(log))


@pytest.mark.integration
@needs_torchft
def test_a_killed_group_restarts_alone_on_its_node_while_the_other_node_steps(cluster: Cluster) -> None:
    # standby false: a warm restart is back within TorchFT's heartbeat (1 s), before group 0 could step alone; a
    # cold one (its worker imports torch) keeps group 1 down long enough to watch group 0 step on alone.
    cluster.write(spec(cluster.endpoint, standby="false"))
    cluster.start("a")
    cluster.start("b")
    groups = both_seated(cluster, ("a", "b"))
    survivor, victim = groups[0], groups[1]
    wait_for(lambda: stepping_together(log_of(victim, 0)), timeout=120, what="both groups in one quorum")
    status = cluster.status()
    assert sorted(g["group"] for g in status["groups"]) == [0, 1]
    assert {n["node"]: n["group"] for n in status["nodes"]} == {survivor.name: 0, victim.name: 1}
    text = cluster.cli("status").stdout
    assert "group 0: running" in text and f"node {victim.name} (group 1): RUNNING" in text, text
    pid = worker_pid(victim)
    kill_proven(pid, "ft_train.py")
    t_kill = time.time()
    codes = cluster.wait_all(timeout=180)
    assert codes == {"a": 0, "b": 0}, survivor.output()[-2000:] + victim.output()[-2000:]
    back = committed(log_of(victim, 1))
    assert back, log_of(victim, 1).read_text()[-2000:]
    after_kill = [(s, n) for s, t, n in committed(log_of(survivor, 0)) if t_kill < t < back[0][1]]
    # a step whose quorum both groups had joined before the kill may still commit with 2 (group 1's gradients were in)
    in_flight = list(itertools.takewhile(lambda sn: sn[1] == 2, after_kill))
    alone = after_kill[len(in_flight):]
    assert len(in_flight) <= 1 and len(alone) >= 3 and {n for _, n in alone} == {1}, after_kill  # stepped on alone
    assert not (survivor.run_dir() / "group_0" / "attempt_1").exists()  # and was never restarted
    final0, final1 = records(log_of(survivor, 0), "final"), records(log_of(victim, 1), "final")
    assert final0 and final1 and final0[0]["step"] == final1[0]["step"] == str(STEPS)
    assert final0[0]["params_sha"] == final1[0]["params_sha"]
    report = victim.report()
    assert [(g["group"], g["attempts"]) for g in report["groups"]] == [(1, 2)]
    lighthouse = survivor.report()["replica_groups"]["lighthouse"]
    assert lighthouse["hosted"] and lighthouse["address"].startswith("http://")
    assert not alive(pid) and not survivor.host.alive(int(lighthouse["pid"]))


@pytest.mark.integration
@needs_torchft
def test_a_lost_node_is_replaced_by_a_new_one_in_its_seat(cluster: Cluster) -> None:
    cluster.write(spec(cluster.endpoint))
    cluster.start("a")
    cluster.start("b")
    groups = both_seated(cluster, ("a", "b"))
    survivor, victim = groups[0], groups[1]
    wait_for(lambda: stepping_together(log_of(victim, 0)), timeout=120, what="both groups in one quorum")
    pid = worker_pid(victim)
    victim.proc.kill()  # the whole agent: its guard kills the worker and revokes the lease (the seat is free)
    victim.proc.wait()
    wait_for(lambda: not alive(pid), timeout=30, what="the guard to kill the lost node's worker")
    spare = cluster.start("c")
    wait_for(lambda: group_of(spare) is not None, timeout=60, what="the new node to take a seat")
    assert group_of(spare) == 1  # the seat the lost node freed
    codes = {n: cluster.nodes[n].wait(180) for n in (survivor.name, "c")}
    assert codes == {survivor.name: 0, "c": 0}, spare.output()[-3000:]
    final0, final1 = records(log_of(survivor, 0), "final"), records(log_of(spare, 0), "final")
    assert final0 and final1 and final0[0]["step"] == final1[0]["step"] == str(STEPS)
    assert final0[0]["params_sha"] == final1[0]["params_sha"]
    first = committed(log_of(spare, 0))
    assert first and first[0][0] > 20, first[:3]  # it joined at the live step, with the survivor's weights


def problems(tmp_path: Path, text: str) -> tuple[int, str]:
    """`runner validate` on `text`: exit code and stderr."""
    import subprocess

    path = tmp_path / "job.yaml"
    path.write_text(text)
    done = subprocess.run([*RUNNER, "validate", str(path)], capture_output=True, text=True,
                          timeout=60, check=False)
    return done.returncode, done.stderr


@pytest.mark.parametrize(("edit", "expected"), [
    ({"nodes": 3}, "need exactly 2"),
    ({"nodes": "1:2"}, "need exactly 2"),
    ({"hosted": True}, "outlives any one node"),
])
def test_several_node_groups_are_checked(tmp_path: Path, edit: dict[str, Any], expected: str) -> None:
    text = spec("127.0.0.1:2379").replace("nodes: 2", f"nodes: {json.dumps(edit.get('nodes', 2))}")
    if edit.get("hosted"):
        text = text.replace("backend: etcd,", "backend: etcd, hosted: true,")
    code, err = problems(tmp_path, text)
    assert code == 2 and expected in err and "Traceback" not in err, err


def test_groups_of_several_nodes_need_etcd(tmp_path: Path) -> None:
    code, err = problems(tmp_path, f"""
version: 1
name: x
entrypoint: {{script: "{EXAMPLES / 'ft_train.py'}"}}
replica_groups: {{count: 2, nodes_per_group: 2}}
""")
    assert code == 2 and "need rendezvous.backend etcd" in err, err


@pytest.mark.integration
@needs_torchft
def test_the_lighthouse_node_lost_and_replaced_the_groups_move_to_its_new_lighthouse(cluster: Cluster) -> None:
    """The documented failure mode: seat (0, 0)'s node (and so the hosted lighthouse) SIGKILLed. Group 1's quorum
    times out, it restarts; the node that takes seat (0, 0) hosts a new lighthouse, group 1's next attempt uses its
    address, and the job ends with both groups at the same step and weights."""
    cluster.write(spec(cluster.endpoint, ', "--quorum-timeout", "5"'))
    cluster.start("a")
    cluster.start("b")
    groups = both_seated(cluster, ("a", "b"))
    host, other = groups[0], groups[1]
    wait_for(lambda: stepping_together(log_of(other, 0)), timeout=120, what="both groups in one quorum")
    address = json.loads((host.run_dir() / "status.json").read_text())["lighthouse"]["address"]
    host.proc.kill()
    host.proc.wait()
    spare = cluster.start("c")
    wait_for(lambda: group_of(spare) is not None, timeout=60, what="the new node to take seat (0, 0)")
    assert group_of(spare) == 0
    codes = {n: cluster.nodes[n].wait(240) for n in (other.name, "c")}
    assert codes == {other.name: 0, "c": 0}, other.output()[-3000:]
    moved = json.loads((spare.run_dir() / "status.json").read_text())["lighthouse"]["address"]
    assert moved != address
    assert "lighthouse_moved" in (other.run_dir() / "agent.jsonl").read_text()
    last = max(int(p.name.split("_")[1]) for p in (other.run_dir() / "group_1").glob("attempt_*"))
    final0, final1 = records(log_of(spare, 0), "final"), records(log_of(other, last), "final")
    assert final0 and final1 and final0[0]["step"] == final1[0]["step"] == str(STEPS)
    assert final0[0]["params_sha"] == final1[0]["params_sha"]


@pytest.mark.integration
@needs_torchft
def test_the_lighthouse_host_lost_a_survivor_hosts_the_next_and_every_group_restarts_once_at_most(
        cluster: Cluster) -> None:
    """Three groups on three hosts; the lighthouse's host (seat (0, 0)) lost whole, never replaced. Its address goes
    with its lease; one survivor claims the key and hosts a new lighthouse, the other follows it; each surviving
    group restarts once at most, and both end at the same step with the same weights."""
    cluster.write(spec(cluster.endpoint, ', "--quorum-timeout", "5", "--global-batch", "36"').replace("nodes: 2", "nodes: 3")
                  .replace("count: 2", "count: 3"))
    for name in ("a", "b", "c"):
        cluster.start(name)
    wait_for(lambda: all(group_of(cluster.nodes[n]) is not None for n in "abc"), timeout=90, what="three seats taken")
    by_group = {group_of(cluster.nodes[n]): cluster.nodes[n] for n in "abc"}
    host, survivors = by_group[0], [by_group[1], by_group[2]]
    wait_for(lambda: all(any(n == 3 and s >= 20 for s, _, n in committed(log_of(node, 0))) for node in survivors),
             timeout=120, what="the three groups in one quorum")
    host.host.lose()
    codes = {node.name: node.wait(240) for node in survivors}
    assert codes == {node.name: 0 for node in survivors}, [node.output()[-2000:] for node in survivors]
    logs = {node.name: (node.run_dir() / "agent.jsonl").read_text() for node in survivors}
    took = [name for name, text in logs.items() if "lighthouse_taken_over" in text]
    assert len(took) == 1, logs
    [follower] = [name for name in logs if name not in took]
    assert "lighthouse_moved" in logs[follower]
    hosted = json.loads((cluster.nodes[took[0]].run_dir() / "status.json").read_text())["lighthouse"]["address"]
    assert hosted.startswith(f"http://{took[0]}:"), hosted  # the new host advertises itself by its name
    ended_together(survivors, STEPS)


@pytest.mark.integration
@needs_torchft
def test_runner_stop_through_etcd_stops_the_job_not_only_its_groups(cluster: Cluster) -> None:
    """`runner stop` writes the job's control key; each group's rendezvous sees it. It reaches the job's own machine
    too (TRAINING -stop_requested-> STOPPING), so every node ends `stopped` with 143, as a job of one group does.
    Before, only the groups stopped: the job read "0 group(s) finished, fewer than min_active" and exited 1."""
    cluster.write(spec(cluster.endpoint))
    cluster.start("a")
    cluster.start("b")
    groups = both_seated(cluster, ("a", "b"))
    wait_for(lambda: all(log_of(n, 0).exists() for n in groups.values()), timeout=90, what="both groups' workers")
    pids = [worker_pid(n) for n in groups.values()]
    done = cluster.cli("stop")
    assert done.returncode == 0, done.stderr
    assert cluster.wait_all(90) == {"a": 143, "b": 143}
    for node in groups.values():
        report = node.report()
        assert report["outcome"] == "stopped" and report["exit_code"] == 143, report
        job_edges = [(t["src"], t["trigger"], t["dst"]) for t in map(json.loads, (
            node.run_dir() / "transitions.jsonl").read_text().splitlines()) if t.get("event") == "job_transition"]
        assert ("TRAINING", "stop_requested", "STOPPING") in job_edges, job_edges
    assert cluster.status()["status"] == "stopped"
    assert not any(alive(p) for p in pids)
