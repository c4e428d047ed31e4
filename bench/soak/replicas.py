"""The chaos soak's replica-group mode: `python bench/chaos.py --replica-groups --seed N --duration SECONDS`.

Every job is a single-node replica-group job (docs/replica_groups.md): one agent (`python -m runner run job.yaml
--node n0`, in its own session and folder, as bench/chaos.py starts its agents), 2 groups of 1 worker, min_active 1,
the hosted TorchFT lighthouse (heartbeat_timeout 1 s), the watchdog's heartbeat on (8 s), logs.dir on the soak's
tmpfs. The worker, bench/workers/chaos_ft.py, is a short real TorchFT training run (torchft's Manager as
examples/jobs/ft_train.py uses it: a quorum every step, gradients averaged over the quorum's groups, should_commit();
no checkpoint file: a restarted group copies the live weights from the other) that writes its start and done
markers, and one line per step with the committed step and the groups that took part, on the soak's own disk.

Faults, drawn by the base soak's seeded schedule (random.Random("SEED:JOB"), about every --failure-every s while
the job's window is open; `--first-job N` replays job N alone):

| class | what |
|---|---|
| kill_worker | SIGKILL the worker of one group |
| stop_worker | SIGSTOP the worker of one group: SIGCONT 0.5-3 s later (a pause), or never (a hang the watchdog kills) |
| kill_lighthouse | SIGKILL the hosted lighthouse (its agent starts it again on the same port); at most 3 per run |
| kill_guard | SIGKILL one of the agent's guards (its own, the lighthouse's, one per group) |
| signal_agent | SIGTERM, SIGINT or SIGHUP to the agent; the job is requeued 2-10 s later (a new run: training from 0) |
| kill_agent | SIGKILL the agent (its guards must kill the lighthouse and every worker); requeued 2-10 s later |
| disk_full | fill the tmpfs logs.dir is on for 3-30 s |

Invariants, on top of the base soak's that apply to one node without etcd (report_written, nothing_survives,
no_internal_error, hang_detected, guard_replaced, stop_honoured, job_completes):
- outcome_matches_workers: the exit code is the report's; `succeeded` exactly when it is 0; a group reported
  `succeeded` only if its last attempt's worker wrote its done marker, and one whose worker did is `succeeded`; the
  job `succeeded` only with min_active groups succeeded, and never anything else when one finished (unless a stop
  signal came first);
- attempts_recorded: every attempt of every group (the report's, and every attempt a worker started in) is in the
  group's transitions.jsonl and in the job's (with its group), each group's last line its end; a full disk excuses
  it only when the report warns transition_write_failed;
- group_restarts_reported: report.json lists every group with its attempts and restarts, which add up to the job's
  and match the restarts its transitions record; every worker the soak killed (or left stopped) appears as a
  failure of its group at its attempt, followed by a restart; a group's step is one its workers committed (and all
  --steps for a group that succeeded with no full disk meanwhile); the lighthouse's restarts count every kill;
- lighthouse_restarted: a killed lighthouse is listening again on its port within 20 s (or the agent ended);
- lighthouse_up: while the agent runs (no stop signal sent, some group still running), it is never without a
  lighthouse for more than 20 s, whatever took the lighthouse away;
- survivor_advanced: when one group's worker was killed or left stopped while the other group was stepping (it
  committed a step within 5 of its steps, 1 s at least, before, after any fault of its own or of the lighthouse),
  the other group committed
  steps alone (its own output's `groups=1`) before the killed group committed again (6 s allowed after a kill,
  10 s after a hang: lighthouse heartbeat_timeout, the collectives' timeout, load; a worker killed while joining,
  before it ended a step of its attempt, counts as a hang: the other group may be in the new quorum's collective with
  it, which waits for its timeout). A window cut shorter by a fault
  on the other group, the lighthouse or the agent, or by the killed group's return, only counts if the other group
  did step alone in it; the table says how many were checked and why the others did not apply.
- nothing_survives also: every lighthouse process the soak saw is gone and its port free after the job.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import math
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import ROOT, argv_of
from bench.soak.bounds import (
    HEARTBEAT_TIMEOUT_S,
    LOST,
    MEASURED,
    RACE_S,
    STEP_TIME_S,
)
from bench.soak.checks import Checks
from bench.soak.etcd_view import EtcdView
from bench.soak.faults import Faults
from bench.soak.infra import mount_tmpfs
from bench.soak.model import Agent, Job, Violation, console_transitions, jsonl, read_text, tail
from bench.soak.processes import JobProcesses
from bench.soak.procs import (
    Proc,
    children_of,
    describe,
    ident,
    parent_of,
    port_listening,
    running,
    set_subreaper,
    signal_proven,
    stat,
)
from bench.soak.schedule import one_of
from bench.soak.soak import Soak
from bench.soak.state import Options, SoakState

WORKER = ROOT / "bench" / "workers" / "chaos_ft.py"
GROUPS = 2
MIN_ACTIVE = 1
LOGS_MIB = 64
LIGHTHOUSE_HEARTBEAT_S = 1.0  # replica_groups.lighthouse.heartbeat_timeout: a silent group leaves the quorum
LIGHTHOUSE_JOIN_S = 1.0  # replica_groups.lighthouse.join_timeout: a quorum waits this long for stragglers
LIGHTHOUSE_TICK_S = 0.1  # replica_groups.lighthouse.quorum_tick
WORKER_TIMEOUT_S = 5.0  # the worker's collectives, store and Manager RPCs (chaos_ft.py --timeout)
QUORUM_TIMEOUT_S = 10.0  # the worker's Manager quorum_timeout (chaos_ft.py --quorum-timeout)
LIGHTHOUSE_KILLS = 3  # per run: the agent restarts its lighthouse 5 times at most (runner/agent/lighthouse.py)
LIGHTHOUSE_BOUND_S = 20.0
# The other group "was stepping" at the fault: it committed within ACTIVE_STEPS of its normal steps (ACTIVE_MIN_S at
# least) before it. A group already still for seconds (waiting in a quorum with the killed group's joining worker,
# seen with 0.1 s steps and 2-3 s of silence) was not stepping: what it does next says nothing of the fault.
ACTIVE_STEPS = 5
ACTIVE_MIN_S = 1.0
# When a group's worker is gone, the lighthouse drops it from the quorum after heartbeat_timeout, and a waiting quorum
# is issued within join_timeout and one tick; a stopped worker first holds the step's allreduce until the worker's
# collective timeout. Only then can the other group commit alone: the group is down *for the quorum* from there.
DETECT_S = {"kill": LIGHTHOUSE_HEARTBEAT_S + LIGHTHOUSE_JOIN_S + LIGHTHOUSE_TICK_S,
            "hang": WORKER_TIMEOUT_S + LIGHTHOUSE_HEARTBEAT_S + LIGHTHOUSE_JOIN_S + LIGHTHOUSE_TICK_S}
SLACK_S = 0.5  # scheduling on a loaded machine (2 CPUs shared by the soak, the agent, the lighthouse, 2 workers)
NORMAL_STEPS = 2  # survivor_advanced applies once the group is down for the quorum longer than this many steps


CLASSES = ("kill_worker", "stop_worker", "kill_lighthouse", "kill_guard", "signal_agent", "kill_agent", "disk_full")
RG_LOST = {k: v for k, v in LOST.items() if k not in ("documented", "etcd_keys_expire")}
RG_MEASURED = {k: v for k, v in MEASURED.items() if k in ("hang_detected", "guard_replaced", "nothing_survives")} | {
    "lighthouse_restarted": "a killed lighthouse listening again",
    "survivor_advanced": "the other group committing a step alone",
    "group_back": "the killed group committing again (it rejoined)",
}


def missing_torchft() -> str:
    """Why this mode cannot run here ('' when it can)."""
    from runner.config.preflight import lighthouse_program

    if importlib.util.find_spec("torchft") is None:
        return "--replica-groups needs torchft, which is not importable (pip install -e '.[ft]')"
    if lighthouse_program(os.environ) is None:
        return "--replica-groups needs torchft_lighthouse (pip install -e '.[ft]')"
    return ""


@dataclass
class Down:
    """A group's worker the soak killed (SIGKILL) or left stopped (a hang): the group is down until it commits again."""

    agent: Agent
    run_dir: str  # the job's run dir (the agent's)
    group: int
    attempt: int
    pid: int
    wall: float  # time.time() of the fault
    kind: str  # "kill" or "hang"


