"""Faults around a real agent: the log directory fills up mid-run, a stop arrives while etcd never answers, a
graceful stop arrives during the restart backoff. The workers' result stands and the report is never lost."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from ci_skips import need
from conftest import wait_for

from runner.rendezvous.ports import free_port

pytestmark = pytest.mark.integration

FILL = """
import os, sys, time
rank = int(os.environ["RANK"])
if rank == 0:
    try:
        with open(os.path.join(os.environ["FILL_DIR"], "filler"), "wb") as f:
            while True:
                f.write(b"x" * 65536)
                f.flush()
    except OSError:
        pass  # ENOSPC: the log directory is full now
time.sleep(1.0 + rank)
"""


@pytest.fixture
def full_tmpfs(tmp_path):
    """A 4 MiB tmpfs mounted at tmp_path/logs (root only), unmounted at the end."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        need("mounting a tmpfs needs root and mount(8)")
    mnt = tmp_path / "logs"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, check=False)
    if done.returncode != 0:
        need(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_log_dir_never_kills_healthy_workers_and_the_report_goes_elsewhere(job, full_tmpfs):
    j = job(f"""
        version: 1
        name: fill
        entrypoint:
          command: ["{sys.executable}", "-c", {json.dumps(FILL)}]
        nproc_per_node: 2
        env: {{FILL_DIR: "{full_tmpfs}"}}
        logs: {{dir: "{full_tmpfs}", tee: false}}
    """)
    state = j.tmp / "state"  # conftest's Job keeps the runs index and fallbacks here (XDG_STATE_HOME)
    done = j.run(timeout=120)
    assert done.returncode == 0, done.stderr
    reports = list((state / "runner" / "reports").glob("*-report.json"))
    in_run_dir = list(full_tmpfs.glob("fill/*/report.json"))
    found = reports or in_run_dir
    assert found, done.stderr
    report = json.loads(found[0].read_text())
    assert report["outcome"] == "succeeded"
    if reports:  # the console says where the report went
        assert str(reports[0]) in done.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_is_honoured_within_a_second_while_etcd_never_answers(job, signum):
    j = job(f"""
        version: 1
        name: unreachable
        entrypoint: {{command: ["true"]}}
        nproc_per_node: 1
        rendezvous:
          backend: etcd
          endpoints: ["127.0.0.1:{free_port("127.0.0.1")}"]
          connect_timeout: 60s
        logs: {{dir: "${{LOGS}}"}}
    """)
    proc = j.start()
    wait_for(lambda: j.logged("etcd_connect_retry") or j.logged("etcd_call_retry"), timeout=30,
             what="the agent in INIT, retrying the connection")
    assert proc.poll() is None
    sent = time.monotonic()
    proc.send_signal(signum)
    proc.communicate(timeout=30)
    took = time.monotonic() - sent
    assert proc.returncode == 128 + signum
    assert took < 5, f"took {took:.1f} s"  # the contract is 1 s; 5 s leaves room for a loaded CI machine
    report = json.loads((j.run_dir() / "report.json").read_text())
    assert report["outcome"] == "stopped"


def test_a_graceful_stop_during_the_backoff_ends_with_the_failed_attempts_result(job):
    j = job("""
        version: 1
        name: backoff
        entrypoint:
          script: ${PROBE}
          args: ["--dir", "${OUT}", "--fail-rank", "0", "--fail-attempts", "9", "--fail-after", "0"]
        nproc_per_node: 1
        restart: {max_restarts: 5, backoff: {initial: 60s, max: 60s, jitter: 0}}
        logs: {dir: "${LOGS}"}
    """)
    proc = j.start()
    deadline = time.monotonic() + 60
    while not (j.out / "rank0.attempt1.json").exists():  # attempt 1 failed too: now in the 60 s backoff
        assert time.monotonic() < deadline, "attempt 1 never ran"
        time.sleep(0.05)
    wait_for(lambda: any(e["delay_s"] >= 59 for e in j.logged("backoff")), timeout=30, what="the 60 s backoff")
    proc.send_signal(signal.SIGUSR2)
    proc.communicate(timeout=30)
    assert proc.returncode == 1
    report = json.loads((j.run_dir() / "report.json").read_text())
    assert report["outcome"] == "failed"
    assert report["attempts"] == 2
