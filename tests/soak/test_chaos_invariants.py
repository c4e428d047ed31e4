"""Every invariant of the chaos soak seen failing (issue 39, point 2), and a registry that keeps it so.

Each invariant bench/soak/invariants.py declares gets a test here (or in tests/soak/test_chaos_checks.py,
test_chaos_verdict.py, test_soak_own_etcd.py, test_soak_hosts.py: SEEN_FAILING names it) that feeds the soak's own
check a run that violates it and sees the `Violation` with that invariant's name, and that the same check holds on a
run that keeps it. The run is what a real one leaves: report.json, transitions.jsonl, the workers' markers and step
lines, an agent's console, written to the test's folder; where a check looks at processes or ports, real processes
(an agent that ignores SIGTERM, a guard or a lighthouse not replaced, a process that outlives its job) and real
sockets, and a real etcd where it reads leases.

The registry test collects every invariant name the soak's code can raise or count (the names passed to
`Violation`, to an expectation, to the tally, JOB_END_BRINGS and MOOT_WHY) and fails when one is not declared in
bench/soak/invariants.py, or when a declared one has no test in SEEN_FAILING that names it, as tests/house/test_layers.py
does for layers. Fast (a few seconds): no runner agent, no torch.
"""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import ROOT, wait_for
from soak_helpers import agent_of, soak_args

from bench.soak import checks as checks_module
from bench.soak import hosts as hosts_module
from bench.soak.bounds import JOB_END_BRINGS, PREFIX
from bench.soak.hosts import HostSoak, Seen
from bench.soak.infra import ChaosEtcd, HostEtcd
from bench.soak.invariants import INVARIANTS
from bench.soak.model import Agent, Expect, Job, Violation
from bench.soak.procs import Proc, ident
from bench.soak.replicas import Down, ReplicaSoak
from bench.soak.soak import Soak
from bench.soak.verdict import MOOT_WHY
from runner.rendezvous.ports import free_port

WAIT_S = 10.0
SOAK = ROOT / "bench" / "soak"
TESTS = ROOT / "tests"

# invariant -> the tests that feed it a violating run and see it break (tests/FILE.py::FUNCTION)
SEEN_FAILING: dict[str, list[str]] = {
    "no_internal_error": ["test_chaos_invariants.py::test_an_agent_end_check_breaks_on_a_run_that_violates_it"],
    "report_written": ["test_chaos_invariants.py::test_an_agent_end_check_breaks_on_a_run_that_violates_it"],
    "outcome_matches_workers": ["test_chaos_invariants.py::test_an_agent_end_check_breaks_on_a_run_that_violates_it",
                                "test_chaos_invariants.py::test_a_replica_agent_end_check_breaks_on_a_run_that_violates_it"],
    "attempts_recorded": ["test_chaos_invariants.py::test_an_agent_end_check_breaks_on_a_run_that_violates_it",
                          "test_chaos_invariants.py::test_a_replica_agent_end_check_breaks_on_a_run_that_violates_it"],
    "stop_honoured": ["test_chaos_invariants.py::test_an_agent_end_check_breaks_on_a_run_that_violates_it",
                      "test_chaos_invariants.py::test_a_replica_agent_end_check_breaks_on_a_run_that_violates_it",
                      "test_chaos_invariants.py::test_an_agent_that_ignores_its_stop_signal_breaks_stop_honoured",
                      "test_chaos_invariants.py::test_nodes_running_on_after_the_hosting_node_stopped_break_stop_honoured"],
    "nothing_survives": ["test_chaos_checks.py::test_a_killed_worker_its_agent_never_waits_for_breaks_nothing_survives",
                         "test_chaos_invariants.py::test_a_process_that_outlives_its_job_breaks_nothing_survives",
                         "test_chaos_invariants.py::test_a_lighthouse_or_its_port_left_after_the_job_breaks_nothing_survives",
                         "test_chaos_invariants.py::test_a_hosted_etcd_port_still_listening_after_the_job_breaks_nothing_survives",
                         "test_chaos_invariants.py::test_a_killed_agents_process_left_running_breaks_nothing_survives"],
    "job_completes": ["test_chaos_checks.py::test_a_job_an_etcd_fault_left_unfinished_breaks_job_completes",
                      "test_chaos_invariants.py::test_a_node_left_alone_that_failed_in_a_completed_job_breaks_job_completes"],
    "one_world": ["test_chaos_checks.py::test_a_world_with_a_rank_twice_or_two_sizes_breaks_one_world"],
    "pause_went_on": ["test_chaos_checks.py::test_a_paused_worker_must_go_on_after_its_sigcont"],
    "hang_detected": ["test_chaos_invariants.py::test_a_worker_left_stopped_that_nothing_kills_breaks_hang_detected"],
    "guard_replaced": ["test_chaos_invariants.py::test_a_killed_guard_not_replaced_breaks_guard_replaced"],
    "lease_revoked": ["test_chaos_invariants.py::test_a_killed_agents_lease_still_granted_breaks_lease_revoked"],
    "etcd_restarted": ["test_chaos_invariants.py::test_a_hosted_etcd_not_started_again_breaks_etcd_restarted"],
    "etcd_keys_expire": ["test_chaos_invariants.py::test_a_key_left_on_a_live_lease_breaks_etcd_keys_expire"],
    "etcd_unharmed": ["test_soak_own_etcd.py::test_a_signal_no_fault_sent_to_the_soaks_etcd_is_a_violation_with_its_log",
                      "test_chaos_invariants.py::test_an_etcd_member_killed_by_a_signal_no_fault_sent_breaks_etcd_unharmed"],
    "late_join_admitted": ["test_chaos_invariants.py::test_a_late_node_never_running_breaks_late_join_admitted"],
    "no_rank_twice": ["test_chaos_invariants.py::test_workers_of_two_worlds_alive_at_once_break_no_rank_twice"],
    "lease_expired": ["test_chaos_invariants.py::test_a_lost_hosts_lease_still_granted_breaks_lease_expired"],
    "fenced": ["test_soak_hosts.py::test_a_cut_node_that_ended_without_fencing_breaks_fenced"],
    "member_loss_survived": [
        "test_chaos_invariants.py::test_a_job_a_member_loss_ended_while_the_others_kept_a_quorum_breaks_member_loss_survived"],
    "no_etcd_left": ["test_chaos_invariants.py::test_an_etcd_or_its_data_left_on_a_host_breaks_no_etcd_left"],
    "group_restarts_reported": [
        "test_chaos_invariants.py::test_a_replica_agent_end_check_breaks_on_a_run_that_violates_it"],
    "lighthouse_restarted": ["test_chaos_invariants.py::test_a_replica_agent_end_check_breaks_on_a_run_that_violates_it",
                             "test_chaos_invariants.py::test_a_killed_lighthouse_not_started_again_breaks_lighthouse_restarted"],
    "lighthouse_up": ["test_chaos_invariants.py::test_an_agent_long_without_a_lighthouse_breaks_lighthouse_up"],
    "survivor_advanced": ["test_chaos_verdict.py::test_a_survivor_that_waits_for_the_dead_group_breaks_survivor_advanced"],
}


# ---------------------------------------------------------------------------------------- helpers


def new_job(soak: Soak, tmp_path: Path, nodes: tuple[str, ...] = ("n0", "n1", "n2"), name: str = "chaos-1-1") -> Job:
    """The soak's first job, its folders made."""
    d = tmp_path / "job1"
    job = Job(1, name, os.urandom(8).hex(), d, d / "logs", d / "job.yaml", list(nodes), "")
    for sub in (job.out, job.tmp, job.state, d / "ckpt"):
        sub.mkdir(parents=True, exist_ok=True)
    soak.state.jobs.append(job)
    soak.state.job = job
    return job


@pytest.fixture
def soak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Soak:
    """A soak (external etcd: none yet) and its first job."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    s = Soak(soak_args(hosted=False), base=tmp_path)
    new_job(s, tmp_path)
    return s


@pytest.fixture
def rsoak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ReplicaSoak:
    """A replica-group soak (5 steps) and its first job (one node)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    s = ReplicaSoak(soak_args(replica_groups=True, hosted=False, steps=5), base=tmp_path)
    new_job(s, tmp_path, ("n0",), "chaos-rg-1-1")
    s.world.add_job(1)
    return s


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[ChaosEtcd]:
    """A real etcd (the soak's own kind), killed after the test."""
    e = ChaosEtcd(tmp_path / "etcd-data", None)
    e.start()
    yield e
    e.kill()