@dataclass
class Hit:
    """A fault that can hold a group back: on one group's worker (any signal), or on the lighthouse (group None)."""

    agent: Agent
    group: int | None
    wall: float


@dataclass(frozen=True)
class Line:
    """One step line of a group's rank 0 (bench/workers/chaos_ft.py)."""

    time: float
    step: int
    commit: bool
    groups: int
    attempt: int


@dataclass
class ReplicaWorld:
    """What the replica-group parts share beyond SoakState: per job, the groups' kills and hangs and the faults that
    hold a group back; per agent, its lighthouse's kills, every lighthouse process seen, and when one last ran."""

    downs: dict[int, list[Down]] = field(default_factory=dict)  # job index -> its groups' kills and hangs
    hits: dict[int, list[Hit]] = field(default_factory=dict)  # job index -> faults that hold a group back
    lh_kills: dict[Proc, int] = field(default_factory=dict)  # agent -> lighthouse kills
    lighthouses: dict[Proc, set[Proc]] = field(default_factory=dict)  # agent -> every lighthouse process seen
    lh_seen: dict[Proc, float] = field(default_factory=dict)  # agent -> monotonic time its lighthouse last ran
    lh_ports: dict[int, set[int]] = field(default_factory=dict)  # job index -> the lighthouses' ports

    def add_job(self, index: int) -> None:
        """Empty records for job `index`."""
        self.downs[index], self.hits[index], self.lh_ports[index] = [], [], set()


