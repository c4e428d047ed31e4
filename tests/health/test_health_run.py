"""Health checks end to end on one node: the real CLI, a real health command, real workers (docs/health.md)."""

from __future__ import annotations

import json
import signal
import time

import pytest
from conftest import alive, wait_for

pytestmark = pytest.mark.integration

JOB = """
version: 1
name: health
entrypoint:
  script: ${{PROBE}}
  args: ["--dir", "${{OUT}}"]
nproc_per_node: 2
logs: {{dir: "${{LOGS}}"}}
restart: {{preload: []}}  # the probe imports nothing: preload nothing (docs/standby.md); still forked warm from the fork server
health:
{health}
"""


def health_job(job, health: str):
    return job(JOB.format(health="\n".join(f"  {line}" for line in health.strip().splitlines())))


def events(j, name: str) -> list[dict]:
    lines = (j.run_dir() / "agent.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("event") == name]


def test_a_failing_health_command_ends_a_single_node_job_with_exit_3_and_no_worker(job) -> None:
    """The command fails on every try: after give_up_after the agent ends (exit 3), no worker ever started, and
    report.json, the console and agent.jsonl say why."""
    j = health_job(job, """
commands: ["echo 'scratch disk /scratch is not mounted' >&2; exit 1"]
retry_interval: 0.2s
give_up_after: 1s
""")
    started = time.monotonic()
    res = j.run(timeout=60)
    assert res.returncode == 3, res.stderr
    assert time.monotonic() - started < 30
    assert list(j.out.glob("rank*.json")) == []  # no worker started
    assert j.edges() == [("INIT", "initialized", "RENDEZVOUS"), ("RENDEZVOUS", "fatal", "SHUTDOWN")]
    report = json.loads((j.run_dir() / "report.json").read_text())
    assert report["outcome"] == "error" and report["exit_code"] == 3
    [failure] = report["failures"]
    assert failure["kind"] == "health" and failure["class"] == "infra"
    assert "health checks failed for" in failure["reason"]
    assert "scratch disk /scratch is not mounted" in failure["reason"]
    assert failure["extra"]["health"]["failures"] == [{
        "check": "command", "subject": "echo 'scratch disk /scratch is not mounted' >&2; exit 1",
        "reason": "exit 1: scratch disk /scratch is not mounted"}]
    failed = events(j, "health_failed")
    assert len(failed) >= 3  # tries every 0.2 s for 1 s
    assert len(report["health"]) == len(failed)  # every failed try is in the report too
    status = json.loads((j.run_dir() / "status.json").read_text())
    assert status["state"] == "SHUTDOWN"
    assert failed[0]["reasons"] == [
        "command echo 'scratch disk /scratch is not mounted' >&2; exit 1: exit 1: scratch disk /scratch is not mounted"]
    assert "scratch disk /scratch is not mounted" in res.stdout + res.stderr  # the console shows the reason


def test_passing_checks_let_the_job_run(job) -> None:
    """Every check passes (a command, disk space in logs.dir, memory): the workers run as without a health section."""
    j = health_job(job, """
commands: ["test -d /proc", {run: "true", timeout: 5s}]
min_free: 1MiB
min_free_memory: 1MiB
""")
    res = j.run(timeout=60)
    assert res.returncode == 0, res.stderr
    assert j.edges() == [("INIT", "initialized", "RENDEZVOUS"), ("RENDEZVOUS", "rendezvous_complete", "RUNNING"),
                         ("RUNNING", "workers_succeeded", "SHUTDOWN")]
    assert len(list(j.out.glob("rank*.attempt0.json"))) == 2
    [ok] = events(j, "health_ok")
    assert set(ok["checked"]) == {"commands", "memory", f"disk {j.logs}"}
    assert events(j, "health_failed") == []


def test_a_node_that_becomes_healthy_joins(job, tmp_path) -> None:
    """The first try fails, the second passes: the node joins then, and the workers run."""
    flag = tmp_path / "mounted"
    j = health_job(job, f"""
commands: ["test -e {flag} || {{ touch {flag}; echo 'not mounted yet' >&2; exit 1; }}"]
retry_interval: 0.2s
""")
    res = j.run(timeout=60)
    assert res.returncode == 0, res.stderr
    assert [e["tries"] for e in events(j, "health_failed")] == [1]
    assert events(j, "health_passed")[0]["tries"] == 2
    assert len(list(j.out.glob("rank*.attempt0.json"))) == 2


def test_a_stop_during_the_checks_kills_the_running_command(job, tmp_path) -> None:
    """SIGTERM while a health command runs: the agent stops at once (128 + 15) and the command's group is killed."""
    pid_file = tmp_path / "check.pid"
    j = health_job(job, f"""
commands: [{{run: "echo $$ > {pid_file}; sleep 60", timeout: 50s}}]
""")
    proc = j.start()
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip() != "", 30, "the health command to start")
    pid = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    wait_for(lambda: not alive(pid), 10, "the health command to be gone")
    assert list(j.out.glob("rank*.json")) == []