def live_agent(soak: Soak, procs: list[subprocess.Popen[str]], code: str, node: str = "n0") -> Agent:
    """A real process as a running agent of the soak's job (stdin and stdout pipes, the job's token, its output a
    file); it has run a minute already (signal_agent waits 10 s for a new agent's handlers)."""
    agent = agent_of(soak, procs, code, node, ran_s=60)
    agent.out.touch()
    return agent


def say(agent: Agent, line: str) -> str:
    """Tell the agent process `line`; its answer."""
    assert agent.proc.stdin is not None and agent.proc.stdout is not None
    agent.proc.stdin.write(line + "\n")
    agent.proc.stdin.flush()
    return str(agent.proc.stdout.readline().strip())


def ended_agent(job: Job, code: int, node: str = "n0", *, signalled: bool = False) -> Agent:
    """A real process that exited with `code` (or died of SIGKILL it sent itself), as an agent the soak saw end."""
    body = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)" if signalled else f"raise SystemExit({code})"
    proc = subprocess.Popen([sys.executable, "-c", body])
    me = ident(proc.pid) or Proc(proc.pid, 0)
    proc.wait(10)
    agent = Agent(node, 0, proc, me, job.dir / f"{node}.log", time.time() - 30, code=proc.returncode,
                  ended=time.time())
    agent.out.write_text("runner: job started\n")
    agent.run_dir = job.dir / "runs" / node
    agent.run_dir.mkdir(parents=True, exist_ok=True)
    job.agents.append(agent)
    return agent


def jsonl_file(path: Path, lines: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def expectation(job: Job, invariant: str) -> Expect:
    """The job's one expectation of `invariant`."""
    found = [e for e in job.expects if e.invariant == invariant]
    assert len(found) == 1, [e.invariant for e in job.expects]
    return found[0]


def due(soak: Soak, job: Job, e: Expect) -> Violation:
    """Check the job's expectations once `e`'s deadline passed: the Violation it raises, counted as the soak's loop
    counts it."""
    e.deadline = time.monotonic() - 1
    with pytest.raises(Violation) as caught:
        soak.checks.check_expects(job)
    soak.state.tally.broke(caught.value.invariant)
    return caught.value


def broke(soak: Soak, name: str) -> int:
    return soak.state.tally.per_invariant[name].broke if name in soak.state.tally.per_invariant else 0


def held(soak: Soak, name: str) -> int:
    return soak.state.tally.per_invariant[name].held if name in soak.state.tally.per_invariant else 0


def raises(soak: Soak, check: Callable[[], object]) -> Violation:
    """`check()` raises a Violation: it, counted as broken as the soak's loop counts it."""
    with pytest.raises(Violation) as caught:
        check()
    soak.state.tally.broke(caught.value.invariant)
    return caught.value


# ---------------------------------------------------------------------------------------- an agent's end (base)


def base_run(job: Job, a: Agent, outcome: str, attempts: int = 2, done: bool = True) -> None:
    """What a node's run leaves: report.json, transitions.jsonl (each attempt, the last line its end), its workers'
    start markers (one per attempt) and, when `done`, the last one's done marker."""
    rd = a.run_dir
    assert rd is not None
    (rd / "report.json").write_text(json.dumps({"outcome": outcome, "exit_code": a.code, "attempts": attempts,
                                                "restarts": attempts - 1, "warnings": []}))
    lines = [{"attempt": n, "src": "RENDEZVOUS", "dst": "RUNNING", "time": time.time()} for n in range(attempts)]
    lines.append({"attempt": attempts - 1, "src": "RUNNING", "dst": "SHUTDOWN", "outcome": outcome, "time": time.time()})
    jsonl_file(rd / "transitions.jsonl", lines)
    for n in range(attempts):
        pid = 4000 + n
        (job.out / f"start-{a.node}-{pid}-1.json").write_text(json.dumps(
            {"node": a.node, "pid": pid, "start_ticks": 1, "run_dir": str(rd), "attempt": n, "rank": 0,
             "local_rank": 0, "world_size": 1, "host": "h", "master": f"127.0.0.1:{3000 + n}", "time": time.time()}))
    if done:
        (job.out / f"done-{a.node}-{4000 + attempts - 1}-1.json").write_text(json.dumps(
            {"node": a.node, "pid": 4000 + attempts - 1, "run_dir": str(rd), "time": time.time() - 20}))


def edit_json(path: Path, **over: object) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **over}))


def break_transitions(keep: Callable[[dict[str, Any]], bool], extra: str = "") -> Callable[[Job, Agent], None]:
    def apply(_job: Job, a: Agent) -> None:
        assert a.run_dir is not None
        path = a.run_dir / "transitions.jsonl"
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        path.write_text("".join(json.dumps(x) + "\n" for x in lines if keep(x)) + extra)
    return apply


def drop_done(job: Job, _a: Agent) -> None:
    for p in job.out.glob("done-*.json"):
        p.unlink()


# (invariant, exit code, outcome, what breaks the run, a word of the detail)
AGENT_END_CASES = [
    ("no_internal_error", 1, "failed",
     lambda _j, a: a.out.write_text("runner: internal error: KeyError 'x' (please report it)\n"), "internal error"),
    ("report_written", -9, "", None, "died of signal 9"),
    ("report_written", 0, "succeeded", lambda _j, a: (a.run_dir / "report.json").unlink(), "wrote no report.json"),
    ("report_written", 0, "succeeded", lambda _j, a: (a.run_dir / "report.json").write_text("{"), "unreadable"),
    ("outcome_matches_workers", 0, "succeeded", lambda _j, a: edit_json(a.run_dir / "report.json", exit_code=1),
     "not the process's"),
    ("outcome_matches_workers", 0, "failed", None, "succeeded iff exit code 0"),
    ("outcome_matches_workers", 0, "succeeded", drop_done, "did not all finish"),
    ("outcome_matches_workers", 1, "failed", None, "yet the outcome is failed"),
    ("stop_honoured", 1, "failed", lambda j, a: (setattr(a, "fate", "SIGTERM"), drop_done(j, a)),
     "SIGTERM must end it with outcome stopped and exit code 143"),
    ("attempts_recorded", 0, "succeeded", break_transitions(lambda _x: True, '{"attempt": 1, "dst"\n'),
     "1 torn line(s)"),
    ("attempts_recorded", 0, "succeeded", break_transitions(lambda x: x["attempt"] != 0), "attempt(s) [0] not in"),
    ("attempts_recorded", 0, "succeeded", break_transitions(lambda x: x["dst"] != "SHUTDOWN"), "is not the report's end"),
]


@pytest.mark.parametrize(("invariant", "code", "outcome", "breaks", "word"), AGENT_END_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(AGENT_END_CASES)])
def test_an_agent_end_check_breaks_on_a_run_that_violates_it(soak: Soak, invariant, code, outcome, breaks, word):
    """check_agent_end, as the soak's loop calls it when an agent exits, on what a real node's run leaves."""
    job = soak.state.jobs[0]
    a = ended_agent(job, code, signalled=code < 0)
    if outcome:
        base_run(job, a, outcome)
    if breaks is not None:
        a.fate_at = time.time()
        breaks(job, a)
    v = raises(soak, lambda: soak.checks.check_agent_end(job, a))
    assert v.invariant == invariant
    assert word in v.detail, v.detail
    assert broke(soak, invariant) == 1


@pytest.mark.parametrize(("code", "outcome", "fate"), [(0, "succeeded", ""), (143, "stopped", "SIGTERM"),
                                                       (1, "failed", "")])
def test_the_agent_end_checks_hold_on_a_run_that_keeps_them(soak: Soak, code: int, outcome: str, fate: str):
    """The same run, unbroken: a success; a stop honoured; a failure whose workers did not finish (or its agent
    SIGKILLed by the soak: the report's checks do not apply, and say why)."""
    job = soak.state.jobs[0]
    a = ended_agent(job, code)
    base_run(job, a, outcome, done=outcome == "succeeded")
    a.fate, a.fate_at = fate, time.time()
    soak.checks.check_agent_end(job, a)
    for name in ("no_internal_error", "report_written", "outcome_matches_workers", "attempts_recorded"):
        assert (held(soak, name), broke(soak, name)) == (1, 0), name
    killed = ended_agent(job, -9, "n1", signalled=True)
    killed.fate = "killed"
    soak.checks.check_agent_end(job, killed)
    assert soak.state.tally.per_invariant["report_written"].moot == {"the agent was SIGKILLed by the soak": 1}


