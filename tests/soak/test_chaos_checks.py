"""Every check of the chaos soak can fail (issue 32, point 6): its real objects (Soak, Job, Agent, the tally, its etcd)
on real processes (an agent that starts a worker, a worker paused and killed, an agent that already exited) and a
real etcd; the workers' markers and checkpoint, which bench/workers/chaos_train.py writes, are written by the test
where a real training run is not the point. Each test fails against the soak before this change:

- a class that the soak's other options rule out (late_join with --nodes 2) is refused when --classes names it, and is
  named as skipped, never as fired, when it is not named;
- stop_worker's pause brings pause_went_on: after the SIGCONT the training goes on (or the worker is gone) within its
  bound, or the check breaks;
- kill_agent's lease_revoked, when it cannot be set up (etcd down, no state key), is counted as "did not apply" with
  its reason;
- a kill or stop signal to an agent that had already exited is not counted as injected;
- kill_worker's nothing_survives does not hold while the killed worker is a zombie its agent has not waited for;
- an etcd fault (and a partition) brings one_world and job_completes at its job's end.

Fast (a few seconds in all): no runner agent, no torch.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, wait_for
from soak_helpers import agent_of, soak_args

from bench.soak.bounds import CLASSES, PREFIX
from bench.soak.infra import ChaosEtcd
from bench.soak.model import Agent, Expect, Fault, Job, Violation
from bench.soak.procs import Proc, ident, stat
from bench.soak.soak import Soak

WAIT_S = 10.0
# An agent: starts one worker (with the agent's environment: the job's token; SIGKILLed when the agent ends: its
# PR_SET_PDEATHSIG, set before it says it is ready) and waits for it only when told.
WORKER = "import ctypes, time; ctypes.CDLL(None).prctl(1, 9, 0, 0, 0); print('ready', flush=True); time.sleep(120)"
AGENT = f"""
import subprocess, sys
worker = subprocess.Popen([sys.executable, "-c", {WORKER!r}], stdout=subprocess.PIPE, text=True)
worker.stdout.readline()
print(worker.pid, flush=True)
if sys.stdin.readline().strip() == "reap":
    worker.wait()
    print("reaped", flush=True)
sys.stdin.readline()
"""


def state(pid: int) -> str:
    """The process's state letter ('' once gone)."""
    st = stat(pid)
    return st[0] if st else ""


@pytest.fixture
def soak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Soak:
    """A soak (external etcd: none yet) and its first job, with its folders; its temp folder removed after."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    s = Soak(soak_args(hosted=False), base=tmp_path)
    d = tmp_path / "job1"
    job = Job(1, "chaos-1-1", os.urandom(8).hex(), d, d / "logs", d / "job.yaml", ["n0", "n1", "n2"], "")
    job.out.mkdir(parents=True)
    s.state.jobs.append(job)
    s.state.job = job
    return s


def marker(job: Job, node: str, pid: int, ticks: int, *, rank: int = 0, attempt: int = 0, size: int = 2,
           master: str = "127.0.0.1:1001", run_dir: str = "") -> None:
    """A worker's start marker, as bench/workers/chaos_train.py writes it."""
    (job.out / f"start-{node}-{pid}-{ticks}.json").write_text(json.dumps(
        {"node": node, "pid": pid, "start_ticks": ticks, "run_dir": run_dir or str(job.dir / "runs" / node),
         "attempt": attempt, "rank": rank, "local_rank": 0, "world_size": size, "host": "h", "master": master,
         "time": time.time()}))


def agent_with_worker(soak: Soak, procs: list[subprocess.Popen[str]]) -> tuple[Agent, Proc]:
    """An agent (a real process) whose worker (its child) runs and has written its start marker."""
    agent = agent_of(soak, procs, AGENT)
    assert agent.proc.stdout is not None
    worker = ident(int(agent.proc.stdout.readline()))
    assert worker is not None
    marker(soak.state.jobs[0], agent.node, worker.pid, worker.ticks)
    return agent, worker


def expectation(job: Job, invariant: str) -> Expect:
    """The job's one expectation of `invariant`."""
    found = [e for e in job.expects if e.invariant == invariant]
    assert len(found) == 1, [e.invariant for e in job.expects]
    return found[0]


