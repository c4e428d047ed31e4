"""Health checks on several nodes (docs/health.md, "Several nodes (etcd)"), with real processes: a real etcd, two
real `python -m runner` agents on loopback, real workers, a real failing health command.

Node b's health command fails until a marker file exists in its folder: node a starts its workers alone once the
round's last call passed, `runner status` shows b out of the round with the command's stderr, and once the marker
exists b passes its next try, joins, a restarts to admit it, and both run in one world of 2 until told to finish.
And the other way round: b turns unhealthy while both run, so the restart round (which normally waits for every
node of the previous round) closes without it once its live state says why (runner/rendezvous/etcd/round.py
`stays_out`); b joins again once healthy.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for
from multinode_helpers import Cluster, Node, spec_text

from runner.states.rendezvous import HEALTH_KEPT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

STEP_S = 30.0  # the bound of each wait below; each test takes a few seconds on the 2-core machine
MARKER = "healthy"  # in each node's folder (the spec's cwd): the health command passes once it exists
NOT_READY = "scratch is not mounted on this node"
CHECK = f"test -e {MARKER} || {{ echo '{NOT_READY}' >&2; exit 1; }}"
FAILURE = {"check": "command", "subject": CHECK, "reason": f"exit 1: {NOT_READY}"}  # as a try records it

# Records what it saw in OUT/rank<R>.attempt<A>.<node>.json (pid, cwd, env; the node is its cwd's name), then waits
# for OUT/finish (exit 0), OUT/fail-<node> (removed, exit 1) or 60 s (exit 1). Cluster.close() kills every pid
# recorded there.
WORKER = textwrap.dedent("""\
    import json, os, socket, sys, time
    out = sys.argv[1]
    rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
    info = {"pid": os.getpid(), "host": socket.gethostname(), "cwd": os.getcwd(),
            "env": {k: v for k, v in os.environ.items() if k.startswith(("RANK", "WORLD", "GROUP", "TORCHELASTIC",
                                                                           "MASTER"))}}
    node = os.path.basename(os.getcwd())
    path = os.path.join(out, f"rank{rank}.attempt{attempt}.{node}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(info, f)
    os.replace(path + ".tmp", path)
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(out, "finish")):
        fail = os.path.join(out, f"fail-{node}")
        if os.path.exists(fail):  # told to fail, once
            os.remove(fail)
            sys.exit(1)
        if time.monotonic() > deadline:
            sys.exit(1)
        time.sleep(0.05)
    """)


def health_spec(endpoint: str, worker: Path, out: Path) -> str:
    """nodes 1:2 on etcd, a short last call, one worker per node, and the health command above."""
    text = spec_text(endpoint, name="health-mn", nodes="1:2", script=worker, args=json.dumps(str(out)), extra=f"""\
        health:
          commands: ["{CHECK}"]
          retry_interval: 0.3s
          give_up_after: {STEP_S:g}s
        """)
    assert "last_call: 1s" in text
    return text


def events(node: Node, name: str) -> list[dict[str, Any]]:
    """The agent's `name` events so far (agent.jsonl)."""
    try:
        lines = (node.run_dir() / "agent.jsonl").read_text().splitlines()
    except (AssertionError, OSError):
        return []
    found = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:  # a line being written
            continue
        if event.get("event") == name:
            found.append(event)
    return found


def workers(c: Cluster) -> dict[tuple[str, int], dict[str, Any]]:
    """(node, its agent's attempt) -> what that worker recorded (one worker per node)."""
    return {(Path(w["cwd"]).name, int(w["env"]["TORCHELASTIC_RESTART_COUNT"])): w for w in c.worker_files()}


def node_status(c: Cluster, name: str) -> dict[str, Any]:
    """Node `name`'s entry in `runner status --json` ({} while it has none)."""
    return next((n for n in c.status().get("nodes") or [] if n.get("node") == name), {})


def start_pair(c: Cluster, *, b_healthy: bool) -> tuple[Node, Node]:
    """Nodes a and b of one job, each with its spec in a folder of its own (the spec's cwd, node-local), where
    the health command looks for the marker: a's exists, b's only if `b_healthy`."""
    worker = c.tmp / "worker.py"
    worker.write_text(WORKER)
    text = health_spec(c.endpoint, worker, c.out)
    c.write(text)  # the spec `runner status` reads (same job, same etcd)
    specs = {}
    for name in ("a", "b"):
        (c.tmp / name).mkdir()
        specs[name] = c.write(text, f"{name}/job.yaml")
        if name == "a" or b_healthy:
            (c.tmp / name / MARKER).touch()
    return c.start("a", spec=specs["a"]), c.start("b", spec=specs["b"])