# ---------------------------------------------------------------------------------------- stop_honoured, on a signal

IGNORES_SIGTERM = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
                   "time.sleep(120)")


def test_an_agent_that_ignores_its_stop_signal_breaks_stop_honoured(soak: Soak, procs):
    """signal_agent's SIGTERM to an agent that never exits: at the bound, stop_honoured breaks; one that exits
    holds."""
    job = soak.state.jobs[0]
    agent = live_agent(soak, procs, IGNORES_SIGTERM)
    assert agent.proc.stdout is not None and agent.proc.stdout.readline().strip() == "ready"
    assert soak.faults.inject(job, "signal_agent", [0.0, 0.0, 0.0, 0.0])  # u[1] = 0: SIGTERM
    assert agent.fate == "SIGTERM"
    e = expectation(job, "stop_honoured")
    assert e.cls == "signal_agent"
    time.sleep(0.2)
    assert agent.proc.poll() is None  # it ignored the signal
    v = due(soak, job, e)
    assert v.invariant == "stop_honoured" and "still runs" in v.detail
    agent.proc.kill()
    agent.code = agent.proc.wait(10)
    soak.checks.check_expects(job)
    assert (held(soak, "stop_honoured"), broke(soak, "stop_honoured")) == (1, 1)


# ---------------------------------------------------------------------------------------- hang_detected

# An agent: starts one worker (its child; SIGKILLed when the agent ends) that writes its start marker, and prints its
# pid; on "kill" it SIGKILLs the worker and reaps it.
AGENT_WITH_WORKER = """
import ctypes, os, signal, subprocess, sys
worker = subprocess.Popen([sys.executable, "-c",
    "import ctypes, time; ctypes.CDLL(None).prctl(1, 9, 0, 0, 0); print('ready', flush=True); time.sleep(120)"],
    stdout=subprocess.PIPE, text=True)
worker.stdout.readline()
print(worker.pid, flush=True)
for line in sys.stdin:
    if line.strip() == "kill":
        worker.kill()
        worker.wait()
        print("killed", flush=True)
"""


def test_a_worker_left_stopped_that_nothing_kills_breaks_hang_detected(soak: Soak, procs):
    """stop_worker's hang (SIGSTOP, never SIGCONT): the worker must be gone within its bound; one that still exists
    breaks hang_detected, and the heartbeat's kill (here the agent's) makes it hold."""
    job = soak.state.jobs[0]
    agent = live_agent(soak, procs, AGENT_WITH_WORKER)
    assert agent.proc.stdout is not None
    worker = ident(int(agent.proc.stdout.readline()))
    assert worker is not None
    (job.out / f"start-n0-{worker.pid}-{worker.ticks}.json").write_text(json.dumps(
        {"node": "n0", "pid": worker.pid, "start_ticks": worker.ticks, "run_dir": str(agent.run_dir), "attempt": 0,
         "rank": 0, "world_size": 1, "master": "127.0.0.1:1", "time": time.time()}))
    assert soak.faults.inject(job, "stop_worker", [0.0, 0.9, 0.0, 0.0])  # u[1] >= 0.5: left stopped
    assert [f.detail for f in job.faults] == ["SIGSTOP, left stopped (heartbeat_timeout 8 s)"]
    e = expectation(job, "hang_detected")
    assert e.check() is False
    v = due(soak, job, e)
    assert v.invariant == "hang_detected" and "the stopped worker still exists" in v.detail
    assert say(agent, "kill") == "killed"
    assert e.check() is True
    soak.checks.check_expects(job)
    assert held(soak, "hang_detected") == 1


# ---------------------------------------------------------------------------------------- guard_replaced

# An agent with one guard (a child whose command line names runner.system.shepherd_main, as the agent's guards'
# does); on "again", it reaps the old guard and starts another.
def agent_with_child(start: str) -> str:
    """An agent's script with one child (`start`: the Popen that starts it), its pid printed; on each line of stdin
    it reaps the child and starts another."""
    return f"""
import subprocess, sys
def child():
    return {start}
c = child()
print(c.pid, flush=True)
for line in sys.stdin:
    c.wait()
    c = child()
    print(c.pid, flush=True)
"""


AGENT_WITH_GUARD = agent_with_child(
    'subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "runner.system.shepherd_main"])')


def test_a_killed_guard_not_replaced_breaks_guard_replaced(soak: Soak, procs):
    job = soak.state.jobs[0]
    agent = live_agent(soak, procs, AGENT_WITH_GUARD)
    assert agent.proc.stdout is not None
    first = int(agent.proc.stdout.readline())
    wait_for(lambda: soak.procs.guards(agent), WAIT_S, "the guard's command line read")
    assert soak.faults.inject(job, "kill_guard", [0.0, 0.0, 0.0, 0.0])
    assert [f.detail for f in job.faults] == [f"SIGKILL guard pid {first} (the agent had 1)"]
    e = expectation(job, "guard_replaced")
    v = due(soak, job, e)
    assert v.invariant == "guard_replaced" and "had 1 before the kill" in v.detail
    second = int(say(agent, "again"))
    wait_for(lambda: [g.pid for g in soak.procs.guards(agent)] == [second], WAIT_S, "the new guard seen")
    assert e.check() is True


# ---------------------------------------------------------------------------------------- lease_revoked


def test_a_killed_agents_lease_still_granted_breaks_lease_revoked(soak: Soak, procs, etcd: ChaosEtcd):
    """kill_agent on a node with a live state key (a real etcd): no guard revokes its lease here, so at the bound
    lease_revoked breaks; once the lease is revoked it holds."""
    job = soak.state.jobs[0]
    soak.state.etcd = etcd
    job.endpoint = etcd.endpoint
    lease = etcd.etcdctl("lease", "grant", "60").stdout.split()[1]
    etcd.etcdctl("put", f"--lease={lease}", f"{PREFIX}/{job.name}/nodes/n0", "{}")
    live_agent(soak, procs, "import time; time.sleep(120)")
    assert soak.faults.inject(job, "kill_agent", [0.0, 0.0, 0.0, 0.0])
    e = expectation(job, "lease_revoked")
    assert e.check() is False
    v = due(soak, job, e)
    assert v.invariant == "lease_revoked" and f"lease {int(lease, 16):x} is still granted" in v.detail
    etcd.etcdctl("lease", "revoke", lease)
    assert e.check() is True


# ---------------------------------------------------------------------------------------- etcd_restarted

# A hosting agent: its etcd is a child whose program name is etcd, listening on the job's port (as the soak proves a
# hosted etcd: bench/soak/processes.py); on "again" it reaps it and starts another.
AGENT_HOSTING = """
import subprocess, sys
LISTEN = ("import os, socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
          "s.bind(('127.0.0.1', PORT)); s.listen(); print(flush=True); parent = os.getppid()\\n"
          "while os.getppid() == parent: time.sleep(0.2)")  # ends with its agent (SIGKILLed by the procs fixture)
def etcd():
    e = subprocess.Popen(["etcd", "-c", LISTEN], executable=sys.executable, stdout=subprocess.PIPE, text=True)
    e.stdout.readline()  # listening
    return e
e = etcd()
print(e.pid, flush=True)
for line in sys.stdin:
    e.wait()
    e = etcd()
    print(e.pid, flush=True)
"""


def hosting(soak: Soak, procs: list[subprocess.Popen[str]], node: str = "n0") -> Agent:
    """A live agent hosting the job's etcd (AGENT_HOSTING) on a free port, the job's endpoint."""
    port = free_port("127.0.0.1")
    soak.state.jobs[0].endpoint = f"127.0.0.1:{port}"
    return live_agent(soak, procs, AGENT_HOSTING.replace("PORT", str(port)), node)


def test_a_hosted_etcd_not_started_again_breaks_etcd_restarted(soak: Soak, procs):
    soak.args.hosted = True
    job = soak.state.jobs[0]
    agent = hosting(soak, procs)
    assert agent.proc.stdout is not None
    first = int(agent.proc.stdout.readline())
    wait_for(lambda: soak.procs.host(job) is agent, WAIT_S, "the hosted etcd seen")
    assert soak.faults.inject(job, "etcd_restart", [0.0, 0.0, 0.0, 0.0])
    assert [f.detail for f in job.faults] == [f"SIGKILL pid {first} (its agent restarts it)"]
    e = expectation(job, "etcd_restarted")
    v = due(soak, job, e)
    assert v.invariant == "etcd_restarted" and "did not start its etcd again" in v.detail
    second = int(say(agent, "again"))
    wait_for(lambda: (h := soak.procs.hosted_etcd(agent)) is not None and h.pid == second, WAIT_S, "the new etcd seen")
    assert e.check() is True