def due(soak: Soak, e: Expect) -> Violation:
    """Check the job's expectations once `e`'s deadline passed: the Violation it raises."""
    e.deadline = time.monotonic() - 1
    with pytest.raises(Violation) as caught:
        soak.checks.check_expects(soak.state.jobs[0])
    return caught.value


def printed(soak: Soak) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        soak.print_table(None, "", soak.state.tally.failures())
    return out.getvalue()


# ---------------------------------------------------------------------------- a class ruled out by a setting


def test_a_class_the_options_rule_out_is_refused_when_named():
    """`bench/chaos.py --nodes 2 --classes late_join` ran a whole job with no fault; now it is refused at once,
    naming the option and the fix (exit code 2, argparse's)."""
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "chaos.py"), "--nodes", "2", "--classes", "late_join",
                           "--seed", "1", "--duration", "1"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert ("--classes late_join: the other options rule it out: it needs --nodes 3 or more (a late node of nodes "
            "2:K, K > 2); change them or leave late_join out") in done.stderr
    assert "chaos soak: seed" not in done.stdout  # refused before anything started


def test_a_class_the_options_rule_out_is_named_skipped_and_never_counted_as_fired(soak: Soak):
    soak.args.nodes = 2
    soak.select_classes()
    assert soak.state.tally.skipped() == {
        "late_join": "needs --nodes 3 or more (a late node of nodes 2:K, K > 2)",
        "partition": ("needs --nodes 3 or more (the cut-off node fences itself for good: nothing here requeues it, "
                      "and nodes 2:2 cannot go on without it)"),
    }
    for cls in CLASSES:
        soak.state.tally.drawn(cls)
        soak.state.tally.injected(cls)
    assert soak.state.tally.failures() == []
    out = printed(soak)
    row = next(line for line in out.splitlines() if line.startswith("| late_join"))
    assert [c.strip() for c in row.strip("|").split("|")] == [
        "late_join", "-", "-", "-", "-", "skipped: needs --nodes 3 or more (a late node of nodes 2:K, K > 2)"]
    assert "OK: every invariant held, every enabled class fired (seed 1); class late_join skipped, not fired" in out


# ---------------------------------------------------------------------------- stop_worker's pause


def test_a_paused_worker_must_go_on_after_its_sigcont(soak: Soak, procs):
    """The pause branch (SIGSTOP, SIGCONT 0.5-3 s later) brought no invariant: a pause that left the job stalled
    passed. From the SIGCONT the training must advance (a new checkpoint) or end, or the worker be gone."""
    job = soak.state.jobs[0]
    _, worker = agent_with_worker(soak, procs)
    assert soak.faults.inject(job, "stop_worker", [0.0, 0.0, 0.0, 0.0])  # u[1] < 0.5: a pause, of 0.5 s (u[2] = 0)
    assert [f.detail for f in job.faults] == ["SIGSTOP, SIGCONT in 0.5 s"]
    wait_for(lambda: state(worker.pid) == "T", WAIT_S, "the worker stopped")
    assert job.expects == []  # nothing before the SIGCONT
    (what, action), = [(w, a) for _, w, a in job.timed]
    assert what == f"SIGCONT {worker.pid}"
    action()  # its time come (the soak's loop runs it then)
    wait_for(lambda: state(worker.pid) not in ("T", ""), WAIT_S, "the worker continued")
    e = expectation(job, "pause_went_on")
    assert e.cls == "stop_worker"
    assert e.check() is False  # resumed, but the training did not go on (yet)
    v = due(soak, e)
    assert v.invariant == "pause_went_on"
    assert "the training neither advanced (no new checkpoint) nor finished" in v.detail
    (job.dir / "ckpt").mkdir()
    (job.dir / "ckpt" / "model.pt").write_bytes(b"step 5")  # rank 0's next checkpoint
    assert e.check() is True
    soak.checks.check_expects(job)
    count = soak.state.tally.per_invariant["pause_went_on"]
    assert (count.held, count.classes) == (1, {"stop_worker"})


