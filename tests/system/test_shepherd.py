"""The guard with real processes: the agent SIGKILLed, the guard SIGKILLed first, and a recycled pid (PID namespace).

tests/fixtures/workers/group_agent.py plays the agent: a real WorkerGroup + Shepherd (subreaper) in its own process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from ci_skips import need
from conftest import ROOT, alive, cgroup_here, wait_for

from runner.system import procs

pytestmark = pytest.mark.integration
AGENT = ROOT / "tests" / "fixtures" / "workers" / "group_agent.py"


HAS_CGROUP = cgroup_here()


class Agent:
    """group_agent.py started with N escape workers; every pid it reports is killed at teardown."""

    def __init__(self, out: Path, n: int, *, cgroup: bool, worker_args: list[str]) -> None:
        self.out = out
        out.mkdir(exist_ok=True)
        opts = [] if cgroup else ["--no-cgroup"]
        self.proc = subprocess.Popen(
            [sys.executable, str(AGENT), str(out), str(n), *opts, "--", *worker_args],
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        self.n = n
        wait_for(lambda: (out / "agent.json").exists() or self.proc.poll() is not None, what="agent ready")
        assert self.proc.poll() is None, "the stand-in agent died"
        self.info = json.loads((out / "agent.json").read_text())

    def ranks(self) -> list[dict[str, int]]:
        return [json.loads((self.out / f"rank{r}.json").read_text()) for r in range(self.n)]

    def job_pids(self) -> list[int]:
        return [pid for r in self.ranks() for pid in (r["pid"], r["escapee"])]

    def shepherd(self) -> tuple[int, int]:
        pid, restarts = (self.out / "shepherds.txt").read_text().split()
        return int(pid), int(restarts)

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pid in [*self.job_pids(), self.info["shepherd"]]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(params=["cgroup", "no-cgroup"])
def mode(request: pytest.FixtureRequest) -> str:
    if request.param == "cgroup" and not HAS_CGROUP:
        need("no writable cgroup v2 here: the fallback is tested by the other parameter")
    return str(request.param)


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[list[Agent]]:
    started: list[Agent] = []
    yield started
    for a in started:
        a.cleanup()


def test_agent_sigkilled_nothing_escapes(tmp_path: Path, mode: str, agents: list[Agent]) -> None:
    """SIGKILL the agent: its guard kills every worker and every setsid() grandchild; the cgroup is removed."""
    a = Agent(tmp_path / "out", 2, cgroup=mode == "cgroup", worker_args=[])
    agents.append(a)
    pids = a.job_pids()
    assert all(alive(p) for p in pids)
    a.proc.kill()
    a.proc.wait()
    wait_for(lambda: not any(alive(p) for p in pids), what="every job process to die")
    wait_for(lambda: not alive(a.info["shepherd"]), what="the guard to exit")
    if a.info["cgroup"]:
        wait_for(lambda: not Path(a.info["cgroup"]).exists(), what="the job's cgroup to be removed")


def test_guard_killed_first_is_replaced_then_agent_killed(tmp_path: Path, mode: str, agents: list[Agent]) -> None:
    """SIGKILL the guard: the agent notices (pidfd) and starts another with the current workers; then SIGKILL the
    agent: the new guard kills everything."""
    a = Agent(tmp_path / "out", 1, cgroup=mode == "cgroup", worker_args=[])
    agents.append(a)
    first = a.info["shepherd"]
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: a.shepherd()[1] == 1, what="a new guard")
    second, _ = a.shepherd()
    assert second != first and alive(second)
    pids = a.job_pids()
    assert all(alive(p) for p in pids)  # the guard's death harmed no worker
    a.proc.kill()
    a.proc.wait()
    wait_for(lambda: not any(alive(p) for p in pids), what="every job process to die")
    wait_for(lambda: not alive(second), what="the new guard to exit")


def test_agent_sigterm_stops_cleanly(tmp_path: Path, agents: list[Agent]) -> None:
    """The normal end: stop() + close() leave no process and no cgroup behind; the agent exits 0."""
    a = Agent(tmp_path / "out", 2, cgroup=HAS_CGROUP, worker_args=[])
    agents.append(a)
    pids = a.job_pids()
    a.proc.send_signal(signal.SIGTERM)
    assert a.proc.wait(timeout=60) == 0
    assert not any(alive(p) for p in pids)
    assert not alive(a.info["shepherd"])
    if a.info["cgroup"]:
        assert not Path(a.info["cgroup"]).exists()


def test_agent_sigkilled_env_scrubbed_escapee_dies_with_cgroup(tmp_path: Path, agents: list[Agent]) -> None:
    """An escapee that left the session *and* cleared its environment: the job's cgroup still holds it."""
    if not HAS_CGROUP:
        need("no writable cgroup v2 here; without one such a process outlives a SIGKILLed agent (docs/faults.md)")
    a = Agent(tmp_path / "out", 1, cgroup=True, worker_args=["--scrub-env"])
    agents.append(a)
    pids = a.job_pids()
    a.proc.kill()
    a.proc.wait()
    wait_for(lambda: not any(alive(p) for p in pids), what="every job process to die")
    wait_for(lambda: not alive(a.info["shepherd"]), what="the guard to exit")
    assert not Path(a.info["cgroup"]).exists()


