"""Replica groups with real agents, real workers and a real torchft lighthouse (docs/replica_groups.md).

Workers here do not import torch (tests/fixtures/workers/group_worker.py reports steps the way a TorchFT script does), so
what is tested is the agent: each group's own machine and budget, the minimum, the lighthouse, the stops and the
clean-up. tests/agent/test_ft_training.py runs real TorchFT training under runner.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, Job, alive, kill_proven, wait_for
from torchft_mark import needs_torchft

pytestmark = pytest.mark.integration
WORKER = ROOT / "tests" / "fixtures" / "workers" / "group_worker.py"


def spec(args: str, *, count: int = 2, nproc: int = 1, min_active: int = 1, restarts: int = 2) -> str:
    return f"""
        version: 1
        name: groups
        entrypoint: {{script: "{WORKER}", args: ["--out", "${{OUT}}", {args}]}}
        replica_groups: {{count: {count}, nproc_per_node: {nproc}, min_active: {min_active}}}
        restart: {{max_restarts: {restarts}, backoff: {{initial: 0s}}}}
        shutdown: {{grace_period: 5s}}
        logs: {{dir: "${{LOGS}}"}}
    """


def pids(j: Job) -> dict[str, int]:
    """Each group's worker pid, from the files written so far (one still being written is not read yet)."""
    found = {}
    for p in j.out.glob("*.pid"):
        try:
            found[p.stem] = json.loads(p.read_text())["pid"]
        except (ValueError, KeyError):  # created, not yet written (CI read one empty)
            continue
    return found


def report(j: Job) -> dict:
    return json.loads((j.run_dir() / "report.json").read_text())


def nothing_left(j: Job, lighthouse_pid: int | None) -> None:
    """Every worker of every group and the lighthouse are gone once the agent exited."""
    left = [p for p in pids(j).values() if alive(p)]
    if lighthouse_pid is not None and alive(lighthouse_pid):
        left.append(lighthouse_pid)
    assert not left, f"outlived the job: {left}"


@needs_torchft
def test_each_group_is_its_own_world_and_a_failed_group_restarts_alone(tmp_path):
    j = Job(tmp_path, spec('"--steps", "20", "--fail-group", "1", "--fail-attempts", "1", "--fail-at", "3"',
                           nproc=2))
    res = j.run(timeout=120)
    assert res.returncode == 0, res.stderr
    seen = {name: json.loads((j.out / f"{name}.pid").read_text()) for name in pids(j)}
    # group 0 ran once: the failure of group 1 never restarted (or signalled) it
    assert sorted(n for n in seen if n.startswith("g0")) == ["g0.r0.a0", "g0.r1.a0"]
    assert sorted(n for n in seen if n.startswith("g1")) == ["g1.r0.a0", "g1.r0.a1", "g1.r1.a0", "g1.r1.a1"]
    for name, env in seen.items():  # RANK and WORLD_SIZE within the group; its own store; torchft's variables
        assert env["WORLD_SIZE"] == "2" and env["RANK"] == name.split(".")[1][1:]
        assert env["NUM_REPLICA_GROUPS"] == "2" and env["TORCHFT_LIGHTHOUSE"].startswith("http://127.0.0.1:")
    assert seen["g0.r0.a0"]["MASTER_PORT"] != seen["g1.r0.a0"]["MASTER_PORT"]
    r = report(j)
    assert r["outcome"] == "succeeded"
    by_group = {g["group"]: g for g in r["groups"]}
    assert (by_group[0]["attempts"], by_group[1]["attempts"]) == (1, 2)
    assert by_group[0]["step"] == 20 and by_group[1]["step"] == 20  # read from rank 0's reports
    assert [f["group"] for f in r["failures"]] == [1]
    transitions = j.transitions()  # every group's machine
    assert transitions and all("group" in t for t in transitions)
    assert any(t["group"] == 1 and t["trigger"] == "retry" for t in transitions)
    assert not any(t["group"] == 0 and t["dst"] in ("FAILED", "RESTARTING") for t in transitions)
    job = [(t["src"], t["trigger"], t["dst"]) for t in j.job_transitions()]  # the job's own machine, above them
    assert job[0] == ("STARTING", "started", "TRAINING") and job[-1] == ("TRAINING", "groups_ended", "ENDED")
    assert ("TRAINING", "group_down", "DEGRADED") in job and ("DEGRADED", "recovered", "TRAINING") in job
    nothing_left(j, r["replica_groups"]["lighthouse"]["pid"])


