"""The invariants checked as an agent exits, as expectations come due, and at a job's end."""

from __future__ import annotations

import json
import signal
import time
from typing import Any

from bench.soak.bounds import (
    EVIDENCE,
    FINAL_TTL_S,
    GONE_BOUND_S,
    INTERNAL_ERRORS,
    JOB_END_BRINGS,
    LEASE_TTL_S,
    RACE_S,
)
from bench.soak.etcd_view import EtcdView
from bench.soak.model import (
    Agent,
    Job,
    Violation,
    console_transitions,
    context,
    evidence,
    excerpt,
    read_text,
    tail,
    tails,
)
from bench.soak.processes import JobProcesses
from bench.soak.procs import port_listening, reap_orphans
from bench.soak.state import SoakState
from bench.soak.verdict import MOOT_WHY


class Checks:
    """Check the invariants: as an agent exits, as expectations come due, at a job's end; the first broken one
    raises Violation. One concern (the invariants and their evidence) spread over a method per invariant."""

    def __init__(self, state: SoakState, procs: JobProcesses, kv: EtcdView) -> None:
        self.state = state
        self.procs = procs
        self.kv = kv

    def scan_output(self, job: Job, a: Agent) -> None:
        """The agent's output so far holds none of INTERNAL_ERRORS (read from where the last scan stopped)."""
        try:
            with a.out.open("rb") as f:
                f.seek(max(0, a.scanned - 200))
                chunk = f.read().decode(errors="replace")
                a.scanned = f.tell()
        except OSError:
            return
        for needle in INTERNAL_ERRORS:
            if needle in chunk:
                text = read_text(a.out)
                crash = "".join(read_text(p) for p in job.tmp.glob("runner-crash-*"))
                raise Violation("no_internal_error", f"{a.label} (exit {a.code}): {excerpt(text, needle)}\n"
                                f"{crash[-3000:] or context(text, needle)}")

    def check_agent_end(self, job: Job, a: Agent) -> None:
        """Right after an agent exits: no internal error, its report, its outcome against its workers, its
        transitions."""
        a.checked = True
        self.scan_output(job, a)
        text = read_text(a.out)
        self.state.tally.held("no_internal_error")
        if a.fate in ("killed", "lost"):
            killed = a.fate == "killed"
            row = "killed" if killed else "host_lost"
            self.state.lost[row] = self.state.lost.get(row, 0) + 1
            for name in ("report_written", "outcome_matches_workers", "attempts_recorded"):
                self.state.tally.moot(name, "the agent was SIGKILLed by the soak" if killed else "its host was lost")
            return
        if a.code is not None and a.code < 0:  # died of a signal: only a stop signal the spec does not handle
            raise Violation("report_written", f"{a.label} died of signal {-a.code} ({a.fate or 'no fault sent'}): "
                            f"no report\n{tail(text)}")
        rd = self.procs.run_dir(job, a)
        report_path = self.procs.report_path(a, rd)
        if report_path is None:
            raise Violation("report_written", f"{a.label} (exit {a.code}) wrote no report.json (run dir {rd}, "
                            f"no fallback named)\n{tail(text)}")
        try:
            report = json.loads(report_path.read_text())
        except (OSError, ValueError) as e:
            raise Violation("report_written", f"{a.label}: {report_path} unreadable: {e}") from e
        self.state.tally.held("report_written")
        self.check_outcome(job, a, report, text)
        self.state.tally.held("outcome_matches_workers")
        self.check_transitions(job, a, report)
        if any("transition_write_failed" in str(w) for w in report.get("warnings", [])):
            self.state.tally.moot("attempts_recorded", "the report warns transition_write_failed (a full disk)")
        else:
            self.state.tally.held("attempts_recorded")

    @staticmethod
    def check_exit(a: Agent, report: dict[str, Any]) -> str:
        """The report's exit code is the process's, and it succeeded iff it exited 0; what it said, for messages."""
        outcome, code = report.get("outcome"), report.get("exit_code")
        where = f"{a.label}: exit {a.code}, report outcome {outcome} exit_code {code}"
        if code != a.code:
            raise Violation("outcome_matches_workers", f"{where}: the report's exit code is not the process's")
        if (outcome == "succeeded") != (a.code == 0):
            raise Violation("outcome_matches_workers", f"{where}: succeeded iff exit code 0")
        return where

    def check_outcome(self, job: Job, a: Agent, report: dict[str, Any], text: str) -> None:
        """Exit code, report and the workers' own markers agree."""
        where, outcome = self.check_exit(a, report), report.get("outcome")
        rd = self.procs.run_dir(job, a)
        last = int(report.get("attempts", 1)) - 1
        mine = [m for m in job.markers("start") if rd and m["run_dir"] == str(rd)]
        done = {m["pid"]: m for m in job.markers("done") if rd and m["run_dir"] == str(rd)}
        last_workers = [m for m in mine if m["attempt"] == last]
        all_done = bool(last_workers) and all(m["pid"] in done for m in last_workers)
        if outcome == "succeeded" and not all_done:
            raise Violation("outcome_matches_workers", f"{where}: succeeded, but the workers of its last attempt "
                            f"({last}) did not all finish: started {[m['pid'] for m in last_workers]}, "
                            f"done {sorted(done)}")
        if all_done and outcome != "succeeded":
            finished = max(done[m["pid"]]["time"] for m in last_workers)
            excused = a.fate and a.fate_at < finished + RACE_S
            if not excused and self.fault_near(job, a, finished):
                excused = True
            if not excused:
                raise Violation("outcome_matches_workers", f"{where}: every worker of its last attempt ({last}) "
                                f"finished all {self.state.args.steps} steps, yet the outcome is {outcome}\n{tail(text)}")
        ended = next((t.get("time", 0.0) for t in console_transitions(a) if t.get("dst") == "SHUTDOWN"), None)
        if a.fate in signal.Signals.__members__ and outcome != "succeeded" and (ended is None or ended >= a.fate_at):
            sig = signal.Signals[a.fate]  # (an agent already in SHUTDOWN when the signal came keeps its outcome)
            if outcome != "stopped" or a.code != 128 + sig:
                raise Violation("stop_honoured", f"{where}: {a.fate} must end it with outcome stopped and exit code "
                                f"{128 + sig}\n{tail(text)}")

    def fault_near(self, job: Job, a: Agent, when: float) -> bool:
        """A fault hit etcd, the network or this agent within RACE_S of `when` (time.time())."""
        return any(abs(f.wall - when) < RACE_S for f in job.faults
                   if f.cls in ("etcd_stop", "etcd_restart", "etcd_wipe", "partition", "link_cut", "host_loss")
                   or f.target == a.label)

    def check_transitions(self, job: Job, a: Agent, report: dict[str, Any]) -> None:
        """Every attempt of the run (and every attempt a worker of it started in) is in transitions.jsonl, and the
        last transition is the end the report tells; a full disk excuses it only when the report says so."""
        lines, torn = self.procs.transitions(job, a)
        warned = any("transition_write_failed" in str(w) for w in report.get("warnings", []))
        if warned:
            return
        where = f"{a.label} ({self.procs.run_dir(job, a)})"
        if torn:
            raise Violation("attempts_recorded", f"{where}: {torn} torn line(s) in transitions.jsonl and no "
                            "transition_write_failed warning in the report")
        seen = {t.get("attempt") for t in lines}
        rd = str(self.procs.run_dir(job, a))
        wanted = set(range(int(report.get("attempts", 1)))) | {
            m["attempt"] for m in job.markers("start") if m["run_dir"] == rd}
        if missing := sorted(wanted - seen):
            raise Violation("attempts_recorded", f"{where}: attempt(s) {missing} not in transitions.jsonl "
                            f"(attempts {report.get('attempts')}, recorded {sorted(x for x in seen if x is not None)})")
        end = lines[-1] if lines else {}
        if end.get("dst") != "SHUTDOWN" or end.get("outcome") != report.get("outcome"):
            raise Violation("attempts_recorded", f"{where}: the last transition {end} is not the report's end "
                            f"({report.get('outcome')})")

    def check_expects(self, job: Job) -> None:
        """Expectations met (or moot) are dropped; one past its deadline is a violation."""
        now = time.monotonic()
        keep = []
        for e in job.expects:
            state = e.check()
            if state and e.met:
                self.state.say(f"job {job.index}: {e.met} after {now - e.since:.2f} s")
                self.state.timings.setdefault(e.invariant, []).append(now - e.since)
            if state:
                self.state.tally.held(e.invariant, e.cls)
                continue
            if state is None:
                self.state.tally.moot(e.invariant, MOOT_WHY.get(e.invariant, "moot when checked"), e.cls)
                continue
            if now >= e.deadline:
                self.state.tally.invariant(e.invariant, e.cls)  # (the run counts the broken check once it stops)
                raise Violation(e.invariant, e.detail())
            keep.append(e)
        job.expects = keep

    def wait_nothing_survives(self, job: Job) -> None:
        """Every process of the job gone within GONE_BOUND_S of its agents' exits (orphans reaped meanwhile)."""
        deadline = time.monotonic() + GONE_BOUND_S
        while (left := self.procs.job_processes(job)) and time.monotonic() < deadline:
            time.sleep(0.2)
            reap_orphans(self.procs.own_pids())
        if left:
            raise Violation("nothing_survives", f"{len(left)} process(es) of job {job.index} outlived it by "
                            f"{GONE_BOUND_S:g} s: " + "; ".join(d for _, d in left))

    def check_job_end(self, job: Job) -> None:
        """Once every agent of the job exited: nothing of it survives, its etcd keys expire, it completed."""
        self.wait_nothing_survives(job)
        while job.expects:  # e.g. a lease revoke still pending: wait out its deadline
            self.check_expects(job)
            if job.expects:
                time.sleep(0.2)
        if self.state.args.hosted:
            port = int(job.endpoint.rpartition(":")[2])
            if port_listening(port):
                raise Violation("nothing_survives", f"the hosted etcd's port {port} still listens after the job")
            self.state.tally.moot("etcd_keys_expire", "--hosted: the hosted etcd ends with its job (its leases with it)")
        else:
            self.check_keys(job)
            self.state.tally.held("etcd_keys_expire")
        self.state.tally.held("nothing_survives")
        self.check_job_result(job)

    def check_job_result(self, job: Job) -> None:
        """The job's rounds and ranks stayed consistent (one_world) and it ended as it must (job_completes): what
        its etcd faults and partitions bring (JOB_END_BRINGS, with a full disk's: its workers' results stood). etcd
        stopped, killed or wiped under a job, or a node cut off, must not give one rank to two workers of a world,
        nor leave the job unfinished."""
        for cls in sorted({f.cls for f in job.faults if f.cls in JOB_END_BRINGS}):
            for name in JOB_END_BRINGS[cls]:
                self.state.tally.invariant(name, cls)
        self.check_worlds(job)
        self.check_completed(job)

    def check_worlds(self, job: Job) -> None:
        """Every world the job's workers started in (one per attempt; told apart by its MASTER_ADDR:MASTER_PORT,
        fresh for each): one world size, each rank held by one worker, every rank below the size (one_world). A port
        the kernel handed out again to a later round (a node's run in the world at two attempts: a run takes part in
        a world at one attempt) is two worlds that cannot be told apart: that check did not apply, and says why."""
        worlds: dict[str, list[dict[str, Any]]] = {}
        for m, _ in self.procs.workers(job, live_only=False):
            worlds.setdefault(str(m.get("master")), []).append(m)
        for world, ms in sorted(worlds.items()):
            attempts: dict[str, set[int]] = {}
            for m in ms:
                attempts.setdefault(str(m["run_dir"]), set()).add(int(m["attempt"]))
            if any(len(a) > 1 for a in attempts.values()):
                self.state.tally.moot("one_world", "a MASTER_PORT the kernel handed out again to a later round")
                continue
            sizes = {int(m["world_size"]) for m in ms}
            ranks = sorted(int(m["rank"]) for m in ms)
            where = ", ".join(f"rank {m['rank']}/{m['world_size']} on {m['node']} (attempt {m['attempt']})" for m in ms)
            if len(sizes) > 1 or len(set(ranks)) < len(ranks) or any(r >= min(sizes) for r in ranks):
                raise Violation("one_world", f"job {job.index}: world {world} was not one world of distinct ranks: "
                                f"{where}")
            self.state.tally.held("one_world")

    def check_own_etcd(self) -> None:
        """Our etcd runs unless a fault holds it down. Killed by a signal no fault sent: a violation (something
        signalled a process that is not the job's). Exited by itself (etcd's own crash, its log says why): printed
        with its log's end, counted under "infrastructure", and started again at once, as etcd_restart does."""
        etcd = self.state.etcd
        if etcd is None or (code := etcd.exited_unasked()) is None:
            return
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
            raise Violation("etcd_unharmed", f"the soak's etcd died of {name} and no fault sent it (the OOM killer "
                            f"sends SIGKILL too); its log ends:\n{etcd.log_tail()}")
        crash = f"the soak's etcd exited by itself with code {code} (no fault stopped it); started again"
        self.state.say(f"{crash}; its log ends:\n{etcd.log_tail()}")
        self.state.etcd_crashes.append(crash)
        etcd.start()

    def check_keys(self, job: Job) -> None:
        """After the last agent's end plus lease_ttl: no key of the job on a live lease, but the final states (on
        their own lease, at most an hour). etcd renews every lease when it starts (a lease's TTL counts again from
        there, plus an election timeout): after a restart, the wait counts from the restart."""
        self.kv.start()  # (only if it is down)
        last_end = max((a.ended for a in job.agents), default=time.time())
        since = max(last_end, self.kv.renewed_at())
        time.sleep(max(0.0, since + LEASE_TTL_S + 2 - time.time()))
        keys = self.kv.keys(job)
        if keys is None:
            raise Violation("etcd_keys_expire", "cannot read the job's keys from etcd")
        leases: dict[int, int | None] = {}
        for key, lease in keys:
            if not lease:
                continue  # the job's record (spec, control, rounds): kept until `runner reset`, by design
            if lease not in leases:
                leases[lease] = self.kv.lease_ttl(job, lease)
            ttl = leases[lease]
            if ttl is None or ttl < 0:
                continue
            if "/final/" in key and ttl <= FINAL_TTL_S:
                continue
            raise Violation("etcd_keys_expire", f"{key} is still on lease {lease:x} (ttl {ttl} s) "
                            f"{time.time() - last_end:.1f} s after the job's last agent ended")

    def check_completed(self, job: Job) -> None:
        """The job's training completed, or the job ended in one of the documented ways; every agent left alone
        succeeded or found the job closed."""
        summary = ", ".join(f"{a.label}={a.code}{'/' + a.fate if a.fate else ''}" for a in job.agents)
        if job.loss:  # any ending is allowed then (each agent's own invariants were checked as it exited)
            if job.trained():
                self.state.say(f"job {job.index}: finished its training despite {job.loss}; agents {summary}")
                job.loss = ""
                self.state.tally.held("job_completes")
            else:
                self.state.lost["documented"] += 1
                self.state.say(f"job {job.index}: documented loss ({job.loss}); agents {summary}")
                self.state.tally.moot("job_completes", "a documented loss (the hosting node lost or stopped)")
            return
        if not job.trained():
            raise Violation("job_completes", f"job {job.index} ended without finishing its training, and no "
                            f"documented loss explains it; agents {summary}\n" + evidence(job, EVIDENCE)
                            + tails(job))
        for a in job.agents:
            if a.fate:
                continue
            text = read_text(a.out)
            if a.code == 0 or (a.code == 3 and "is closed" in text):
                continue
            if a.code == 3 and "kept out of the next round: this node held up the hang" in text:
                # A worker of it was found hung (stopped) and named the culprit: with the product's default
                # watchdog.keep_out_culprit the node sits out while the others go on (docs/hangs.md).
                continue
            if a.code == 3 and a.cut_off and self.procs.fenced(job, a):
                # Its host's link was cut for longer than its lease: it fenced itself (docs/multinode.md §4).
                continue
            if a.code == 3 and a.cut_off and self.state.args.hosted and "did not answer" in text:
                # Cut off while the others finished: the hosted etcd ended with its host (after its bounded wait
                # for this node), so the restart this node had to charge found no etcd: exit 3, as documented.
                continue
            raise Violation("job_completes", f"{a.label} ended with exit code {a.code} in a job that completed "
                            f"(only 0, 3 'job is closed' for a node that joined too late, or 3 'kept out' for a "
                            f"hang's culprit, are expected); "
                            f"agents {summary}\n{evidence(job, EVIDENCE)}--- {a.label}\n{tail(text)}")
        self.state.tally.held("job_completes")