def status_shows_b_out(c: Cluster) -> None:
    """`runner status` (--json and the text) shows b out of the round with the command's stderr, a running alone."""
    wait_for(lambda: node_status(c, "b").get("unhealthy") is not None, STEP_S, "status showing b unhealthy")
    status = c.status()
    nodes = {n["node"]: n for n in status["nodes"]}
    assert nodes["a"]["state"] == "RUNNING" and "unhealthy" not in nodes["a"], nodes["a"]
    assert nodes["b"]["state"] == "RENDEZVOUS" and not nodes["b"].get("workers"), nodes["b"]
    assert nodes["b"]["unhealthy"]["failures"] == [FAILURE], nodes["b"]
    assert status["world_size"] == 1 and status["nodes_in_round"] == ["a"], status
    shown = c.cli("status")
    assert shown.returncode == 0, shown.stderr
    assert f"    unhealthy: command {CHECK}: exit 1: {NOT_READY}" in shown.stdout.splitlines(), shown.stdout


def finish(c: Cluster) -> None:
    """Tell the workers to end: both agents exit 0 and no worker is left."""
    (c.out / "finish").touch()
    assert c.wait_all(STEP_S) == {"a": 0, "b": 0}, c.nodes["a"].output() + c.nodes["b"].output()
    for w in c.worker_files():
        assert not c.alive(w), w


def test_an_unhealthy_node_stays_out_then_joins_the_running_node(cluster: Cluster) -> None:
    """nodes 1:2: a starts alone after last_call while b fails its health command; `runner status` shows b's
    reason; b passes once the marker exists, joins, a restarts to admit it, both run in one world and succeed."""
    a, b = start_pair(cluster, b_healthy=False)

    # a closes round 0 alone after last_call and starts its worker; b never joins it
    wait_for(lambda: ("a", 0) in workers(cluster), STEP_S, "a's worker of round 0")
    wait_for(lambda: a.state() == "RUNNING", STEP_S, "a RUNNING")
    first = workers(cluster)[("a", 0)]
    assert first["env"]["WORLD_SIZE"] == "1" and first["env"]["RANK"] == "0", first
    wait_for(lambda: len(events(b, "health_failed")) >= 2, STEP_S, "b failing its health checks twice")
    assert b.state() == "RENDEZVOUS" and b.edges() == [("INIT", "initialized", "RENDEZVOUS")], b.edges()
    assert list(workers(cluster)) == [("a", 0)]  # b started no worker
    assert events(a, "health_failed") == [] and len(events(a, "health_ok")) == 1
    failed = events(b, "health_failed")[-1]
    assert failed["reasons"] == [f"command {CHECK}: exit 1: {NOT_READY}"], failed

    status_shows_b_out(cluster)
    assert a.proc.poll() is None and b.proc.poll() is None

    # b becomes healthy: it passes its next try and joins; a sees it waiting and restarts to admit it
    (cluster.tmp / "b" / MARKER).touch()
    wait_for(lambda: {("a", 1), ("b", 0)} <= set(workers(cluster)), STEP_S, "a's and b's workers of round 1")
    wait_for(lambda: a.state() == "RUNNING" and b.state() == "RUNNING", STEP_S, "a and b RUNNING")
    assert not cluster.alive(first)  # a's worker of round 0 was stopped to admit b
    world = [workers(cluster)[("a", 1)]["env"], workers(cluster)[("b", 0)]["env"]]  # a's 2nd attempt, b's 1st
    assert {env["WORLD_SIZE"] for env in world} == {"2"}, world
    assert len({(env["MASTER_ADDR"], env["MASTER_PORT"]) for env in world}) == 1, world  # one world
    assert sorted(env["RANK"] for env in world) == ["0", "1"], world
    assert sorted(env["GROUP_RANK"] for env in world) == ["0", "1"], world
    [passed] = events(b, "health_passed")
    assert passed["tries"] == len(events(b, "health_failed")) + 1, passed
    wait_for(lambda: "unhealthy" not in node_status(cluster, "b"), STEP_S, "status clearing b's reason")

    finish(cluster)
    assert len(cluster.worker_files()) == 3  # a alone, then a and b: b never ran a worker while unhealthy

    ra, rb = a.report(), b.report()
    assert ra["outcome"] == rb["outcome"] == "succeeded", (ra, rb)
    assert ra["restarts"] == 0, ra  # admitting a late node is not charged
    [admit] = [t for t in a.transitions() if t["trigger"] == "membership_changed"]
    assert admit["reason"] == "node(s) waiting to join: b", admit
    assert rb["attempts"] == 1 and rb["failures"] == [], rb  # b ran once: in round 1, from its start
    assert b.edges() == [("INIT", "initialized", "RENDEZVOUS"), ("RENDEZVOUS", "rendezvous_complete", "RUNNING"),
                         ("RUNNING", "workers_succeeded", "SHUTDOWN")], b.edges()
    tries = rb["health"]  # b's failed tries, as the agent logged them (the last HEALTH_KEPT)
    assert len(tries) == min(len(events(b, "health_failed")), HEALTH_KEPT) >= 2, tries
    assert all(t["failures"] == [FAILURE] for t in tries), tries
    assert ra.get("health", []) == [], ra
    assert cluster.status()["status"] == "succeeded"