@needs_torchft
def test_a_group_over_its_budget_leaves_while_the_others_finish(tmp_path):
    j = Job(tmp_path, spec('"--steps", "30", "--fail-group", "1", "--fail-attempts", "99", "--fail-at", "1"',
                           restarts=1))
    res = j.run(timeout=120)
    assert res.returncode == 0, res.stderr
    r = report(j)
    assert r["outcome"] == "succeeded" and "1 left after their budget was spent" in r["reason"]
    by_group = {g["group"]: g for g in r["groups"]}
    assert by_group[0]["outcome"] == "succeeded" and by_group[0]["step"] == 30
    assert by_group[1]["outcome"] == "failed" and by_group[1]["attempts"] == 2
    assert "group 1: failed after 2 attempts (1 restart)" in res.stderr
    nothing_left(j, r["replica_groups"]["lighthouse"]["pid"])


@needs_torchft
def test_too_few_groups_left_ends_the_job_with_the_reason_and_a_report(tmp_path):
    j = Job(tmp_path, spec('"--steps", "600", "--fail-group", "1", "--fail-attempts", "99", "--fail-at", "1"',
                           min_active=2, restarts=0))
    started = time.monotonic()
    res = j.run(timeout=120)
    assert time.monotonic() - started < 60  # group 0 (600 steps) was stopped, not waited for
    assert res.returncode == 1, res.stderr
    r = report(j)
    assert r["outcome"] == "failed"
    assert "fewer than min_active 2" in r["reason"] and "group(s) 1 left" in r["reason"]
    assert {g["group"]: g["outcome"] for g in r["groups"]} == {0: "stopped", 1: "failed"}
    assert "fewer than min_active 2" in res.stderr
    job = [(t["src"], t["trigger"], t["dst"]) for t in j.job_transitions()]
    assert ("DEGRADED", "minimum_lost", "STOPPING") in job and job[-1] == ("STOPPING", "groups_ended", "ENDED")
    stopped = [t for t in j.transitions() if t["group"] == 0 and t["trigger"] == "stop_requested"]
    assert len(stopped) == 1 and "fewer than min_active 2" in stopped[0]["reason"]  # the job's cause, no signal
    nothing_left(j, r["replica_groups"]["lighthouse"]["pid"])


@needs_torchft
def test_the_hosted_lighthouse_is_restarted_when_it_dies(tmp_path):
    j = Job(tmp_path, spec('"--steps", "100", "--step-s", "0.1"'))
    j.start()

    def status() -> dict:
        try:
            return json.loads((j.run_dir() / "status.json").read_text())
        except (OSError, ValueError, AssertionError):
            return {}

    wait_for(lambda: status().get("lighthouse", {}).get("pid"), what="the hosted lighthouse")
    # Each group's running workers and their pids, where docs/replica_groups.md says to find one to kill.
    wait_for(lambda: all(g.get("workers") and g["workers"][0].get("pid") for g in status().get("groups", [{}])),
             what="each group's worker pids in the job's status.json")
    first = status()["lighthouse"]["pid"]
    kill_proven(first, "torchft_lighthouse")
    wait_for(lambda: status().get("lighthouse", {}).get("restarts") == 1, what="the lighthouse's restart")
    second = status()["lighthouse"]["pid"]
    assert second != first and alive(second)
    out, err = j.proc.communicate(timeout=120)
    assert j.proc.returncode == 0, err
    assert "lighthouse_restarting" in (j.run_dir() / "agent.jsonl").read_text()
    nothing_left(j, second)


@needs_torchft
def test_a_stop_signal_reaches_every_group_and_nothing_outlives_the_job(tmp_path):
    j = Job(tmp_path, spec('"--steps", "600"', nproc=2))
    j.start()
    wait_for(lambda: len(pids(j)) == 4, what="every group's workers")
    j.proc.send_signal(signal.SIGTERM)
    _, err = j.proc.communicate(timeout=60)
    assert j.proc.returncode == 128 + signal.SIGTERM, err
    r = report(j)
    assert r["outcome"] == "stopped"
    assert {g["outcome"] for g in r["groups"]} == {"stopped"}
    job = [(t["trigger"], t["dst"]) for t in j.job_transitions()]
    assert ("stop_requested", "STOPPING") in job and job[-1] == ("groups_ended", "ENDED")
    nothing_left(j, r["replica_groups"]["lighthouse"]["pid"])


