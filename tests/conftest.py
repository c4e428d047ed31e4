"""Shared test helpers: run the real `runner` CLI as a subprocess, always reaped; check processes are gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from ci_skips import need, verdict_under_ci

from runner.testing.etcd_cluster import EtcdCluster, etcd_on_hosts
from runner.testing.etcd_server import EtcdServer, etcd_server
from runner.testing.hosts import Lab, why_not

if TYPE_CHECKING:
    from multinode_helpers import Cluster

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "tests" / "fixtures" / "workers" / "worker_probe.py"
EXAMPLES = ROOT / "examples" / "jobs"
RUNNER = (sys.executable, "-m", "runner")  # the one way a test starts the runner: `[*RUNNER, ARGS...]`


def runner_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 60,
               stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`runner ARGS` run to completion (bounded), its output captured as text; never raises on its exit code."""
    return subprocess.run([*RUNNER, *args], cwd=cwd, env=env, input=stdin, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    """Under CI=true a skip is a failure unless tests/ci_skips.py's ALLOWED lists it (that module says why)."""
    report = yield
    return verdict_under_ci(report, call)


def alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_proven(pid: int, program: str) -> None:
    """SIGKILL `pid` through a pidfd, after asserting (with the pidfd open, so the pid cannot be reused meanwhile)
    that its command line names `program`: a test kills only the process it means."""
    fd = os.pidfd_open(pid)
    try:
        assert program in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"), f"pid {pid} is not {program}"
        signal.pidfd_send_signal(fd, signal.SIGKILL)
    finally:
        os.close(fd)


def wait_for(cond: Any, timeout: float = 60.0, what: str = "condition",
             show: Callable[[], str] | None = None) -> None:
    """Wait until cond() is true (generous timeout: the machines are shared and slow); `show`: what a timeout
    prints besides (the states the test waited on: a CI failure must say where things stood)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}" + (f"\n{show()}" if show else ""))
        time.sleep(0.05)


@pytest.fixture(autouse=True, scope="session")
def own_state_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The runner's per-user state (runs index, node ledgers, a refused report's fallback) in this session's temp
    folder: never the user's own, and apart for each xdist worker, whose tests may run jobs of one name at once.
    Tests that need a state folder of their own still set XDG_STATE_HOME themselves."""
    before = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("xdg-state"))
    yield
    if before is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = before