RECYCLE = r"""
import os, signal, subprocess, sys, time
from runner.system import procs
from runner.system.shepherd import Shepherd

def fork_at(pid):
    # the next fork in this PID namespace gets `pid`
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(pid - 1))
    return subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(60)"])

shepherd = Shepherd(agent=False, cgroup=False)
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
shepherd.watch(worker.pid)
old = worker.pid
# The bug this guards against: a worker reaped while still listed, its pid then given to another process.
worker.kill(); worker.wait()
# A start time is counted in clock ticks (10 ms): a pid the kernel recycles after wrapping around belongs to a
# process that starts far later. Forcing the reuse with ns_last_pid, let at least two ticks pass first, or the
# impostor could share the worker's tick and be indistinguishable by any pid + start time check.
time.sleep(0.05)
impostor = fork_at(old)
assert impostor.pid == old, (impostor.pid, old)
deadline = time.monotonic() + 30
while os.getsid(impostor.pid) != impostor.pid:  # its setsid() ran: it now leads a group and a session of the old id
    assert time.monotonic() < deadline, "the impostor never called setsid()"
    time.sleep(0.01)
shepherd.close()  # EOF: the guard kills what is still listed
time.sleep(0.2)
print("alive" if impostor.poll() is None else f"killed {impostor.returncode}")
impostor.kill(); impostor.wait()
"""


def test_guard_never_kills_a_recycled_pid(tmp_path: Path) -> None:
    """In a PID namespace a listed worker is reaped and its pid handed to a new process that calls setsid(); the
    guard must not kill it (the old guard did killpg on that id)."""
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        need("needs root and unshare(1) for a private PID namespace")
    done = subprocess.run(
        [unshare, "--pid", "--fork", "--mount-proc", sys.executable, "-c", RECYCLE],
        env=dict(os.environ, PYTHONPATH=str(ROOT), RUNNER_CGROUP="off"), capture_output=True, text=True,
        timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "alive"


def test_start_time_identifies_a_process() -> None:
    """What the guard checks on `+ PID START`: this process's start time is stable and a child's differs."""
    me = procs.read_stat(os.getpid())
    assert me is not None and me == procs.read_stat(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        st = procs.read_stat(child.pid)
        assert st is not None and st.ppid == os.getpid() and st.start_time >= me.start_time
    finally:
        child.kill()
        child.wait()


def test_the_guard_removes_only_the_agents_private_runner_folders(tmp_path: Path) -> None:
    """`D PATH` lines: at the guard's end, a private runner-* directory goes; one open to others, one named
    otherwise, and a link to a private one (the link's target included) stay, whatever the agent said."""
    from runner.system.shepherd import Shepherd

    made = {name: tmp_path / name for name in ("runner-fr-mine", "runner-open", "someone-else", "target")}
    for path in made.values():
        path.mkdir(mode=0o700)
        (path / "0.sock").write_text("")
    made["runner-open"].chmod(0o755)
    link = tmp_path / "runner-link"
    link.symlink_to(made["target"])
    guard = Shepherd(agent=False, cgroup=False)
    for path in (made["runner-fr-mine"], made["runner-open"], made["someone-else"], link):
        guard.remove_at_death(path)
    guard_pid = guard.pid
    assert guard_pid is not None and alive(guard_pid)
    assert made["runner-fr-mine"].exists()  # nothing removed while the agent lives
    guard.close()  # its pipe's EOF: what the agent's death gives it too
    assert not made["runner-fr-mine"].exists()
    assert all(made[n].exists() for n in ("runner-open", "someone-else", "target")) and link.is_symlink()