def test_validate_says_how_to_install_torchft_when_it_is_missing(tmp_path):
    """A spec with replica groups on a machine without torchft: exit 2 at validate, with the install command."""
    j = Job(tmp_path, spec('"--steps", "1"').replace(
        "replica_groups: {count: 2, nproc_per_node: 1, min_active: 1}",
        'replica_groups: {count: 2, lighthouse: {hosted: false, address: "http://127.0.0.1:29510"}}'))
    hide = "import sys; sys.modules['torchft'] = None; from runner.cli.main import main; sys.exit(main())"
    res = subprocess.run([sys.executable, "-c", hide, "validate", str(j.spec)], cwd=tmp_path, env=j.env(),
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2, res.stderr
    assert "replica groups need torchft" in res.stderr and "pip install 'runner[ft]'" in res.stderr
    assert "Traceback" not in res.stderr


LOUD_WORKER = """
import os, sys
if os.environ["REPLICA_GROUP_ID"] == "1":  # this group's log outgrows the agent's file size limit
    for _ in range(3000):
        sys.stdout.write("x" * 1000 + "\\n")
    sys.stdout.flush()
"""


@needs_torchft
def test_each_groups_report_lists_only_its_own_write_failures(tmp_path):
    """Group 1's worker log hits the agent's file size limit (RLIMIT_FSIZE: EFBIG, a failing disk's kind of error);
    group 0 writes nothing that fails. Group 1's report lists `worker_log_write_failed`, group 0's does not (before,
    every group's report listed every write failure of the process); the job's report lists it."""
    j = Job(tmp_path, spec("").replace(f'script: "{WORKER}", args: ["--out", "${{OUT}}", ]', "script: loud.py"))
    (tmp_path / "loud.py").write_text(LOUD_WORKER)
    # the limit is set by a small Python that then becomes the agent, never by a preexec_fn: this pytest process may
    # have loaded grpc (another test's etcd client), whose fork handlers start a poller in the forked child that the
    # child's closing of descriptors breaks (CI saw the child abort, -6, "epoll_wait error: Bad file descriptor")
    limited = ("import os, resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20)); "
               "os.execv(sys.executable, [sys.executable, '-m', 'runner', sys.argv[1]])")
    res = subprocess.run([sys.executable, "-c", limited, str(j.spec)], cwd=tmp_path, env=j.env(),
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    r = report(j)
    by_group = {g["group"]: g for g in r["groups"]}
    assert "worker_log_write_failed" in by_group[1]["warnings"]
    assert "worker_log_write_failed" not in by_group[0]["warnings"], by_group[0]["warnings"]
    assert "worker_log_write_failed" in r["warnings"]
    own = {k: json.loads((j.run_dir() / f"group_{k}" / "report.json").read_text())["warnings"] for k in (0, 1)}
    assert "worker_log_write_failed" in own[1] and "worker_log_write_failed" not in own[0]


@needs_torchft
def test_a_stop_signal_after_a_graceful_stop_ends_the_job_stopped(tmp_path):
    """`runner stop --graceful` (SIGUSR2) lets the workers go on; a SIGTERM after it stops them. The job's outcome is
    the SIGTERM's, as for a job of one group: stopped, 143 (before: the first stop decided, the graceful one, and the
    stopped groups read as "fewer than min_active": failed, exit 1)."""
    j = Job(tmp_path, spec('"--steps", "600"', nproc=1))
    j.start()
    wait_for(lambda: len(pids(j)) == 2, what="every group's workers")
    j.proc.send_signal(signal.SIGUSR2)
    wait_for(lambda: "graceful_stop" in (j.run_dir() / "agent.jsonl").read_text(), what="the graceful stop seen")
    assert all(alive(p) for p in pids(j).values())  # a graceful stop signals no worker
    j.proc.send_signal(signal.SIGTERM)
    _, err = j.proc.communicate(timeout=60)
    assert j.proc.returncode == 128 + signal.SIGTERM, err
    r = report(j)
    assert r["outcome"] == "stopped", r
    assert {g["outcome"] for g in r["groups"]} == {"stopped"}
    nothing_left(j, r["replica_groups"]["lighthouse"]["pid"])
