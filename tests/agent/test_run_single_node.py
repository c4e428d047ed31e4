"""End to end on one node: the real CLI, real worker processes, real signals."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
from conftest import RUNNER, alive, wait_for
from probe_jobs import probe_job

pytestmark = pytest.mark.integration

def test_success_runs_every_rank_with_the_contract(job):
    """Two workers run once with the torchrun environment contract; the run ends in SHUTDOWN with exit 0."""
    j = probe_job(job)
    res = j.run()
    assert res.returncode == 0, res.stderr
    assert j.edges() == [
        ("INIT", "initialized", "RENDEZVOUS"),
        ("RENDEZVOUS", "rendezvous_complete", "RUNNING"),
        ("RUNNING", "workers_succeeded", "SHUTDOWN"),
    ]
    envs = [j.worker_info(r)["env"] for r in (0, 1)]
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"}
    assert {e["MASTER_PORT"] for e in envs} != {""}
    run_ids = {e["TORCHELASTIC_RUN_ID"] for e in envs}  # one per run, new every run of a local job
    assert len(run_ids) == 1
    assert run_ids.pop().startswith("probe-")
    assert all(e["OMP_NUM_THREADS"] == "1" for e in envs)
    assert "[" in res.stdout and "rank 1 done on attempt 0" in res.stdout


def test_torchelastic_enable_file_timer_turns_the_watchdog_on_as_for_torchrun(job):
    """TORCHELASTIC_ENABLE_FILE_TIMER=1 in the agent's environment serves the file timer (the spec left it off)."""
    j = probe_job(job)
    env = dict(j.env(), TORCHELASTIC_ENABLE_FILE_TIMER="1")
    proc = subprocess.run([*RUNNER, str(j.spec)], cwd=j.tmp, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    timer_files = [j.worker_info(r)["env"].get("TORCHELASTIC_TIMER_FILE") for r in (0, 1)]
    assert all(timer_files)
    assert len(set(timer_files)) == 2  # one FIFO per worker
    without = probe_job(job)
    assert without.run().returncode == 0
    assert "TORCHELASTIC_TIMER_FILE" not in without.worker_info(0)["env"]


def test_transition_events_carry_every_field(job):
    """Each transition line has src, dst, trigger, reason, attempt, job, node and time."""
    j = probe_job(job)
    assert j.run().returncode == 0
    for event in j.transitions():
        assert {"src", "dst", "trigger", "reason", "attempt", "job", "node", "time"} <= set(event)
        assert event["job"] == "probe" and event["reason"]
    kept = [json.loads(line) for line in (j.run_dir() / "agent.jsonl").read_text().splitlines()]
    assert [e["rank"] for e in kept if e["event"] == "worker_started"] == [0, 1]  # the agent's own events are kept
    assert sum(e["event"] == "transition" for e in kept) == len(j.transitions())


def test_crash_restarts_then_succeeds_on_a_fresh_port(job):
    """Rank 1 fails on attempt 0; the group restarts with RESTART_COUNT 1 and a new MASTER_PORT, and succeeds."""
    j = probe_job(job, '"--fail-rank", "1", "--fail-attempts", "1", "--sleep", "0.3"', max_restarts=2)
    res = j.run()
    assert res.returncode == 0, res.stderr
    edges = j.edges()
    assert ("RUNNING", "worker_failed", "FAILED") in edges
    assert ("FAILED", "retry", "RESTARTING") in edges
    assert ("RESTARTING", "restarted", "RENDEZVOUS") in edges
    assert edges[-1] == ("RUNNING", "workers_succeeded", "SHUTDOWN")
    first, second = j.worker_info(0, 0)["env"], j.worker_info(0, 1)["env"]
    assert second["TORCHELASTIC_RESTART_COUNT"] == "1"
    assert first["MASTER_PORT"] != second["MASTER_PORT"]
    report = json.loads((j.run_dir() / "report.json").read_text())
    assert report["outcome"] == "succeeded" and report["restarts"] == 1
    assert report["failures"][0]["rank"] == 1 and report["failures"][0]["exit_code"] == 3


def test_budget_exhausted_reports_the_root_cause(job):
    """A rank that always fails uses up max_restarts; exit 1 and the report names the rank and its stderr."""
    j = probe_job(job, '"--fail-rank", "1", "--fail-attempts", "99", "--sleep", "5"', max_restarts=1)
    res = j.run()
    assert res.returncode == 1
    assert j.edges()[-1] == ("FAILED", "give_up", "SHUTDOWN")
    assert "root cause (attempt 1): rank 1 exited with code 3" in res.stderr
    assert "rank 1 failing on attempt 1 with code 3" in res.stderr  # the stderr tail
    assert (j.run_dir() / "attempt_0" / "failure.json").exists()  # earlier attempts' causes are kept


def test_non_retryable_exit_code_is_not_restarted(job):
    """An exit code listed as non-retryable ends the job at once even with restarts left."""
    j = probe_job(job, '"--fail-rank", "0", "--fail-attempts", "9", "--fail-code", "42", "--sleep", "5"',
                  max_restarts=5, non_retryable="42")
    res = j.run()
    assert res.returncode == 1
    assert j.edges()[-1] == ("FAILED", "non_retryable", "SHUTDOWN")
    assert not (j.out / "rank0.attempt1.json").exists()


def test_scope_worker_replaces_only_the_failed_rank(job):
    """With scope: worker, rank 1 is replaced (same rank, attempt 1) while rank 0 keeps running untouched."""
    j = probe_job(job, '"--fail-rank", "1", "--fail-attempts", "1", "--sleep", "2"', max_restarts=1, scope="worker")
    res = j.run()
    assert res.returncode == 0, res.stderr
    assert ("RESTARTING", "worker_replaced", "RUNNING") in j.edges()
    assert not (j.out / "rank0.attempt1.json").exists()  # rank 0 never restarted
    assert not (j.out / "rank0.signals").exists()  # nor signalled
    replaced = j.worker_info(1, 1)["env"]
    assert replaced["RANK"] == "1" and replaced["TORCHELASTIC_RESTART_COUNT"] == "1"


def test_sigterm_stops_workers_with_the_signal_and_exits_143(job):
    """SIGTERM to the runner is forwarded to the workers (they see it), and the runner exits 128+15."""
    j = probe_job(job, '"--sleep", "60"')
    proc = j.start()
    wait_for(lambda: all((j.out / f"rank{r}.attempt0.json").exists() for r in (0, 1)), what="workers to start")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert (j.out / "rank0.signals").read_text() == "term\n"
    assert not alive(j.worker_info(0)["pid"]) and not alive(j.worker_info(1)["pid"])
    assert j.edges()[-1] == ("RUNNING", "stop_requested", "SHUTDOWN")


def test_graceful_stop_lets_workers_finish(job):
    """SIGUSR2 (graceful stop) does not signal the workers: they finish, the job succeeds, no restart."""
    j = probe_job(job, '"--sleep", "2"', max_restarts=3)
    proc = j.start()
    wait_for(lambda: all((j.out / f"rank{r}.attempt0.json").exists() for r in (0, 1)), what="workers to start")
    proc.send_signal(signal.SIGUSR2)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert not (j.out / "rank0.signals").exists() and not (j.out / "rank1.signals").exists()
    assert "rank 0 done on attempt 0" in out
    assert j.edges()[-1] == ("RUNNING", "workers_succeeded", "SHUTDOWN")


def test_worker_ignoring_sigterm_is_killed_after_grace(job):
    """A worker that ignores SIGTERM gets SIGKILL once the grace period is over."""
    j = probe_job(job, '"--sleep", "60", "--ignore-term"', grace="1s")
    proc = j.start()
    wait_for(lambda: all((j.out / f"rank{r}.attempt0.json").exists() for r in (0, 1)), what="workers to start")
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert time.monotonic() - started >= 1.0  # it waited the grace period
    assert "still ran 1 s after the stop: killed with SIGKILL" in err, err  # the workers_killed warning
    assert (j.out / "rank0.signals").read_text() == "term\n"  # SIGTERM came first
    assert not alive(j.worker_info(0)["pid"])


def test_sigkill_of_the_runner_leaves_no_worker_or_grandchild(job):
    """SIGKILL to the runner: its workers and the workers' own children die too."""
    j = probe_job(job, '"--sleep", "60", "--spawn-child"')
    proc = j.start()
    wait_for(lambda: all((j.out / f"rank{r}.attempt0.json").exists() for r in (0, 1)), what="workers to start")
    infos = [j.worker_info(r) for r in (0, 1)]
    proc.kill()
    proc.communicate(timeout=30)
    pids = [p for i in infos for p in (i["pid"], i["child_pid"])]
    wait_for(lambda: not any(alive(p) for p in pids), timeout=10, what="workers and grandchildren to die")


def test_status_and_stop_of_a_local_job(job):
    """`runner status` shows the running job's workers; `runner stop` stops it; status after the end says so."""
    j = probe_job(job, '"--sleep", "60"')
    proc = j.start()
    wait_for(lambda: all((j.out / f"rank{r}.attempt0.json").exists() for r in (0, 1)), what="workers to start")
    during = json.loads(j.cli("status", "--json").stdout)
    assert during["status"] == "running"
    assert {w["pid"] for w in during["nodes"][0]["workers"]} == {j.worker_info(r)["pid"] for r in (0, 1)}
    assert "stop sent" in j.cli("stop").stdout
    proc.communicate(timeout=60)
    assert proc.returncode == 143
    after = json.loads(j.cli("status", "--json").stdout)
    assert after["status"] == "stopped" and after["nodes"][0]["state"] == "SHUTDOWN"
    assert "nothing to stop" in j.cli("stop").stdout  # stopping twice is harmless


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("{script: no_such_script.py}", "script no_such_script.py not found"),
        ("{command: [no-such-program-xyz]}", "program 'no-such-program-xyz' not found"),
    ],
)
def test_missing_entrypoint_is_a_clear_spec_error(job, entry, message):
    """A script or program that does not exist: exit 2 before anything is created (no run dir), with a fix."""
    j = job(f'name: missing\nentrypoint: {entry}\nlogs: {{dir: "${{LOGS}}"}}\n')
    res = j.run()
    assert res.returncode == 2
    assert message in res.stderr
    assert "Traceback" not in res.stderr
    assert " — " in res.stderr  # every problem comes with its fix
    assert not j.logs.exists()  # preflight refused before the run dir, any worker or any etcd key existed


def test_console_streams_per_rank_reach_the_console_but_files_keep_everything(job):
    """torchrun's --redirects 1:1 (logs.console_streams): rank 1's stdout stays off the console, not out of its file."""
    j = job("""
        version: 1
        name: streams
        entrypoint:
          script: ${PROBE}
          args: ["--dir", "${OUT}"]
        nproc_per_node: 2
        logs: {dir: "${LOGS}", console_streams: "0:all,1:stderr"}
    """)
    res = j.run()
    assert res.returncode == 0, res.stderr
    assert "rank 0 done on attempt 0" in res.stdout
    assert "rank 1 done on attempt 0" not in res.stdout
    rank1 = next(j.run_dir().glob("attempt_0/rank_1/stdout.log")).read_text()
    assert "rank 1 done on attempt 0" in rank1