class Job:
    """A job spec written to tmp_path, run with `python -m runner` as a real process."""

    def __init__(self, tmp_path: Path, text: str) -> None:
        self.tmp = tmp_path
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.spec = tmp_path / "job.yaml"
        self.spec.write_text(textwrap.dedent(text))
        self.out = tmp_path / "out"
        self.out.mkdir(exist_ok=True)
        self.logs = tmp_path / "logs"
        self.proc: subprocess.Popen[str] | None = None

    def env(self) -> dict[str, str]:
        """The environment the spec's ${VARS} come from."""
        return dict(os.environ, PROBE=str(PROBE), OUT=str(self.out), LOGS=str(self.logs), PYTHONUNBUFFERED="1",
                    XDG_STATE_HOME=str(self.tmp / "state"))  # the runs index of this test, not the user's

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run `runner ARGS job.yaml` (status, stop, validate...) to completion."""
        return runner_cli(*args, str(self.spec), cwd=self.tmp, env=self.env())

    def start(self, *args: str) -> subprocess.Popen[str]:
        """Start the runner on this spec (its cwd is tmp_path; logs under tmp_path/logs)."""
        self.proc = subprocess.Popen(
            [*RUNNER, str(self.spec), *args],
            cwd=self.tmp,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        return self.proc

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run to completion."""
        proc = self.start(*args)
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def run_dir(self) -> Path:
        """The (only) run dir this job wrote."""
        dirs = [d for d in (self.logs).glob("*/*") if d.is_dir() and not d.is_symlink()]
        assert len(dirs) == 1, dirs
        return dirs[0]

    def wait_run_dir(self, timeout: float = 60) -> Path:
        """The run dir once it exists (the job's folder is made before it: never read that as the run dir)."""
        wait_for(lambda: any(d.is_dir() and not d.is_symlink() for d in self.logs.glob("*/*")), timeout=timeout,
                 what="the run dir")
        return self.run_dir()

    def logged(self, event: str) -> list[dict[str, Any]]:
        """The agent's events called `event` so far (agent.jsonl of its run dir; none before the run dir exists)."""
        found = []
        for path in self.logs.glob("*/*/agent.jsonl"):
            for line in path.read_text(errors="replace").splitlines():
                if event in line:
                    try:
                        e = json.loads(line)
                    except ValueError:
                        continue  # a line being written
                    if e.get("event") == event:
                        found.append(e)
        return found

    def transitions(self) -> list[dict[str, Any]]:
        """Every transition event of the run's machines (a job of replica groups: every group's)."""
        lines = (self.run_dir() / "transitions.jsonl").read_text().splitlines()
        return [e for e in map(json.loads, lines) if e.get("event", "transition") == "transition"]

    def job_transitions(self) -> list[dict[str, Any]]:
        """A job of replica groups: its own machine's transitions (runner/core/job_machine.py)."""
        lines = (self.run_dir() / "transitions.jsonl").read_text().splitlines()
        return [e for e in map(json.loads, lines) if e.get("event") == "job_transition"]

    def edges(self) -> list[tuple[str, str, str]]:
        """(src, trigger, dst) of every transition, in order."""
        return [(t["src"], t["trigger"], t["dst"]) for t in self.transitions()]

    def worker_info(self, rank: int, attempt: int = 0) -> dict[str, Any]:
        """What worker_probe recorded for (rank, attempt)."""
        return json.loads((self.out / f"rank{rank}.attempt{attempt}.json").read_text())

    def stop(self) -> None:
        """Kill the runner if it still runs, and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Any]:
    """Factory: job(spec_text) -> Job; every runner started is reaped, every recorded worker pid killed."""
    jobs: list[Job] = []

    def make(text: str) -> Job:
        j = Job(tmp_path / f"job{len(jobs)}", text)
        jobs.append(j)
        return j

    yield make
    for j in jobs:
        j.stop()
        for info in j.out.glob("*.json"):  # never leave a worker behind, even when a test failed
            data = json.loads(info.read_text())
            for pid in (data.get("pid"), data.get("child_pid")):
                if pid and alive(pid):
                    os.kill(pid, signal.SIGKILL)


def cgroup_here() -> bool:
    """True if this machine gives the runner a cgroup v2 (made and removed again)."""
    from runner.system.cgroup import JobCgroup

    cg = JobCgroup.create("probe")
    if cg is None:
        return False
    cg.remove()
    return True


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """A real etcd (runner/testing/etcd_server.py) on free loopback ports, killed and reaped after the test."""
    with etcd_server(tmp_path / "etcd") as server:
        yield server


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    """Simulated hosts (runner/testing/hosts.py) sharing tmp_path/shared; every host, namespace and veth deleted after
    the test. Skipped, with the reason, where namespaces cannot be made (not root); a failure under CI=true."""
    need(why_not())
    with Lab(tmp_path / "shared") as made:
        yield made


@pytest.fixture
def host_etcd(lab: Lab) -> Iterator[EtcdCluster]:
    """A one-member etcd on a host of its own ("etcd"), as the multi-node tests' rendezvous; killed afterwards."""
    with etcd_on_hosts(lab, ["etcd"]) as server:
        yield server


@pytest.fixture
def cluster(lab: Lab, host_etcd: EtcdCluster) -> Iterator[Cluster]:
    """A multi-node Cluster (tests/multinode_helpers.py): one host per node, on the etcd host; every agent and host is
    reaped afterwards."""
    from multinode_helpers import Cluster

    c = Cluster(lab.shared / "cluster", lab, host_etcd.endpoint)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts: SIGKILLed and reaped after it (their children end with them or by their timeout)."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(10)