def test_a_paused_worker_gone_before_its_sigcont_did_not_apply_and_says_why(soak: Soak, procs):
    job = soak.state.jobs[0]
    agent, worker = agent_with_worker(soak, procs)
    assert soak.faults.inject(job, "stop_worker", [0.0, 0.0, 0.0, 0.0])
    os.kill(worker.pid, signal.SIGKILL)
    assert agent.proc.stdin is not None
    agent.proc.stdin.write("reap\n")
    agent.proc.stdin.flush()
    wait_for(lambda: state(worker.pid) == "", WAIT_S, "the worker reaped")
    for _, _what, action in job.timed:
        action()
    assert job.expects == []
    count = soak.state.tally.per_invariant["pause_went_on"]
    assert (count.held, count.moot, count.classes) == (
        0, {"the paused worker was gone before its SIGCONT": 1}, {"stop_worker"})


# ---------------------------------------------------------------------------- kill_worker: a zombie is not gone


def killed_worker_a_zombie(soak: Soak, procs):
    """An agent whose worker kill_worker killed, the worker a zombie not yet counted gone; (agent, its
    nothing_survives expectation)."""
    job = soak.state.jobs[0]
    agent, worker = agent_with_worker(soak, procs)
    assert soak.faults.inject(job, "kill_worker", [0.0, 0.0, 0.0, 0.0])
    e = expectation(job, "nothing_survives")
    wait_for(lambda: state(worker.pid) == "Z", WAIT_S, "the worker a zombie")
    assert e.check() is False
    return agent, e


def test_a_killed_worker_its_agent_never_waits_for_breaks_nothing_survives(soak: Soak, procs):
    """A killed worker is a zombie until its parent, the agent, waits for it: nothing_survives held as soon as it was
    one, whatever the agent did. Now it holds once the agent reaped it."""
    agent, e = killed_worker_a_zombie(soak, procs)
    v = due(soak, e)
    assert v.invariant == "nothing_survives"
    assert "a zombie its parent has not waited for" in v.detail
    assert agent.proc.stdin is not None and agent.proc.stdout is not None
    agent.proc.stdin.write("reap\n")
    agent.proc.stdin.flush()
    assert agent.proc.stdout.readline().strip() == "reaped"
    assert e.check() is True


def test_a_killed_worker_whose_agent_is_gone_too_is_gone(soak: Soak, procs):
    """The agent ended without waiting for it: the zombie went to whoever adopts orphans (the soak, their subreaper,
    reaps it), so it counts as gone."""
    agent, e = killed_worker_a_zombie(soak, procs)
    agent.proc.kill()
    agent.proc.wait(10)
    wait_for(e.check, WAIT_S, "the killed worker counted gone")


# ---------------------------------------------------------------------------- kill_agent / signal_agent


def test_a_kill_or_a_stop_signal_to_an_agent_that_already_exited_is_not_injected(soak: Soak, procs):
    """Popen.send_signal does nothing to an agent that exited: the soak counted the kill (and its requeue) anyway."""
    job = soak.state.jobs[0]
    agent = agent_of(soak, procs, "pass")
    agent.started -= 60  # (signal_agent waits 10 s for a new agent's handlers)
    wait_for(lambda: state(agent.proc.pid) == "Z", WAIT_S, "the agent exited (a zombie: not yet reaped)")
    assert agent.code is None  # the soak's loop has not seen it yet: still a target
    assert soak.faults.inject(job, "kill_agent", [0.0, 0.0, 0.0, 0.0]) is False
    assert soak.faults.inject(job, "signal_agent", [0.0, 0.0, 0.0, 0.0]) is False
    assert (job.faults, agent.fate, job.timed, job.expects) == ([], "", [], [])
    assert soak.state.tally.per_class["kill_agent"].injected == soak.state.tally.per_class["signal_agent"].injected == 0