class ReplicaProcesses(JobProcesses):
    """A replica-group job's processes: the base view, its lighthouse, workers by group, the groups' step lines."""

    def lighthouse(self, agent: Agent) -> Proc | None:
        """The agent's running lighthouse (its child running torchft_lighthouse)."""
        for pid in children_of(agent.proc.pid):
            argv = argv_of(pid)
            if any(Path(a).name == "torchft_lighthouse" for a in argv[:2]) and (p := ident(pid)) and running(p):
                return p
        return None

    def workers(self, job: Job, *, live_only: bool = True) -> list[tuple[dict[str, Any], Proc]]:
        """the base soak's, ordered by group and attempt (the seeded pick does not depend on pids)."""
        found = super().workers(job, live_only=live_only)
        return sorted(found, key=lambda x: (x[0].get("group", 0), x[0]["attempt"], x[1].pid))

    def lines(self, job: Job, run_dir: str) -> dict[int, list[Line]]:
        """Every step line of each group's workers in that run, by time."""
        out: dict[int, list[Line]] = {k: [] for k in range(GROUPS)}
        for m in job.markers("start"):
            if m.get("job_run_dir") != run_dir:
                continue
            path = job.out / f"steps-g{m['group']}-{m['pid']}.log"
            with contextlib.suppress(OSError):
                for raw in path.read_text(errors="replace").splitlines():
                    kv = dict(p.split("=", 1) for p in raw.split() if "=" in p)
                    with contextlib.suppress(KeyError, ValueError):
                        out.setdefault(m["group"], []).append(Line(float(kv["time"]), int(kv["step"]),
                                                                   kv["commit"] == "1", int(kv["groups"]),
                                                                   int(m["attempt"])))
        for v in out.values():
            v.sort(key=lambda x: x.time)
        return out


class ReplicaFaults(Faults):
    """The base soak's process faults on a group's worker (remembered as the group down), and kill_lighthouse."""

    procs: ReplicaProcesses

    def __init__(self, state: SoakState, procs: ReplicaProcesses, kv: EtcdView, world: ReplicaWorld) -> None:
        super().__init__(state, procs, kv)
        self.world = world

    def fault_kill_worker(self, job: Job, u: list[float], sig: int = signal.SIGKILL) -> bool:
        runs = {str(rd): a for a in self.targets(job) if (rd := self.procs.run_dir(job, a))}
        cands = [(m, p) for m, p in self.procs.workers(job) if m.get("job_run_dir") in runs
                 and (sig == signal.SIGKILL or (stat(p.pid) or ("T",))[0] != "T")]  # a stopped one: not again
        if not cands:
            return False
        m, p = one_of(cands, u[0])
        parent = parent_of(p)  # (its agent: the one that must wait for it)
        if not signal_proven(p, sig, lambda pid: self.procs.marked(job, pid)):
            return False
        agent, now = runs[m["job_run_dir"]], time.time()
        who = f"group {m['group']} pid {p.pid} (attempt {m['attempt']})"
        self.world.hits[job.index].append(Hit(agent, m["group"], now))
        down = Down(agent, m["job_run_dir"], m["group"], m["attempt"], p.pid, now, "kill")
        if sig == signal.SIGKILL:
            self.state.record(job, "kill_worker", who, "SIGKILL")
            self.world.downs[job.index].append(down)
            self.expect_reaped(job, p, parent)
        elif u[1] < 0.5:
            self.pause(job, who, p, 0.5 + u[2] * 2.5,
                       lambda: signal_proven(p, signal.SIGCONT, lambda pid: self.procs.marked(job, pid)))
        else:
            self.state.record(job, "stop_worker", who, f"SIGSTOP, left stopped (heartbeat_timeout {HEARTBEAT_TIMEOUT_S:g} s)")
            down.kind = "hang"
            self.world.downs[job.index].append(down)
            self.expect_hang_detected(job, p, parent)
        return True

    def progress(self, job: Job) -> tuple[int, ...]:
        """What changes whenever a group steps: its workers' step lines (no checkpoint file here)."""
        sizes = []
        for path in sorted(job.out.glob("steps-g*.log")):
            with contextlib.suppress(OSError):
                sizes.append(path.stat().st_size)
        return (len(sizes), sum(sizes))

    def fault_kill_lighthouse(self, job: Job, u: list[float]) -> bool:
        cands = [(a, lh) for a in self.targets(job)
                 if self.world.lh_kills.get(a.me, 0) < LIGHTHOUSE_KILLS and (lh := self.procs.lighthouse(a))]
        if not cands:
            return False
        agent, lh = one_of(cands, u[0])
        argv = argv_of(lh.pid)
        port = bind_port(argv)

        def proof(pid: int) -> bool:
            st = stat(pid)
            return st is not None and st[1] == agent.proc.pid and argv_of(pid) == argv

        if not signal_proven(lh, signal.SIGKILL, proof):
            return False
        self.world.lh_kills[agent.me] = self.world.lh_kills.get(agent.me, 0) + 1
        self.world.hits[job.index].append(Hit(agent, None, time.time()))
        self.state.record(job, "kill_lighthouse", agent.label, f"SIGKILL pid {lh.pid} (port {port}; its agent starts it "
                          f"again; kill {self.world.lh_kills[agent.me]} of this run)")

        def back() -> bool | None:
            if agent.proc.poll() is not None or agent.fate:
                return None
            now = self.procs.lighthouse(agent)
            return now is not None and now != lh and (port is None or port_listening(port))

        self.state.expect(job, "lighthouse_restarted", LIGHTHOUSE_BOUND_S, back,
                          lambda: f"{agent.label} has no lighthouse listening on port {port} {LIGHTHOUSE_BOUND_S:g} s after "
                          f"the kill of {lh.pid} (now: {self.procs.lighthouse(agent)})\n" + lighthouse_events(agent),
                          met=f"{agent.label}'s lighthouse listening again")
        return True