def test_a_killed_hosted_etcd_whose_port_another_agent_of_the_machine_took_does_not_apply(soak: Soak, procs):
    """Two agents of one machine: n0's etcd is killed, n1's takes the job's port meanwhile, and n0 rightly joins it
    instead of starting its own (CI, seed 512665): etcd_restarted does not apply (moot), it is not broken."""
    soak.args.hosted = True
    job = soak.state.jobs[0]
    agent = hosting(soak, procs)
    assert agent.proc.stdout is not None
    agent.proc.stdout.readline()
    wait_for(lambda: soak.procs.host(job) is agent, WAIT_S, "the hosted etcd seen")
    assert soak.faults.inject(job, "etcd_restart", [0.0, 0.0, 0.0, 0.0])
    e = expectation(job, "etcd_restarted")
    port = job.endpoint.rpartition(":")[2]
    wait_for(lambda: soak.procs.hosted_etcd(agent) is None, WAIT_S, "n0's etcd gone")
    other = live_agent(soak, procs, AGENT_HOSTING.replace("PORT", port), "n1")
    assert other.proc.stdout is not None
    other.proc.stdout.readline()
    wait_for(lambda: soak.procs.host(job) is other, WAIT_S, "n1's etcd on the job's port")
    assert e.check() is None


# ---------------------------------------------------------------------------------------- etcd_keys_expire


def test_a_key_left_on_a_live_lease_breaks_etcd_keys_expire(soak: Soak, etcd: ChaosEtcd, monkeypatch):
    """lease_ttl after the job's last agent ended, a key of the job still on a live lease breaks it (and an etcd
    that cannot be read); the job's record (no lease) and a final state on its hour-long lease do not."""
    monkeypatch.setattr(checks_module, "LEASE_TTL_S", -60.0)  # (the wait for the leases to lapse: none here)
    job = soak.state.jobs[0]
    v = raises(soak, lambda: soak.checks.check_keys(job))  # no etcd to read
    assert v.invariant == "etcd_keys_expire" and "cannot read the job's keys" in v.detail
    soak.state.etcd = etcd
    job.endpoint = etcd.endpoint
    etcd.etcdctl("put", f"{PREFIX}/{job.name}/spec", "{}")
    final = etcd.etcdctl("lease", "grant", "3000").stdout.split()[1]
    etcd.etcdctl("put", f"--lease={final}", f"{PREFIX}/{job.name}/final/n0", "{}")
    soak.checks.check_keys(job)  # holds
    lease = etcd.etcdctl("lease", "grant", "60").stdout.split()[1]
    etcd.etcdctl("put", f"--lease={lease}", f"{PREFIX}/{job.name}/nodes/n1", "{}")
    v = raises(soak, lambda: soak.checks.check_keys(job))
    assert v.invariant == "etcd_keys_expire"
    assert f"{PREFIX}/{job.name}/nodes/n1 is still on lease {int(lease, 16):x}" in v.detail
    assert broke(soak, "etcd_keys_expire") == 2


# ---------------------------------------------------------------------------------------- late_join_admitted


def test_a_late_node_never_running_breaks_late_join_admitted(soak: Soak, procs, monkeypatch):
    """The late node (owed: late_join never fired yet) starts 3-18 s after the others and must get to RUNNING."""
    job = soak.state.jobs[0]

    def start_agent(job: Job, node: str) -> Agent:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], text=True)
        procs.append(proc)
        agent = Agent(node, 0, proc, ident(proc.pid) or Proc(proc.pid, 0), job.dir / f"{node}.log", time.time())
        agent.out.write_text("runner: job started\n")
        job.agents.append(agent)
        return agent

    monkeypatch.setattr(soak.procs, "start_agent", start_agent)
    soak.start_nodes(job, 30.0)
    assert len(job.agents) == 2
    (at, what, join), = job.timed
    assert what == "late join"
    join()
    late = job.agents[-1]
    e = expectation(job, "late_join_admitted")
    assert e.cls == "late_join"
    assert late not in soak.faults.targets(job)  # no fault makes its admission moot while it is judged (CI: a
    assert len(soak.faults.targets(job)) == 2  # kill_agent on the late node left late_join_admitted held 0 times)
    v = due(soak, job, e)
    assert v.invariant == "late_join_admitted" and f"the late node {late.node} did not get to RUNNING" in v.detail
    with late.out.open("a") as f:
        f.write(json.dumps({"event": "transition", "src": "RENDEZVOUS", "dst": "RUNNING", "time": time.time()}) + "\n")
    assert e.check() is True
    assert late in soak.faults.targets(job)  # admitted: a target like any other


# ---------------------------------------------------------------------------------------- nothing_survives, job_completes


def test_a_process_that_outlives_its_job_breaks_nothing_survives(soak: Soak, procs, monkeypatch):
    """A process carrying the job's mark (its token) still runs after every agent ended: nothing_survives breaks at
    the bound (shortened here); gone, it holds."""
    monkeypatch.setattr(checks_module, "GONE_BOUND_S", 0.5)
    job = soak.state.jobs[0]
    left = subprocess.Popen(["sleep", "120"], env={**os.environ, "CHAOS_TOKEN": job.token})
    procs.append(left)  # type: ignore[arg-type]
    v = raises(soak, lambda: soak.checks.wait_nothing_survives(job))
    assert v.invariant == "nothing_survives" and f"pid {left.pid}" in v.detail
    left.kill()
    left.wait(10)
    soak.checks.wait_nothing_survives(job)


def test_a_node_left_alone_that_failed_in_a_completed_job_breaks_job_completes(soak: Soak):
    job = soak.state.jobs[0]
    ok, failed = ended_agent(job, 0, "n0"), ended_agent(job, 1, "n1")
    (job.out / "done-n0-1-1.json").write_text(json.dumps({"node": "n0", "pid": 1}))
    v = raises(soak, lambda: soak.checks.check_completed(job))
    assert v.invariant == "job_completes" and "n1 ended with exit code 1 in a job that completed" in v.detail
    failed.code = 0
    soak.checks.check_completed(job)
    assert (held(soak, "job_completes"), ok.code) == (1, 0)