def test_lease_revoked_that_cannot_be_set_up_did_not_apply_and_says_why(soak: Soak, procs, tmp_path: Path):
    """A real etcd: a node with a lease is checked (and preferred: u[3] < 0.75); a node with no state key, and any
    node while etcd is down, count as "did not apply" with the reason (they were dropped silently)."""
    job = soak.state.jobs[0]
    etcd = ChaosEtcd(tmp_path / "etcd-data", None)
    etcd.start()
    try:
        soak.state.etcd = etcd
        job.endpoint = etcd.endpoint
        lease = etcd.etcdctl("lease", "grant", "60").stdout.split()[1]
        etcd.etcdctl("put", f"--lease={lease}", f"{PREFIX}/{job.name}/nodes/n1", "{}")
        for node in ("n0", "n1", "n2"):
            agent_of(soak, procs, "import time; time.sleep(60)", node)
        assert soak.faults.inject(job, "kill_agent", [0.0, 0.0, 0.0, 0.0])  # n1: its lease is checked
        assert soak.faults.inject(job, "kill_agent", [0.0, 0.0, 0.0, 0.0])  # n0: joined no round yet
        etcd.stop()  # (a fault holds it down)
        assert soak.faults.inject(job, "kill_agent", [0.0, 0.0, 0.0, 0.0])  # n2: etcd down
    finally:
        etcd.kill()
    assert [f.target for f in job.faults] == ["n1", "n0", "n2"]
    assert [(a.node, a.fate, a.proc.returncode) for a in job.agents] == [
        (n, "killed", -signal.SIGKILL) for n in ("n0", "n1", "n2")]
    assert soak.state.tally.per_class["kill_agent"].injected == 3
    e = expectation(job, "lease_revoked")
    assert e.cls == "kill_agent"
    count = soak.state.tally.per_invariant["lease_revoked"]
    assert (count.held, count.classes) == (0, {"kill_agent"})
    assert count.moot == {"the node had no live state key at the kill (it had not joined yet)": 1,
                          "etcd could not be read at the kill (stopped, frozen, restarting or wiped)": 1}


# ---------------------------------------------------------------------------- an etcd fault's invariants


def etcd_job(soak: Soak, worlds: list[list[tuple[str, int, int, int]]], trained: bool = True,
             cls: str = "etcd_wipe") -> Job:
    """The soak's job after a fault of `cls`: its workers' markers, world by world as (node, rank, attempt, size); a
    done marker when `trained`."""
    job = soak.state.jobs[0]
    job.faults.append(Fault(cls, 1, 1.0, time.time(), "etcd", "a fault"))
    pid = 1000
    for w, world in enumerate(worlds):
        for node, rank, attempt, size in world:
            pid += 1
            marker(job, node, pid, 1, rank=rank, attempt=attempt, size=size, master=f"127.0.0.1:{2000 + w}")
    if trained:
        (job.out / "done-n0-1001-1.json").write_text(json.dumps({"node": "n0", "pid": 1001}))
    return job


@pytest.mark.parametrize("cls", ["etcd_stop", "etcd_restart", "etcd_wipe", "partition"])
def test_an_etcd_fault_or_a_partition_brings_one_world_and_job_completes(soak: Soak, cls: str):
    """Two worlds (2 nodes, then 3 after the fault), each rank held once: both hold, brought by the fault's class.
    The real end of a job's checks (check_job_end: --hosted, so no etcd to read; nothing of the job runs)."""
    soak.args.hosted = True
    job = etcd_job(soak, [[("n0", 0, 0, 2), ("n1", 1, 0, 2)], [("n0", 0, 1, 3), ("n1", 1, 1, 3), ("n2", 2, 0, 3)]],
                   cls=cls)
    job.endpoint = "127.0.0.1:1"  # (its port listens to nothing: the hosted etcd ended with the job)
    soak.checks.check_job_end(job)
    worlds, ended = soak.state.tally.per_invariant["one_world"], soak.state.tally.per_invariant["job_completes"]
    assert (worlds.held, worlds.classes) == (2, {cls})
    assert (ended.held, ended.classes) == (1, {cls})


