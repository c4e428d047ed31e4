"""`runner status` / `runner stop` on the local backend: a stale status.json never gets a process signalled that is
not the job's agent (pids are recycled)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from runner.runs import control

STRANGER = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(9))\nprint('up', flush=True)\ntime.sleep(60)"


@pytest.fixture
def stranger():
    """A live process that is not an agent (stands for whoever got the agent's pid after it ended)."""
    p = subprocess.Popen([sys.executable, "-c", STRANGER], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "up\n"
    yield p
    p.kill()
    p.wait()


def test_stale_status_pid_is_not_the_agent(tmp_path: Path, stranger: subprocess.Popen[str]) -> None:
    """status.json names a live pid that does not hold the run's files: not running, and never signalled."""
    node = {"agent_pid": stranger.pid, "run_dir": str(tmp_path), "state": "RUNNING"}
    assert not control.is_agent(node)
    assert not control.signal_agent(node, signal.SIGTERM)
    assert stranger.poll() is None


def test_recorded_start_time_must_match(stranger: subprocess.Popen[str]) -> None:
    """With agent_start_time recorded, a process with the same pid but another start time is refused."""
    st = control.agent_identity()
    assert st["agent_pid"] == os.getpid() and isinstance(st["agent_start_time"], int)
    assert control.is_agent(st)
    wrong = {"agent_pid": stranger.pid, "agent_start_time": st["agent_start_time"]}
    assert not control.signal_agent(wrong, signal.SIGTERM)
    assert stranger.poll() is None


def test_the_agent_holding_its_run_files_is_signalled(tmp_path: Path) -> None:
    """A process holding <run_dir>/agent.jsonl open is proven the agent of that run and gets the signal."""
    log = tmp_path / "agent.jsonl"
    code = f"import time\nf = open({str(log)!r}, 'a')\nprint('up', flush=True)\ntime.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline() == "up\n"
        node = {"agent_pid": p.pid, "run_dir": str(tmp_path)}
        assert control.is_agent(node)
        assert control.signal_agent(node, signal.SIGTERM)
        assert p.wait(timeout=60) == -signal.SIGTERM
    finally:
        p.kill()
        p.wait()


@pytest.mark.parametrize("pid", [None, "12", -1, 0, True, 2**40])
def test_nonsense_pids_are_refused(pid: object) -> None:
    """A damaged status.json never leads to a signal (nor to an exception)."""
    node = {"agent_pid": pid, "run_dir": "/nonexistent"}
    assert not control.is_agent(node)
    assert not control.signal_agent(node, signal.SIGTERM)


@pytest.mark.integration
def test_runner_stop_with_a_stale_status_signals_nobody(job, stranger: subprocess.Popen[str]) -> None:
    """The real CLI: the job ran and ended; its status.json is rewritten to look live with a stranger's pid (as if
    the pid had been recycled): `runner stop` reports nothing to stop and the stranger lives."""
    from probe_jobs import probe_job

    j = probe_job(job)
    assert j.run().returncode == 0
    status_path = j.run_dir() / "status.json"
    status = json.loads(status_path.read_text())
    status.update(state="RUNNING", agent_pid=stranger.pid)
    status.pop("agent_start_time", None)
    status_path.write_text(json.dumps(status))
    res = j.cli("stop")
    assert res.returncode == 0, res.stderr
    assert "not running" in res.stdout
    assert stranger.poll() is None