def test_a_hosted_etcd_port_still_listening_after_the_job_breaks_nothing_survives(soak: Soak):
    """--hosted: the job's etcd ends with it; its port still taken (a real socket) breaks nothing_survives."""
    soak.args.hosted = True
    job = soak.state.jobs[0]
    (job.out / "done-n0-1-1.json").write_text(json.dumps({"node": "n0", "pid": 1}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        job.endpoint = f"127.0.0.1:{s.getsockname()[1]}"
        v = raises(soak, lambda: soak.checks.check_job_end(job))
        assert v.invariant == "nothing_survives" and f"port {s.getsockname()[1]} still listens" in v.detail
    soak.checks.check_job_end(job)
    assert held(soak, "nothing_survives") == 1


# An agent with a child that does not die with it (no PR_SET_PDEATHSIG, no guard here).
AGENT_WITH_CHILD = """
import subprocess
child = subprocess.Popen(["sleep", "120"])
print(child.pid, flush=True)
child.wait()
"""


def test_a_killed_agents_process_left_running_breaks_nothing_survives(soak: Soak, procs):
    """kill_agent: every process under the SIGKILLed agent must be gone within the bound (its guards kill them);
    one left running breaks nothing_survives, and gone (reaped by us, the subreaper's stand-in) it holds."""
    job = soak.state.jobs[0]
    agent = live_agent(soak, procs, AGENT_WITH_CHILD)
    assert agent.proc.stdout is not None
    child = ident(int(agent.proc.stdout.readline()))
    assert child is not None
    assert soak.faults.inject(job, "kill_agent", [0.0, 0.0, 0.0, 0.0])  # (no etcd: its lease check did not apply)
    assert agent.fate == "killed"
    e = expectation(job, "nothing_survives")
    v = due(soak, job, e)
    assert v.invariant == "nothing_survives" and f"pid {child.pid}" in v.detail
    os.kill(child.pid, 9)
    wait_for(lambda: e.check(), WAIT_S, "the child gone")


def test_nodes_running_on_after_the_hosting_node_stopped_break_stop_honoured(soak: Soak, procs):
    """--hosted: a stop signal to the node hosting the etcd must stop every node; one that runs on breaks it."""
    soak.args.hosted = True
    job = soak.state.jobs[0]
    host = hosting(soak, procs, "n0")
    other = live_agent(soak, procs, IGNORES_SIGTERM, "n1")
    assert host.proc.stdout is not None and other.proc.stdout is not None
    host.proc.stdout.readline()
    assert other.proc.stdout.readline().strip() == "ready"
    wait_for(lambda: soak.procs.host(job) is host, WAIT_S, "the hosted etcd seen")
    assert soak.faults.inject(job, "signal_agent", [0.0, 0.0, 0.0, 0.0])  # n0, SIGTERM
    assert (host.fate, job.host_stopped) == ("SIGTERM", True)
    everyone = next(e for e in job.expects if e.invariant == "stop_honoured" and not e.check())
    host.code = host.proc.wait(10)
    v = due(soak, job, everyone)
    assert v.invariant == "stop_honoured" and "nodes still running after the hosting node was stopped: n1" in v.detail
    other.proc.kill()
    other.code = other.proc.wait(10)
    assert everyone.check() is True


# ---------------------------------------------------------------------------------------- --hosts


@pytest.fixture
def hsoak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HostSoak:
    """A soak on hosts, with no lab (what the checks read of the hosts is given to them), and its first job."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    s = HostSoak(soak_args(hosted=False, hosts=True, etcd_members=1, classes="host_loss"), base=tmp_path)
    new_job(s, tmp_path, ("n0", "n1"))
    return s


def test_workers_of_two_worlds_alive_at_once_break_no_rank_twice(hsoak: HostSoak, procs):
    """Two real processes, as the workers of two worlds (their markers resolved to them, as the lab does): broken;
    the old world's gone: it holds."""
    job = hsoak.state.jobs[0]
    mine = []
    for node, world in (("n0", "n0:1000"), ("n1", "n1:2000")):
        proc = subprocess.Popen(["sleep", "120"])
        procs.append(proc)  # type: ignore[arg-type]
        me = ident(proc.pid)
        assert me is not None
        m = {"node": node, "pid": 7, "start_ticks": me.ticks, "run_dir": "", "attempt": 0, "rank": 0,
             "world_size": 2, "master": world}
        path = job.out / f"start-{node}-7-{me.ticks}.json"
        path.write_text(json.dumps(m))
        hsoak.world.seen[str(path)] = Seen(m, me)
        mine.append(proc)
    v = raises(hsoak, lambda: hsoak.checks.check_one_live_world(job))
    assert v.invariant == "no_rank_twice" and "n0:1000" in v.detail and "n1:2000" in v.detail
    mine[1].kill()
    mine[1].wait(10)
    hsoak.checks.check_one_live_world(job)


def test_an_etcd_member_killed_by_a_signal_no_fault_sent_breaks_etcd_unharmed(hsoak: HostSoak, procs, tmp_path):
    """--hosts: a member (a real process here) that died of a signal while no fault held it down breaks it; one a
    fault stopped does not."""
    member = subprocess.Popen(["sleep", "120"])
    procs.append(member)  # type: ignore[arg-type]
    lab = SimpleNamespace(shared=tmp_path)
    (tmp_path / ".etcd-etcd.log").write_text("etcd: serving client traffic\n")
    cluster = SimpleNamespace(members=[SimpleNamespace(name="etcd", proc=member, host=SimpleNamespace(lab=lab))])
    hsoak.world.cluster = HostEtcd(cluster)  # type: ignore[arg-type]
    hsoak.checks.check_own_etcd()  # running: holds
    member.kill()
    member.wait(10)
    v = raises(hsoak, lambda: hsoak.checks.check_own_etcd())
    assert v.invariant == "etcd_unharmed" and "died of signal 9 and no fault sent it" in v.detail
    assert "serving client traffic" in v.detail
    hsoak.world.cluster.held.add("etcd")  # (a fault stopped it)
    hsoak.checks.check_own_etcd()


class LostHost:
    """What host_loss asks of a node's host: its processes (one real one here), and losing them all at once."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc, self.name = proc, "n0"

    def pids(self) -> dict[int, int]:
        return {1: self.proc.pid} if self.proc.poll() is None else {}

    def lose(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def test_a_lost_hosts_lease_still_granted_breaks_lease_expired(hsoak: HostSoak, procs, etcd: ChaosEtcd,
                                                              monkeypatch):
    """host_loss on a node with a live state key (a real etcd, a 60 s lease): at the bound its lease is still
    granted, lease_expired breaks; expired (revoked here), it holds."""
    job = hsoak.state.jobs[0]
    job.endpoint = etcd.endpoint
    hsoak.world.cluster = SimpleNamespace(readable=True, up=True, started_at=0.0)  # type: ignore[assignment]
    lease = etcd.etcdctl("lease", "grant", "60").stdout.split()[1]
    etcd.etcdctl("put", f"--lease={lease}", f"{PREFIX}/{job.name}/nodes/n0", "{}")
    agent = live_agent(hsoak, procs, "import time; time.sleep(120)")
    monkeypatch.setattr(hsoak.procs, "node_host", lambda _node: LostHost(agent.proc))
    assert hsoak.faults.inject(job, "host_loss", [0.0, 0.0, 0.0, 0.0])
    assert agent.fate == "lost"
    e = expectation(job, "lease_expired")
    v = due(hsoak, job, e)
    assert v.invariant == "lease_expired" and f"lease {int(lease, 16):x} is still granted" in v.detail
    etcd.etcdctl("lease", "revoke", lease)
    assert e.check() is True


@pytest.fixture
def msoak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HostSoak:
    """A soak on hosts whose nodes host the etcd (--hosted, hosted_members 3), with no lab: a stand-in whose hosts
    n0..n2 are up (what the checks read of them is given to them), and its first job."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    s = HostSoak(soak_args(hosted=True, hosts=True, hosted_members=3, classes="host_loss"), base=tmp_path)
    s.world.lab = SimpleNamespace(hosts={n: SimpleNamespace(name=n, lost=False, cut_off=False, init=None, procs=[])  # type: ignore[assignment]
                                         for n in ("n0", "n1", "n2")})
    new_job(s, tmp_path)
    return s


def test_a_job_a_member_loss_ended_while_the_others_kept_a_quorum_breaks_member_loss_survived(msoak: HostSoak, procs,
                                                                                           tmp_path):
    """host_loss of n0, a voting member of 3 whose peers run (an agent and an etcd on each host): a loss the job must
    survive. The job ends untrained with no documented loss: broken, with the fault named. Judged on 2 voting members
    (the growth window), or with a peer's etcd gone (a node started again after its member was lost), the same loss
    is documented instead; trained, the check holds."""
    job = msoak.state.jobs[0]
    for node in ("n1", "n2"):
        live_agent(msoak, procs, "import time; time.sleep(120)", node)
    etcd = tmp_path / "bin" / "etcd"
    etcd.parent.mkdir()
    etcd.symlink_to("/bin/sleep")
    member = subprocess.Popen([str(etcd), "120"])
    procs.append(member)  # type: ignore[arg-type]
    for name in ("n1", "n2"):  # each member host runs an etcd (the same process stands for both)
        msoak.world.lab.hosts[name].pids = lambda: {7: member.pid}  # type: ignore[union-attr]
    msoak.world.lab.hosts["n0"].pids = dict  # type: ignore[union-attr]
    wait_for(lambda: msoak.faults.member_up(job, "n1") and msoak.faults.member_up(job, "n2"), timeout=10,
             what="n1's and n2's members up (an agent and an etcd process each)")
    msoak.state.record(job, "host_loss", "n0", "host n0 lost")
    msoak.faults.judge_member_loss(job, "host_loss", "n0", ["n0", "n1", "n2"])
    assert not job.loss and len(msoak.world.must_survive[1]) == 1
    v = raises(msoak, lambda: msoak.checks.check_job_result(job))
    assert v.invariant == "member_loss_survived" and "host_loss of n0" in v.detail and "kept a quorum" in v.detail
    msoak.world.must_survive.clear()
    msoak.faults.judge_member_loss(job, "host_loss", "n0", ["n0", "n2"])  # the growth window: documented
    assert "fewer than 3 voting members" in job.loss and not msoak.world.must_survive
    job.loss = ""
    msoak.world.lab.hosts["n2"].pids = dict  # type: ignore[union-attr]  # n2 runs no etcd: its member is down
    msoak.faults.judge_member_loss(job, "host_loss", "n0", ["n0", "n1", "n2"])
    assert "down n2" in job.loss and not msoak.world.must_survive
    job.loss = ""
    msoak.world.lab.hosts["n2"].pids = lambda: {7: member.pid}  # type: ignore[union-attr]
    msoak.faults.judge_member_loss(job, "host_loss", "n0", ["n0", "n1", "n2"])
    (job.out / "done-n1-1-1.json").write_text(json.dumps({"node": "n1", "pid": 1, "run_dir": "", "time": 0}))
    for a in job.agents:
        a.proc.kill()
        a.code, a.fate = a.proc.wait(10), "killed"
    msoak.checks.check_job_result(job)
    assert (held(msoak, "member_loss_survived"), broke(msoak, "member_loss_survived")) == (1, 1)


def test_the_other_of_two_voters_lost_while_the_founder_lives_is_a_loss_the_job_must_survive(msoak: HostSoak, procs,
                                                                                             tmp_path):
    """Two voting members, n0 (the founder: n0's first agent of the job, up) and n1; n1's host lost: the founder goes
    on alone (runner/rendezvous/etcd/founder.py), so the job must go on. n0 lost instead, or n1 lost once n0's first
    agent is gone (a node started again on n0 founds nothing), is the documented growth-window loss."""
    job = msoak.state.jobs[0]
    founder = live_agent(msoak, procs, "import time; time.sleep(120)", "n0")
    live_agent(msoak, procs, "import time; time.sleep(120)", "n1")
    etcd = tmp_path / "bin" / "etcd"
    etcd.parent.mkdir()
    etcd.symlink_to("/bin/sleep")
    member = subprocess.Popen([str(etcd), "120"])
    procs.append(member)  # type: ignore[arg-type]
    for name in ("n0", "n1"):
        msoak.world.lab.hosts[name].pids = lambda: {7: member.pid}  # type: ignore[union-attr]
    wait_for(lambda: msoak.faults.member_up(job, "n0"), timeout=10, what="n0's member up")
    msoak.state.record(job, "host_loss", "n1", "host n1 lost")
    msoak.faults.judge_member_loss(job, "host_loss", "n1", ["n0", "n1"])
    assert not job.loss and "the founder n0 goes on alone" in msoak.world.must_survive[1][0][1]
    msoak.world.must_survive.clear()
    msoak.faults.judge_member_loss(job, "host_loss", "n0", ["n0", "n1"])  # the founder itself: documented
    assert "fewer than 3 voting members" in job.loss and not msoak.world.must_survive
    job.loss = ""
    founder.proc.kill()
    founder.code = founder.proc.wait(10)
    msoak.faults.judge_member_loss(job, "host_loss", "n1", ["n0", "n1"])  # no founder any more: documented
    assert "fewer than 3 voting members" in job.loss and not msoak.world.must_survive


def test_an_etcd_or_its_data_left_on_a_host_breaks_no_etcd_left(msoak: HostSoak, procs, tmp_path, monkeypatch):
    """--hosted: after the job, an etcd process left on a node host (a real one, called etcd) breaks it; gone, its
    data folder left in the host's /tmp still does; a folder of an agent the soak SIGKILLed (its pid in the name:
    the next member there sweeps it) does not."""
    monkeypatch.setattr(hosts_module, "GONE_BOUND_S", 0.3)
    job = msoak.state.jobs[0]
    etcd = tmp_path / "bin" / "etcd"
    etcd.parent.mkdir()
    etcd.symlink_to("/bin/sleep")
    member = subprocess.Popen([str(etcd), "120"])
    procs.append(member)  # type: ignore[arg-type]
    host_tmp = tmp_path / "n1-tmp"
    (host_tmp / "runner-etcd-55-0a1b2c3d" / "data").mkdir(parents=True)
    n1 = msoak.world.lab.hosts["n1"]  # type: ignore[union-attr]
    n1.pids = lambda: {7: member.pid} if member.poll() is None else {}
    for host in msoak.world.lab.hosts.values():  # type: ignore[union-attr]
        host.pids = getattr(host, "pids", dict)
    monkeypatch.setattr(msoak.procs, "host_tmp", lambda h: host_tmp if h.name == "n1" else tmp_path / "none")
    v = raises(msoak, lambda: msoak.checks.check_no_etcd_left(job))
    assert v.invariant == "no_etcd_left" and "n1: etcd pid 7" in v.detail
    member.kill()
    member.wait(10)
    v = raises(msoak, lambda: msoak.checks.check_no_etcd_left(job))
    assert v.invariant == "no_etcd_left" and "n1: /tmp/runner-etcd-55-0a1b2c3d" in v.detail
    killed = ended_agent(job, 0, "n1", signalled=True)
    killed.fate, killed.host_pid = "killed", 55
    msoak.checks.check_no_etcd_left(job)
    assert (held(msoak, "no_etcd_left"), broke(msoak, "no_etcd_left")) == (1, 2)


# ---------------------------------------------------------------------------------------- --replica-groups: agent end


def replica_run(job: Job, a: Agent, outcome: str, steps: int = 5, done: bool = True) -> None:
    """What a replica-group run leaves (2 groups of 1 worker, one attempt each): report.json with its groups, the
    job's and each group's transitions.jsonl, each group's worker's start marker, step lines and done marker."""
    rd = a.run_dir
    assert rd is not None
    now = time.time()
    groups, job_lines = [], []
    for k in (0, 1):
        pid = 5000 + k
        (job.out / f"start-g{k}-{pid}.json").write_text(json.dumps(
            {"pid": pid, "start_ticks": 0, "job_run_dir": str(rd), "run_dir": str(rd), "group": k, "attempt": 0,
             "rank": 0, "node": "n0"}))
        (job.out / f"steps-g{k}-{pid}.log").write_text(
            "".join(f"step={s} commit=1 groups=2 time={now - 30 + s}\n" for s in range(1, steps + 1)))
        if done:
            (job.out / f"done-g{k}-{pid}.json").write_text(json.dumps(
                {"pid": pid, "job_run_dir": str(rd), "group": k, "time": now - 20}))
        lines = [{"attempt": 0, "group": k, "src": "INIT", "dst": "RUNNING", "time": now - 40},
                 {"attempt": 0, "group": k, "src": "RUNNING", "dst": "SHUTDOWN", "outcome": outcome, "time": now - 10}]
        jsonl_file(rd / f"group_{k}" / "transitions.jsonl", lines)
        job_lines += lines
        groups.append({"group": k, "outcome": outcome, "attempts": 1, "restarts": 0, "failures": [],
                       "step": steps if done else 3})
    jsonl_file(rd / "transitions.jsonl", job_lines)
    (rd / "report.json").write_text(json.dumps(
        {"outcome": outcome, "exit_code": a.code, "attempts": 2, "restarts": 0, "warnings": [], "groups": groups,
         "replica_groups": {"lighthouse": {"restarts": 0}}}))


def edit_group(k: int, **over: object) -> Callable[[ReplicaSoak, Job, Agent], None]:
    def apply(_s: ReplicaSoak, _j: Job, a: Agent) -> None:
        path = a.run_dir / "report.json"
        report = json.loads(path.read_text())
        report["groups"][k].update(over)
        path.write_text(json.dumps(report))
    return apply


def edit_report(**over: object) -> Callable[[ReplicaSoak, Job, Agent], None]:
    return lambda _s, _j, a: edit_json(a.run_dir / "report.json", **over)


def edit_lines(path: str, keep: Callable[[dict[str, Any]], bool], extra: str = "") -> Callable[..., None]:
    def apply(_s: ReplicaSoak, _j: Job, a: Agent) -> None:
        file = a.run_dir / path
        lines = [json.loads(x) for x in file.read_text().splitlines()]
        file.write_text("".join(json.dumps(x) + "\n" for x in lines if keep(x)) + extra)
    return apply


def remove(pattern: str) -> Callable[[ReplicaSoak, Job, Agent], None]:
    def apply(_s: ReplicaSoak, job: Job, _a: Agent) -> None:
        for p in job.out.glob(pattern):
            p.unlink()
    return apply


def both(*fs: Callable[[ReplicaSoak, Job, Agent], None]) -> Callable[[ReplicaSoak, Job, Agent], None]:
    def apply(s: ReplicaSoak, j: Job, a: Agent) -> None:
        for f in fs:
            f(s, j, a)
    return apply


def killed_worker(s: ReplicaSoak, job: Job, a: Agent) -> None:
    s.world.downs[job.index].append(Down(a, str(a.run_dir), 0, 0, 5000, time.time() - 25, "kill"))


def late_start(_s: ReplicaSoak, job: Job, a: Agent) -> None:
    """A worker of group 0 started in attempt 1, which the report does not count (its transitions do)."""
    (job.out / "start-g0-5100.json").write_text(json.dumps(
        {"pid": 5100, "start_ticks": 0, "job_run_dir": str(a.run_dir), "run_dir": str(a.run_dir), "group": 0,
         "attempt": 1, "rank": 0, "node": "n0"}))


def lighthouse_killed(s: ReplicaSoak, _job: Job, a: Agent) -> None:
    s.world.lh_kills[a.me] = 1


def stopped(s: ReplicaSoak, job: Job, a: Agent) -> None:
    a.fate, a.fate_at = "SIGTERM", time.time() - 15
    remove("done-*.json")(s, job, a)


REPLICA_CASES = [
    ("outcome_matches_workers", 0, "succeeded", remove("done-g1-*.json"), "group 1 succeeded, but the workers"),
    ("outcome_matches_workers", 1, "failed", edit_group(0, outcome="failed"), "yet the group's outcome is failed"),
    ("outcome_matches_workers", 1, "failed", both(edit_group(0, outcome="succeeded"), edit_group(1, outcome="succeeded")),
     "finished their training (min_active 1) and no stop signal came"),
    ("outcome_matches_workers", 0, "succeeded",
     both(remove("done-*.json"), edit_group(0, outcome="failed"), edit_group(1, outcome="failed")),
     "fewer than min_active 1"),
    ("stop_honoured", 1, "failed", stopped, "SIGTERM must end it with outcome stopped and exit code 143"),
    ("group_restarts_reported", 0, "succeeded", lambda _s, _j, a: edit_json(
        a.run_dir / "report.json", groups=json.loads((a.run_dir / "report.json").read_text())["groups"][:1]),
     "not one entry for each of the 2 groups"),
    ("group_restarts_reported", 0, "succeeded", edit_report(attempts=3), "are not the sum of its groups'"),
    ("group_restarts_reported", 0, "succeeded", both(edit_group(0, restarts=1), edit_report(restarts=1)),
     "group 0's report counts 1 restart(s), its transitions.jsonl 0"),
    ("group_restarts_reported", 0, "succeeded", killed_worker, "got a kill from the soak in attempt 0"),
    ("group_restarts_reported", 0, "succeeded", edit_group(1, step=9), "a step its workers never committed"),
    ("group_restarts_reported", 0, "succeeded", edit_group(1, step=4), "yet its step in report.json is 4, not 5"),
    ("group_restarts_reported", 0, "succeeded", late_start, "started in attempt 1, but the report counts 1 attempt(s)"),
    ("group_restarts_reported", 0, "succeeded", both(killed_worker, edit_group(0, failures=[{"attempt": 0}])),
     "group 0 was not restarted after the kill"),
    ("lighthouse_restarted", 0, "succeeded", lighthouse_killed, "killed its lighthouse 1 time(s)"),
    ("attempts_recorded", 0, "succeeded", edit_lines("transitions.jsonl", lambda _x: True, "{torn\n"),
     "1 torn line(s) in the job's transitions.jsonl"),
    ("attempts_recorded", 0, "succeeded", edit_lines("group_0/transitions.jsonl", lambda _x: True, "{torn\n"),
     "1 torn line(s) in group_0/transitions.jsonl"),
    ("attempts_recorded", 0, "succeeded", edit_lines("group_1/transitions.jsonl", lambda _x: False),
     "group 1's attempt(s) [0] not in group_1/transitions.jsonl"),
    ("attempts_recorded", 0, "succeeded", edit_lines("group_0/transitions.jsonl", lambda x: x["dst"] != "SHUTDOWN"),
     "group 0's last transition"),
]


@pytest.mark.parametrize(("invariant", "code", "outcome", "breaks", "word"), REPLICA_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(REPLICA_CASES)])
def test_a_replica_agent_end_check_breaks_on_a_run_that_violates_it(rsoak: ReplicaSoak, invariant, code, outcome,
                                                                    breaks, word):
    job = rsoak.state.jobs[0]
    a = ended_agent(job, code)
    replica_run(job, a, outcome)
    breaks(rsoak, job, a)
    v = raises(rsoak, lambda: rsoak.checks.check_agent_end(job, a))
    assert v.invariant == invariant
    assert word in v.detail, v.detail
    assert broke(rsoak, invariant) == 1


@pytest.mark.parametrize(("code", "outcome", "fate"), [(0, "succeeded", ""), (143, "stopped", "SIGTERM")])
def test_the_replica_agent_end_checks_hold_on_a_run_that_keeps_them(rsoak: ReplicaSoak, code, outcome, fate):
    """The same run unbroken (a success; a stop honoured), and a worker the soak killed that its group reported as a
    failure and a restart, and a lighthouse kill the report counts."""
    job = rsoak.state.jobs[0]
    a = ended_agent(job, code)
    replica_run(job, a, outcome, done=not fate)
    a.fate, a.fate_at = fate, time.time() - 15
    rsoak.checks.check_agent_end(job, a)
    names = ("no_internal_error", "report_written", "outcome_matches_workers", "attempts_recorded",
             "group_restarts_reported")
    assert [(held(rsoak, n), broke(rsoak, n)) for n in names] == [(1, 0)] * len(names)
    if fate:
        return
    again = ended_agent(job, 0, "n0")
    again.run_dir = job.dir / "runs" / "again"
    again.run_dir.mkdir(parents=True)
    replica_run(job, again, "succeeded")
    rd = again.run_dir
    (job.out / "start-g0-6000.json").write_text(json.dumps(
        {"pid": 6000, "start_ticks": 0, "job_run_dir": str(rd), "run_dir": str(rd), "group": 0, "attempt": 1,
         "rank": 0, "node": "n0"}))
    (job.out / "steps-g0-6000.log").write_text("step=5 commit=1 groups=2 time=1\n")
    (job.out / "done-g0-6000.json").write_text(json.dumps({"pid": 6000, "job_run_dir": str(rd), "time": time.time()}))
    for p in job.out.glob("*-g0-5000.*"):
        p.rename(p.with_name(p.name.replace("5000", "5010")))  # (the first run's markers kept apart)
    report = json.loads((rd / "report.json").read_text())
    report["groups"][0].update(attempts=2, restarts=1, failures=[{"attempt": 0, "kind": "signal"}])
    report.update(attempts=3, restarts=1)
    report["replica_groups"]["lighthouse"]["restarts"] = 1
    (rd / "report.json").write_text(json.dumps(report))
    lines = [{"attempt": 0, "group": 0, "dst": "RUNNING"}, {"attempt": 1, "group": 0, "trigger": "retry", "dst": "RUNNING"},
             {"attempt": 1, "group": 0, "dst": "SHUTDOWN", "outcome": "succeeded"}]
    jsonl_file(rd / "group_0" / "transitions.jsonl", lines)
    jsonl_file(rd / "transitions.jsonl", [*lines, *[json.loads(x) for x in
                                                    (rd / "group_1" / "transitions.jsonl").read_text().splitlines()]])
    (job.out / "start-g0-5010.json").write_text(json.dumps(
        {"pid": 5010, "start_ticks": 0, "job_run_dir": str(rd), "run_dir": str(rd), "group": 0, "attempt": 0,
         "rank": 0, "node": "n0"}))
    rsoak.world.downs[job.index].append(Down(again, str(rd), 0, 0, 5010, time.time() - 25, "kill"))
    rsoak.world.lh_kills[again.me] = 1
    rsoak.checks.check_agent_end(job, again)
    assert (held(rsoak, "group_restarts_reported"), broke(rsoak, "group_restarts_reported")) == (2, 0)


# ---------------------------------------------------------------------------------------- --replica-groups: lighthouse

# An agent whose lighthouse is a child running as torchft_lighthouse; on "again" it reaps it and starts another.
AGENT_WITH_LIGHTHOUSE = agent_with_child('subprocess.Popen(["torchft_lighthouse", "120"], executable="sleep")')


def test_a_killed_lighthouse_not_started_again_breaks_lighthouse_restarted(rsoak: ReplicaSoak, procs):
    job = rsoak.state.jobs[0]
    agent = live_agent(rsoak, procs, AGENT_WITH_LIGHTHOUSE)
    assert agent.proc.stdout is not None
    first = int(agent.proc.stdout.readline())
    wait_for(lambda: rsoak.procs.lighthouse(agent) is not None, WAIT_S, "the lighthouse seen")
    assert rsoak.faults.inject(job, "kill_lighthouse", [0.0, 0.0, 0.0, 0.0])
    assert job.faults[0].detail.startswith(f"SIGKILL pid {first} ")
    e = expectation(job, "lighthouse_restarted")
    v = due(rsoak, job, e)
    assert v.invariant == "lighthouse_restarted" and "has no lighthouse listening" in v.detail
    second = int(say(agent, "again"))
    wait_for(lambda: (lh := rsoak.procs.lighthouse(agent)) is not None and lh.pid == second, WAIT_S, "the new lighthouse seen")
    assert e.check() is True


def test_an_agent_long_without_a_lighthouse_breaks_lighthouse_up(rsoak: ReplicaSoak, procs):
    """An agent that runs with no lighthouse for longer than the bound, its groups still running: broken. With a
    lighthouse, or once every group ended (the agent stops it on purpose), it holds."""
    job = rsoak.state.jobs[0]
    agent = live_agent(rsoak, procs, "import time; time.sleep(120)")
    rsoak.world.lh_seen[agent.me] = time.monotonic() - 25
    v = raises(rsoak, lambda: rsoak.checks.scan_output(job, agent))
    assert v.invariant == "lighthouse_up" and "has had no lighthouse for 25 s" in v.detail
    with agent.out.open("a") as f:
        for k in (0, 1):
            f.write(json.dumps({"event": "transition", "group": k, "dst": "SHUTDOWN", "time": time.time()}) + "\n")
    rsoak.checks.scan_output(job, agent)
    with_lh = live_agent(rsoak, procs, AGENT_WITH_LIGHTHOUSE, "n1")
    assert with_lh.proc.stdout is not None
    with_lh.proc.stdout.readline()
    rsoak.world.lh_seen[with_lh.me] = time.monotonic() - 25
    wait_for(lambda: rsoak.procs.lighthouse(with_lh) is not None, WAIT_S, "the lighthouse seen")
    rsoak.checks.scan_output(job, with_lh)
    assert rsoak.world.lh_seen[with_lh.me] > time.monotonic() - 5


def test_a_lighthouse_or_its_port_left_after_the_job_breaks_nothing_survives(rsoak: ReplicaSoak, procs):
    """After the job: a lighthouse process the soak saw still running breaks nothing_survives, and so does its port
    still listening (a real socket); both gone, it holds."""
    job = rsoak.state.jobs[0]
    agent = ended_agent(job, 0)
    lh = subprocess.Popen(["sleep", "120"])
    procs.append(lh)  # type: ignore[arg-type]
    me = ident(lh.pid)
    assert me is not None
    rsoak.world.lighthouses[agent.me] = {me}
    v = raises(rsoak, lambda: rsoak.checks.check_job_end(job))
    assert v.invariant == "nothing_survives" and "lighthouse(s) of job 1 outlived it: " in v.detail
    lh.kill()
    lh.wait(10)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        rsoak.world.lh_ports[job.index].add(port)
        v = raises(rsoak, lambda: rsoak.checks.check_job_end(job))
        assert v.invariant == "nothing_survives" and f"port(s) [{port}] of job 1 still listen" in v.detail
    rsoak.world.lh_ports[job.index].clear()
    (job.out / "done-g0-1.json").write_text(json.dumps({"pid": 1}))  # (trained: job_completes holds too)
    rsoak.checks.check_job_end(job)
    assert (held(rsoak, "nothing_survives"), broke(rsoak, "nothing_survives")) == (1, 2)


# ---------------------------------------------------------------------------------------- the registry


def invariant_argument(node: ast.Call) -> ast.expr | None:
    """The invariant a call names: Violation(NAME, ...), state.expect(job, NAME, ...), state.tally.held/broke/moot/
    invariant(NAME, ...); None for any other call."""
    f = node.func
    fname = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    if fname == "Violation" and node.args:
        return node.args[0]
    if fname == "expect" and len(node.args) >= 2:
        return node.args[1]
    if (fname in ("held", "broke", "moot", "invariant") and isinstance(f, ast.Attribute)
            and isinstance(f.value, ast.Attribute) and f.value.attr == "tally" and node.args):
        return node.args[0]
    return None


def invariant_names_in_code() -> tuple[set[str], list[str]]:
    """Every invariant name the soak's code raises or counts: constants passed to Violation, to an expectation, to
    the tally, or a loop variable over a tuple of them (`for name in ("a", "b")`), and JOB_END_BRINGS and MOOT_WHY;
    and every name that is none of these, which the registry cannot read (only an expectation's or a violation's own,
    `e.invariant` and `v.invariant`, and a loop over JOB_END_BRINGS, are allowed)."""
    names: set[str] = set()
    dynamic: list[str] = []

    def visit(node: ast.AST, loops: dict[str, ast.expr], path: Path) -> None:
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
            loops = {**loops, node.target.id: node.iter}
        if isinstance(node, ast.Call) and (arg := invariant_argument(node)) is not None:
            loop = loops.get(arg.id) if isinstance(arg, ast.Name) else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                names.add(arg.value)
            elif isinstance(loop, ast.Tuple) and all(isinstance(x, ast.Constant) for x in loop.elts):
                names.update(str(x.value) for x in loop.elts if isinstance(x, ast.Constant))
            elif not (ast.unparse(arg) in ("e.invariant", "v.invariant")
                      or (loop is not None and "JOB_END_BRINGS" in ast.unparse(loop))):
                dynamic.append(f"{path.name}:{node.lineno}: {ast.unparse(arg)}")
        for child in ast.iter_child_nodes(node):
            visit(child, loops, path)

    for path in sorted(SOAK.glob("*.py")):
        visit(ast.parse(path.read_text(encoding="utf-8")), {}, path)
    names |= {n for brought in JOB_END_BRINGS.values() for n in brought} | set(MOOT_WHY)
    return names, dynamic


def test_every_invariant_the_soak_raises_or_counts_is_declared():
    names, dynamic = invariant_names_in_code()
    assert len(names) >= 20, names  # (the collector itself finds them)
    assert {"no_rank_twice", "lighthouse_up", "late_join_admitted", "etcd_unharmed"} <= names
    undeclared = sorted(names - set(INVARIANTS))
    assert not undeclared, f"invariants the soak checks but bench/soak/invariants.py does not declare: {undeclared}"
    unused = sorted(set(INVARIANTS) - names)
    assert not unused, f"declared in bench/soak/invariants.py but never checked by the soak: {unused}"
    assert not dynamic, f"invariant names the registry cannot read (name them with a constant): {dynamic}"


def test_every_declared_invariant_has_a_test_that_sees_it_fail():
    """Every invariant has a test in SEEN_FAILING, that test exists, and it names the invariant (it asserts the
    Violation's name); a new invariant without one fails here."""
    missing = sorted(set(INVARIANTS) - set(SEEN_FAILING))
    assert not missing, f"invariants no test sees failing (add one, and name it in SEEN_FAILING): {missing}"
    assert not sorted(set(SEEN_FAILING) - set(INVARIANTS)), "SEEN_FAILING names invariants the soak does not have"
    sources: dict[str, dict[str, str]] = {}
    for name, tests in sorted(SEEN_FAILING.items()):
        assert tests, name
        for node_id in tests:
            file, _, func = node_id.partition("::")
            if file not in sources:
                path = next(TESTS.rglob(file), None)  # a module's name: tests/ holds it in its layer's folder
                assert path is not None, f"{name}: no test module {file}"
                text = path.read_text(encoding="utf-8")
                sources[file] = {n.name: ast.get_source_segment(text, n) or ""
                                 for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)}
            assert func in sources[file], f"{name}: no test {node_id}"
            body = sources[file][func]
            here = file == Path(__file__).name
            # a parametrized test of this module names its invariants in its case table instead
            cases = {"test_an_agent_end_check_breaks_on_a_run_that_violates_it": AGENT_END_CASES,
                     "test_a_replica_agent_end_check_breaks_on_a_run_that_violates_it": REPLICA_CASES}
            if here and func in cases:
                assert name in {c[0] for c in cases[func]}, f"{node_id} has no case of {name}"
            else:
                assert f'"{name}"' in body, f"{node_id} does not name {name}"
            assert "Violation" in body or "raises(" in body or "due(" in body, f"{node_id} sees no violation"