class ReplicaChecks(Checks):
    """The invariants of replica groups: the groups in the report, their transitions, the lighthouse always up, the
    survivor that advanced alone, nothing of a lighthouse left."""

    procs: ReplicaProcesses

    def __init__(self, state: SoakState, procs: ReplicaProcesses, kv: EtcdView, world: ReplicaWorld) -> None:
        super().__init__(state, procs, kv)
        self.world = world

    def scan_output(self, job: Job, a: Agent) -> None:
        """the base soak's scan for internal errors; also every lighthouse seen under the agent, and its port; and
        the lighthouse is never gone for long while the agent runs (whatever took it away)."""
        super().scan_output(job, a)
        now = time.monotonic()
        lh = self.procs.lighthouse(a)
        if lh is not None:
            self.world.lh_seen[a.me] = now
            self.world.lighthouses.setdefault(a.me, set()).add(lh)
            if port := bind_port(argv_of(lh.pid)):
                self.world.lh_ports[job.index].add(port)
            return
        seen = self.world.lh_seen.get(a.me)
        if seen is None or a.fate or a.proc.poll() is not None or now - seen <= LIGHTHOUSE_BOUND_S:
            return
        ended = {t.get("group") for t in console_transitions(a) if t.get("dst") == "SHUTDOWN"}
        if len(ended) < GROUPS:  # (once every group ended, the agent stops its lighthouse on purpose)
            raise Violation("lighthouse_up", f"{a.label} has had no lighthouse for {now - seen:.0f} s while its "
                            f"groups run (bound {LIGHTHOUSE_BOUND_S:g} s); its lighthouse events:\n"
                            + lighthouse_events(a) + tail(read_text(a.out), 4))

    def entries(self, a: Agent, report: dict[str, Any]) -> dict[int, dict[str, Any]]:
        """The report's per-group entries, one per group (else a violation)."""
        groups = report.get("groups")
        if not isinstance(groups, list) or sorted(g.get("group", -1) for g in groups) != list(range(GROUPS)):
            raise Violation("group_restarts_reported", f"{a.label}: report.json lists groups "
                            f"{[g.get('group') for g in groups] if isinstance(groups, list) else groups!r}, "
                            f"not one entry for each of the {GROUPS} groups")
        return {int(g["group"]): g for g in groups}

    def check_outcome(self, job: Job, a: Agent, report: dict[str, Any], text: str) -> None:
        """Exit code, report, each group's outcome and the workers' own markers agree; then the groups' report."""
        where, outcome = self.check_exit(a, report), report.get("outcome")
        rd = str(self.procs.run_dir(job, a))
        groups = self.entries(a, report)
        starts = [m for m in job.markers("start") if m.get("job_run_dir") == rd]
        finished = self.finished_groups(job, a, groups, starts, where, text)
        won = [k for k, g in groups.items() if g.get("outcome") == "succeeded"]
        if outcome == "succeeded" and len(won) < MIN_ACTIVE:
            raise Violation("outcome_matches_workers", f"{where}: the job succeeded with groups {won} succeeded, fewer "
                            f"than min_active {MIN_ACTIVE}")
        if finished and outcome != "succeeded" and not a.fate:
            raise Violation("outcome_matches_workers", f"{where}: group(s) {finished} finished their training (min_active "
                            f"{MIN_ACTIVE}) and no stop signal came, yet the job's outcome is {outcome}\n{tail(text)}")
        if a.fate and a.fate != "killed" and outcome != "succeeded":
            ends = {t.get("group"): t.get("time", 0.0) for t in console_transitions(a) if t.get("dst") == "SHUTDOWN"}
            ended = max(ends.values()) if len(ends) == GROUPS else None
            if ended is None or ended >= a.fate_at:  # (a job whose groups had all ended keeps its outcome)
                sig = signal.Signals[a.fate]
                if outcome != "stopped" or a.code != 128 + sig:
                    raise Violation("stop_honoured", f"{where}: {a.fate} must end it with outcome stopped and exit "
                                    f"code {128 + sig}\n{tail(text)}")
        self.check_groups(job, a, report, groups, starts)

    def finished_groups(self, job: Job, a: Agent, groups: dict[int, dict[str, Any]], starts: list[dict[str, Any]],
                        where: str, text: str) -> list[int]:
        """The groups whose last attempt's workers all finished; each group's outcome agrees with its markers."""
        rd = str(self.procs.run_dir(job, a))
        done = {m["pid"]: m for m in job.markers("done") if m.get("job_run_dir") == rd}
        finished = []
        for k, g in groups.items():
            last = int(g.get("attempts", 1)) - 1
            last_workers = [m for m in starts if m["group"] == k and m["attempt"] == last]
            all_done = bool(last_workers) and all(m["pid"] in done for m in last_workers)
            if g.get("outcome") == "succeeded" and not all_done:
                raise Violation("outcome_matches_workers", f"{where}: group {k} succeeded, but the workers of its "
                                f"last attempt ({last}) did not all finish: started "
                                f"{[m['pid'] for m in last_workers]}, done {sorted(done)}")
            if all_done:
                at = max(done[m["pid"]]["time"] for m in last_workers)
                finished.append(k)
                if g.get("outcome") != "succeeded" and not (a.fate and a.fate_at < at + RACE_S):
                    raise Violation("outcome_matches_workers", f"{where}: group {k}'s worker finished all "
                                    f"{self.state.args.steps} steps in its last attempt ({last}), yet the group's outcome "
                                    f"is {g.get('outcome')}\n{tail(text)}")
        return finished

    def check_groups(self, job: Job, a: Agent, report: dict[str, Any], groups: dict[int, dict[str, Any]],
                     starts: list[dict[str, Any]]) -> None:
        """report.json lists each group's attempts and restarts, as its transitions and the soak's faults say."""
        rd = self.procs.run_dir(job, a)
        where = f"{a.label} ({rd})"
        attempts = sum(int(g.get("attempts", 0)) for g in groups.values())
        restarts = sum(int(g.get("restarts", 0)) for g in groups.values())
        if (report.get("attempts"), report.get("restarts")) != (attempts, restarts):
            raise Violation("group_restarts_reported", f"{where}: the job's attempts/restarts "
                            f"{report.get('attempts')}/{report.get('restarts')} are not the sum of its groups' "
                            f"({attempts}/{restarts})")
        warned = any("transition_write_failed" in str(w) for w in report.get("warnings", []))
        lines = self.procs.lines(job, str(rd))
        full = any(f.cls == "disk_full" and f.wall >= a.started - 30 and (not a.ended or f.wall <= a.ended)
                   for f in job.faults)
        for k, g in groups.items():
            self.check_group(job, a, k, g, starts, lines.get(k, []), where, warned=warned, full=full)
        kills = self.world.lh_kills.get(a.me, 0)
        light = (report.get("replica_groups") or {}).get("lighthouse") or {}
        if int(light.get("restarts", 0)) < kills:
            raise Violation("lighthouse_restarted", f"{where}: the soak killed its lighthouse {kills} time(s); "
                            f"report.json counts {light.get('restarts')} restart(s)")
        self.state.tally.held("group_restarts_reported")

    def check_group(self, job: Job, a: Agent, k: int, g: dict[str, Any], starts: list[dict[str, Any]],
                    lines: list[Line], where: str, *, warned: bool, full: bool) -> None:
        """Group k's entry in report.json: its attempts and restarts, a failure and a restart for each of the soak's
        kills, and the step its workers committed."""
        rd = self.procs.run_dir(job, a)
        n, r = int(g.get("attempts", 0)), int(g.get("restarts", -1))
        seen = max((m["attempt"] for m in starts if m["group"] == k), default=0)
        if seen >= n:
            raise Violation("group_restarts_reported", f"{where}: a worker of group {k} started in attempt {seen}, "
                            f"but the report counts {n} attempt(s)")
        if not warned and rd is not None:
            tl, _ = jsonl(rd / f"group_{k}" / "transitions.jsonl")
            retries = sum(1 for t in tl if t.get("trigger") == "retry")
            if r != retries:
                raise Violation("group_restarts_reported", f"{where}: group {k}'s report counts {r} restart(s), its "
                                f"transitions.jsonl {retries}")
        failed_at = {f.get("attempt") for f in g.get("failures", [])}
        for d in self.world.downs[job.index]:
            if d.agent is not a or d.group != k or a.fate:
                continue
            if d.attempt not in failed_at:
                raise Violation("group_restarts_reported", f"{where}: group {k}'s worker {d.pid} got a {d.kind} from the soak "
                                f"in attempt {d.attempt}, but the group's failures in report.json are at attempts "
                                f"{sorted(x for x in failed_at if x is not None)}")
            if n <= d.attempt + 1:
                raise Violation("group_restarts_reported", f"{where}: group {k} was not restarted after the {d.kind} "
                                f"of its worker {d.pid} in attempt {d.attempt} ({n} attempt(s), outcome "
                                f"{g.get('outcome')})")
        step = g.get("step")
        committed = {x.step for x in lines if x.commit}
        if step is not None and step not in committed:
            raise Violation("group_restarts_reported", f"{where}: group {k}'s step in report.json is {step}, a step "
                            f"its workers never committed (they committed {len(committed)} steps, last "
                            f"{max(committed, default=None)})")
        if g.get("outcome") == "succeeded" and not full and step != self.state.args.steps:
            raise Violation("group_restarts_reported", f"{where}: group {k} succeeded, with no full disk meanwhile, "
                            f"yet its step in report.json is {step}, not {self.state.args.steps}")

    def check_transitions(self, job: Job, a: Agent, report: dict[str, Any]) -> None:
        """Every attempt of every group is in its transitions.jsonl and in the job's; each group's last line is its
        end in the report; a full disk excuses it only when the report says so."""
        if any("transition_write_failed" in str(w) for w in report.get("warnings", [])):
            return
        rd = self.procs.run_dir(job, a)
        if rd is None:
            return
        where = f"{a.label} ({rd})"
        job_lines, torn = jsonl(rd / "transitions.jsonl")
        if torn:
            raise Violation("attempts_recorded", f"{where}: {torn} torn line(s) in the job's transitions.jsonl and "
                            "no transition_write_failed warning in the report")
        for k, g in self.entries(a, report).items():
            lines, torn = jsonl(rd / f"group_{k}" / "transitions.jsonl")
            if torn:
                raise Violation("attempts_recorded", f"{where}: {torn} torn line(s) in group_{k}/transitions.jsonl")
            wanted = set(range(int(g.get("attempts", 1)))) | {
                m["attempt"] for m in job.markers("start") if m.get("job_run_dir") == str(rd) and m["group"] == k}
            for name, seen in ((f"group_{k}/transitions.jsonl", {t.get("attempt") for t in lines}),
                               ("the job's transitions.jsonl",
                                {t.get("attempt") for t in job_lines if t.get("group") == k})):
                if missing := sorted(wanted - seen):
                    raise Violation("attempts_recorded", f"{where}: group {k}'s attempt(s) {missing} not in {name} "
                                    f"(attempts {g.get('attempts')}, recorded "
                                    f"{sorted(x for x in seen if x is not None)})")
            end = lines[-1] if lines else {}
            if end.get("dst") != "SHUTDOWN" or end.get("outcome") != g.get("outcome"):
                raise Violation("attempts_recorded", f"{where}: group {k}'s last transition {end} is not its end in "
                                f"the report ({g.get('outcome')})")

    def check_job_end(self, job: Job) -> None:
        """Nothing of the job survives (lighthouses included); the survivors advanced; the job completed."""
        self.wait_nothing_survives(job)
        alive = [describe(p) for a in job.agents for p in self.world.lighthouses.get(a.me, ()) if running(p)]
        if alive:
            raise Violation("nothing_survives", f"lighthouse(s) of job {job.index} outlived it: " + "; ".join(alive))
        if ports := sorted(p for p in self.world.lh_ports[job.index] if port_listening(p)):
            raise Violation("nothing_survives", f"the lighthouse port(s) {ports} of job {job.index} still listen")
        self.state.tally.held("nothing_survives")
        self.state.tally.held("lighthouse_up")  # (checked as the agent ran: no gap longer than its bound)
        while job.expects:  # e.g. a hang's deadline still pending
            self.check_expects(job)
            if job.expects:
                time.sleep(0.2)
        for d in self.world.downs[job.index]:
            self.check_survivor(job, d)
        self.check_completed(job)

    def check_survivor(self, job: Job, d: Down) -> None:
        """While the killed (or hung) group was down for the quorum longer than two of the other group's normal
        steps, the other group committed a step alone: a survivor that waits for the dead group breaks it, however
        soon the dead group is back. The window ends when the killed group's new worker has taken part in a quorum
        (the end of its first step, committed or not), or at a fault on the other group, the lighthouse or the agent;
        a window too short for the lighthouse to drop the group and two steps to follow does not apply, and says
        so."""
        cls = "kill_worker" if d.kind == "kill" else "stop_worker"
        lines = self.procs.lines(job, d.run_dir)
        committed = next((x.time for x in lines[d.group] if x.attempt > d.attempt and x.commit), math.inf)
        if committed < math.inf:
            self.state.timings.setdefault("group_back", []).append(committed - d.wall)
        back = next((x.time for x in lines[d.group] if x.attempt > d.attempt), math.inf)
        for j in range(GROUPS):
            if j == d.group:
                continue
            mine = [h.wall for h in self.world.hits[job.index] if h.agent is d.agent and h.group in (j, None)]
            cuts = [w for w in mine if w > d.wall]
            if d.agent.fate_at > d.wall:
                cuts.append(d.agent.fate_at)
            if d.agent.ended:
                cuts.append(d.agent.ended)
            final = next((x.time for x in lines[j] if x.commit and x.step >= self.state.args.steps), math.inf)
            before = max((w for w in mine if w < d.wall), default=0.0)
            recent = [x for x in lines[j] if x.commit and before < x.time <= d.wall]
            active = max(ACTIVE_MIN_S, ACTIVE_STEPS * normal_step(lines[j], d.wall))
            if final <= d.wall or not recent or d.wall - recent[-1].time > active:
                self.state.tally.moot("survivor_advanced", "the other group was not stepping (no commit within "
                                      f"{ACTIVE_STEPS} of its steps or {ACTIVE_MIN_S:g} s before, after its last "
                                      "fault; or it had finished)", cls)
                continue
            s0 = recent[-1].step
            end = min([back, *cuts])
            alone = next((x for x in lines[j] if d.wall < x.time < end and x.commit and x.step > s0
                          and x.groups < GROUPS), None)
            if alone is not None:
                self.state.tally.held("survivor_advanced", cls)
                self.state.timings.setdefault("survivor_advanced", []).append(alone.time - d.wall)
                self.state.say(f"job {job.index}: group {j} committed step {alone.step} alone {alone.time - d.wall:.2f} s "
                               f"after the {d.kind} of group {d.group}'s worker {d.pid} (from step {s0})")
                continue
            if final < end:
                self.state.tally.moot("survivor_advanced", "the other group finished its training in the window", cls)
                continue
            step = normal_step(lines[j], d.wall)
            joining = not any(x.attempt == d.attempt and x.time < d.wall for x in lines[d.group])
            detect = DETECT_S["hang" if joining else d.kind]
            bound = detect + SLACK_S + NORMAL_STEPS * step
            if end - d.wall <= bound:
                why = "the killed group was back" if end == back else "a fault on the other group, the lighthouse or the agent came"
                held = " (it was joining: the other group's collective with it waits for its timeout)" if joining else ""
                self.state.tally.moot("survivor_advanced", f"{why} before the quorum could drop it and two normal steps "
                                      f"passed{held}", cls)
                continue
            after = [f"{x.step}/{int(x.commit)}/{x.groups}@{x.time - d.wall:+.2f}" for x in lines[j]
                     if d.wall - 2 < x.time < end][:30]
            self.state.tally.broke("survivor_advanced", cls)
            raise Violation("survivor_advanced", f"job {job.index}, {d.agent.label}: group {d.group}'s worker {d.pid} "
                            f"(attempt {d.attempt}) got a {d.kind} at step {s0} of group {j}; group {d.group} was "
                            f"down for {end - d.wall:.1f} s ({'until it committed again' if end == back else 'until a fault cut the window'}), "
                            f"longer than the detection ({detect:g} s{', joining' if joining else ''}) + {SLACK_S:g} s + "
                            f"{NORMAL_STEPS} normal steps of group {j} ({step:.2f} s each, measured), yet group {j} "
                            f"committed no step alone in it. Its lines (step/commit/groups@s from the fault): {after}")