def latest(c: Cluster, node: str) -> tuple[int, dict[str, Any]]:
    """(attempt, record) of `node`'s latest worker ((-1, {}) before its first)."""
    mine = [(attempt, w) for (name, attempt), w in workers(c).items() if name == node]
    return max(mine, key=lambda item: item[0], default=(-1, {}))


def one_world_of_2(c: Cluster) -> bool:
    """Whether the latest workers of a and b are one world of 2 (same master)."""
    ends = [latest(c, "a")[1].get("env", {}), latest(c, "b")[1].get("env", {})]
    return ({e.get("WORLD_SIZE") for e in ends} == {"2"}
            and len({(e.get("MASTER_ADDR"), e.get("MASTER_PORT")) for e in ends}) == 1)


def test_a_restart_round_does_not_wait_for_a_node_that_turned_unhealthy(cluster: Cluster) -> None:
    """a and b run together; b's marker goes and a's worker fails. In the restart round b fails its checks and
    publishes why, so a, leading the round, stops waiting for b (a node of the previous round, normally waited for
    up to join_timeout, 90 s here) and runs alone; b joins again once healthy, and the job succeeds."""
    a, b = start_pair(cluster, b_healthy=True)
    wait_for(lambda: one_world_of_2(cluster) and a.state() == b.state() == "RUNNING", STEP_S, "a and b in one world")
    a_first, b_first = latest(cluster, "a")[0], latest(cluster, "b")[0]
    admitted = [t["trigger"] for t in a.transitions()].count("membership_changed")  # 1 if b was late for round 0

    (cluster.tmp / "b" / MARKER).unlink()
    (cluster.out / "fail-a").touch()
    wait_for(lambda: latest(cluster, "a")[0] == a_first + 1, STEP_S, "a's next worker")
    alone = latest(cluster, "a")[1]
    assert alone["env"]["WORLD_SIZE"] == "1", alone  # the restart round closed without b
    wait_for(lambda: a.state() == "RUNNING", STEP_S, "a RUNNING alone")
    assert b.state() == "RENDEZVOUS" and latest(cluster, "b")[0] == b_first, b.edges()  # b started no worker
    assert events(b, "health_failed"), b.output()
    status_shows_b_out(cluster)

    (cluster.tmp / "b" / MARKER).touch()
    wait_for(lambda: latest(cluster, "a")[0] == a_first + 2 and latest(cluster, "b")[0] == b_first + 1, STEP_S,
             "a's and b's workers of the round admitting b")
    wait_for(lambda: one_world_of_2(cluster), STEP_S, "a and b in one world again")
    finish(cluster)

    ra, rb = a.report(), b.report()
    assert ra["outcome"] == rb["outcome"] == "succeeded", (ra, rb)
    assert ra["restarts"] == 1, ra  # the worker's failure; admitting b again is not charged
    assert [t["trigger"] for t in a.transitions()].count("membership_changed") == admitted + 1, a.edges()
    tries = rb["health"]
    assert tries and {t["attempt"] for t in tries} == {b_first + 1}, tries  # failed in the restart only
    assert all(t["failures"] == [FAILURE] for t in tries), tries
    assert cluster.status()["status"] == "succeeded"
