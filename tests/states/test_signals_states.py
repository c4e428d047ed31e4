"""Every stop signal a scheduler sends, in every state a real agent waits in: the job stops the documented way
(exit 128+N, report.json written) and at once, never after a connect timeout, a join timeout or a backoff."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Job, wait_for

from runner.rendezvous.ports import free_port
from runner.testing.etcd_server import EtcdServer, etcd_server

pytestmark = pytest.mark.integration

SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT]
HONOURED_WITHIN_S = 5.0  # the contract is one second; the rest is room for a loaded 2-core CI machine


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    with etcd_server(tmp_path_factory.mktemp("etcd")) as server:
        yield server


def status_state(j: Job) -> str | None:
    try:
        return json.loads((j.run_dir() / "status.json").read_text())["state"]
    except (OSError, ValueError, AssertionError, KeyError):
        return None


def in_init(job: Callable[[str], Job], _etcd: EtcdServer) -> Job:
    """An etcd that never answers: the agent retries connecting in INIT for a minute."""
    j = job(f"""
        version: 1
        name: sig-init
        entrypoint: {{command: ["true"]}}
        nproc_per_node: 1
        rendezvous: {{backend: etcd, endpoints: ["127.0.0.1:{free_port("127.0.0.1")}"], connect_timeout: 60s}}
        logs: {{dir: "${{LOGS}}"}}
    """)
    j.start()

    def in_init_now() -> bool:  # INIT writes spec.json right after installing its signal handlers
        try:
            return (j.run_dir() / "spec.json").exists()
        except AssertionError:
            return False

    wait_for(in_init_now, what="the agent to install its handlers in INIT")
    return j


def in_rendezvous(job: Callable[[str], Job], etcd: EtcdServer) -> Job:
    """A two-node job with one node: the agent waits in RENDEZVOUS for a peer that never comes."""
    j = job(f"""
        version: 1
        name: sig-rdzv-{time.monotonic_ns()}
        entrypoint: {{command: ["true"]}}
        nproc_per_node: 1
        nodes: 2
        rendezvous: {{backend: etcd, endpoints: ["{etcd.endpoint}"], join_timeout: 120s}}
        logs: {{dir: "${{LOGS}}"}}
    """)
    j.start("--node", "a")
    wait_for(lambda: status_state(j) == "RENDEZVOUS", what="the agent to wait in RENDEZVOUS")
    return j


def in_running(job: Callable[[str], Job], _etcd: EtcdServer) -> Job:
    j = job("""
        version: 1
        name: sig-running
        entrypoint: {script: "${PROBE}", args: ["--dir", "${OUT}", "--sleep", "60"]}
        nproc_per_node: 1
        shutdown: {grace_period: 5s}
        logs: {dir: "${LOGS}"}
    """)
    j.start()
    wait_for(lambda: (j.out / "rank0.attempt0.json").exists(), what="the worker to start")
    return j


def in_backoff(job: Callable[[str], Job], _etcd: EtcdServer) -> Job:
    """Attempt 1 failed as well: the agent waits out a 60 s backoff in RESTARTING."""
    j = job("""
        version: 1
        name: sig-backoff
        entrypoint:
          script: "${PROBE}"
          args: ["--dir", "${OUT}", "--fail-rank", "0", "--fail-attempts", "9", "--fail-after", "0"]
        nproc_per_node: 1
        restart: {max_restarts: 5, backoff: {initial: 60s, max: 60s, jitter: 0}}
        logs: {dir: "${LOGS}"}
    """)
    j.start()
    wait_for(lambda: (j.out / "rank0.attempt1.json").exists(), what="attempt 1")
    wait_for(lambda: status_state(j) == "RESTARTING", what="the backoff")
    return j


STATES = {"INIT": in_init, "RENDEZVOUS": in_rendezvous, "RUNNING": in_running, "backoff": in_backoff}


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: s.name)
@pytest.mark.parametrize("state", list(STATES))
def test_a_stop_signal_in_every_state(job, etcd, state, signum):
    j = STATES[state](job, etcd)
    assert j.proc is not None
    assert j.proc.poll() is None, "the agent ended before the signal"
    sent = time.monotonic()
    j.proc.send_signal(signum)
    _, err = j.proc.communicate(timeout=60)
    took = time.monotonic() - sent
    assert j.proc.returncode == 128 + signum, err
    assert took < HONOURED_WITHIN_S + (5 if state == "RUNNING" else 0), f"took {took:.1f} s"  # RUNNING: + grace
    report = json.loads((j.run_dir() / "report.json").read_text())
    assert report["outcome"] == "stopped"
    assert report["exit_code"] == 128 + signum
    assert "internal error" not in err  # a worker may print its KeyboardInterrupt; the agent never a traceback
    assert Path(j.run_dir() / "transitions.jsonl").read_text().splitlines()[-1].count('"dst": "SHUTDOWN"') == 1