def lighthouse_events(a: Agent) -> str:
    """The agent's lighthouse events (for the evidence)."""
    return "".join(f"{line}\n" for line in read_text(a.out).splitlines() if '"lighthouse_' in line)[-3000:]


class ReplicaSoak(Soak):
    """The base soak's plan with single-node replica-group jobs: its loop, schedule, process faults and checks, with
    the faults and invariants of replica groups (the Replica* parts)."""

    classes = CLASSES
    all_classes = CLASSES
    lost_rows = RG_LOST
    measured = RG_MEASURED
    procs: ReplicaProcesses
    faults: ReplicaFaults
    checks: ReplicaChecks

    def __init__(self, args: Options, base: Path | None = None) -> None:
        self.world = ReplicaWorld()
        super().__init__(args, base)

    def new_procs(self) -> ReplicaProcesses:
        return ReplicaProcesses(self.state)

    def new_faults(self) -> ReplicaFaults:
        return ReplicaFaults(self.state, self.procs, self.kv, self.world)

    def new_checks(self) -> ReplicaChecks:
        return ReplicaChecks(self.state, self.procs, self.kv, self.world)

    # ------------------------------------------------------------------ output

    def setting(self) -> str:
        return (f"replica groups ({GROUPS} groups x 1 worker, min_active {MIN_ACTIVE}, hosted lighthouse), one node, "
                f"{self.args.steps} steps")

    def mode_flags(self) -> str:
        """Replica groups."""
        return " --replica-groups"

    def nodes_flag(self) -> str:
        """One node: no count."""
        return ""

    # ------------------------------------------------------------------ setup

    def select_classes(self) -> None:
        """As the base soak's; and no late node (one node)."""
        super().select_classes()
        self.state.disabled["late_join"] = "one node"  # (not in this soak's table; keeps start_nodes from drawing it)

    def setup(self) -> None:
        """Subreaper and the logs tmpfs; no etcd, no network namespace (one node)."""
        st = self.state
        set_subreaper()
        self.select_classes()
        why = mount_tmpfs(st.logs_root, LOGS_MIB)
        if why is None:
            st.mounted = True
            st.say(f"logs.dir on a {LOGS_MIB} MiB tmpfs at {st.logs_root}")
        else:
            st.disabled.setdefault("disk_full", f"cannot mount a tmpfs for logs.dir ({why})")
        for cls, why in sorted(st.tally.skipped().items()):
            st.say(f"class {cls} skipped: {why}")

    # ------------------------------------------------------------------ jobs

    def spec_text(self, job: Job, _endpoint: str) -> str:
        return textwrap.dedent(f"""\
            # chaos soak job {job.index} (seed {self.args.seed}, replica groups); generated by bench/soak/replicas.py
            version: 1
            name: {job.name}
            entrypoint:
              script: {WORKER}
              args: ["--steps", "{self.args.steps}", "--out", "{job.out}", "--step-time", "{STEP_TIME_S}",
                     "--timeout", "{WORKER_TIMEOUT_S}", "--quorum-timeout", "{QUORUM_TIMEOUT_S}"]
            replica_groups:
              count: {GROUPS}
              nproc_per_node: 1
              min_active: {MIN_ACTIVE}
              lighthouse: {{hosted: true, heartbeat_timeout: {LIGHTHOUSE_HEARTBEAT_S:g}s, join_timeout: {LIGHTHOUSE_JOIN_S:g}s,
                           quorum_tick: {LIGHTHOUSE_TICK_S:g}s}}
            env: {{OMP_NUM_THREADS: "1"}}
            {{tail}}
            """).replace("{tail}", self.spec_tail())

    def new_job(self) -> Job:
        """Folders and spec of the next job, drawing from its own generator (seed, job number) as the base soak's."""
        st = self.state
        index = self.args.first_job + len(st.jobs)
        st.rng = random.Random(f"{self.args.seed}:{index}")
        name = f"chaos-rg-{self.args.seed}-{index}"
        d = st.base / f"job{index}"
        logs = (st.logs_root if st.mounted else st.base / "logs") / f"job{index}"
        job = Job(index, name, os.urandom(8).hex(), d, logs, d / "job.yaml", ["n0"], "")
        for sub in (d, job.out, job.tmp, job.state, logs):
            sub.mkdir(parents=True, exist_ok=True)
        job.spec.write_text(self.spec_text(job, ""))
        env = {**os.environ, "CHAOS_LOGS": str(logs)}
        done = subprocess.run([sys.executable, "-m", "runner", "validate", str(job.spec)], env=env,
                              capture_output=True, text=True, timeout=60, check=False)
        if done.returncode:
            raise RuntimeError(f"the soak's own spec is refused:\n{done.stdout}{done.stderr}")
        st.jobs.append(job)
        self.world.add_job(index)
        return job


def normal_step(lines: list[Line], before: float) -> float:
    """The group's normal step time before `before`: the median gap between its consecutive commits (gaps over 2 s,
    a failure's, left out); STEP_TIME_S when it has too few."""
    times = [x.time for x in lines if x.commit and x.time <= before]
    gaps = sorted(b - a for a, b in itertools.pairwise(times) if 0 < b - a <= 2.0)
    return gaps[len(gaps) // 2] if len(gaps) >= 3 else STEP_TIME_S


def bind_port(argv: list[str]) -> int | None:
    """The port of the lighthouse's `--bind HOST:PORT`."""
    with contextlib.suppress(ValueError, IndexError):
        return int(argv[argv.index("--bind") + 1].rpartition(":")[2])
    return None