@pytest.mark.parametrize(("world", "why"), [
    ([("n0", 0, 1, 3), ("n1", 1, 1, 3), ("n2", 1, 0, 3)], "rank twice"),
    ([("n0", 0, 1, 3), ("n1", 1, 1, 2)], "two world sizes"),
    ([("n0", 0, 1, 2), ("n1", 2, 1, 2)], "a rank beyond the size"),
])
def test_a_world_with_a_rank_twice_or_two_sizes_breaks_one_world(soak: Soak, world, why):
    job = etcd_job(soak, [[("n0", 0, 0, 2), ("n1", 1, 0, 2)], world])
    with pytest.raises(Violation) as caught:
        soak.checks.check_job_result(job)
    assert caught.value.invariant == "one_world", why
    assert "127.0.0.1:2001 was not one world of distinct ranks" in caught.value.detail
    assert soak.state.tally.per_invariant["one_world"].classes == {"etcd_wipe"}


def test_a_job_an_etcd_fault_left_unfinished_breaks_job_completes(soak: Soak):
    job = etcd_job(soak, [[("n0", 0, 0, 2), ("n1", 1, 0, 2)]], trained=False)
    with pytest.raises(Violation) as caught:
        soak.checks.check_job_result(job)
    assert caught.value.invariant == "job_completes"
    assert soak.state.tally.per_invariant["job_completes"].classes == {"etcd_wipe"}


def test_a_master_port_handed_out_again_did_not_apply_and_says_why(soak: Soak):
    """n0's run in one world at two attempts: two rounds got the same port from the kernel; they cannot be told
    apart, so the check does not apply (it would find rank 0 twice)."""
    job = etcd_job(soak, [[("n0", 0, 0, 2), ("n1", 1, 0, 2), ("n0", 0, 2, 2), ("n1", 1, 2, 2)]])
    soak.checks.check_job_result(job)
    count = soak.state.tally.per_invariant["one_world"]
    assert (count.held, count.moot) == (0, {"a MASTER_PORT the kernel handed out again to a later round": 1})


AGENT_WITH_ETCD = """
import subprocess, sys
etcd, data, client, peer = sys.argv[1:5]
p = subprocess.Popen([etcd, "--data-dir", data, "--listen-client-urls", client, "--advertise-client-urls", client,
                      "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                      "--initial-cluster", "default=" + peer], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(p.pid, flush=True)
sys.stdin.read()
p.kill()
p.wait()
"""


def test_the_hosted_etcd_is_the_one_serving_the_jobs_port_not_any_etcd_of_the_agent(soak: Soak, procs, tmp_path):
    """An agent's etcd on another port (the auth bootstrap's loopback one, or one that lost the port to another
    agent) is not the job's rendezvous: a fault on it expected an etcd back that rightly never came (CI, seed
    970833). Only the etcd listening on the job's endpoint port is the hosted one."""
    from runner.rendezvous.etcd.hosted_server import etcd_binary
    from runner.rendezvous.ports import free_port
    from runner.system.served import listens

    port = free_port("127.0.0.1")
    peer = free_port("127.0.0.1", avoid=(port,))
    job = soak.state.jobs[0]
    proc = subprocess.Popen([sys.executable, "-c", AGENT_WITH_ETCD, etcd_binary(), str(tmp_path / "etcd-data"),
                             f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer}"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    procs.append(proc)
    me = ident(proc.pid)
    assert me is not None and proc.stdout is not None
    agent = Agent("n0", 0, proc, me, job.dir / "n0.log", time.time())
    etcd = int(proc.stdout.readline())
    etcd_fd = os.pidfd_open(etcd)  # the agent's unreaped child: this pid is that etcd's
    try:
        wait_for(lambda: listens(etcd, port), timeout=30, what="the agent's etcd listening")
        job.endpoint = f"127.0.0.1:{free_port('127.0.0.1', avoid=(port, peer))}"
        assert soak.procs.hosted_etcd(agent) is None  # an etcd of the agent, not on the job's port
        job.endpoint = f"127.0.0.1:{port}"
        found = soak.procs.hosted_etcd(agent)
        assert found is not None and found.pid == etcd
    finally:  # the agent kills and reaps its etcd once its stdin closes; SIGKILLed (the procs fixture), it could not
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(30)
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(etcd_fd, signal.SIGKILL)
        os.close(etcd_fd)
