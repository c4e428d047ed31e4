"""The soak: setup, jobs one after another, the loop that injects faults and checks invariants, teardown."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
import traceback
from pathlib import Path

from bench.common import machine_line, table
from bench.soak.bounds import (
    ALL_CLASSES,
    CLASSES,
    CONNECT_TIMEOUT_S,
    ETCD_CRASHED,
    GRACE_S,
    HEARTBEAT_TIMEOUT_S,
    JOIN_TIMEOUT_S,
    LAST_CALL_S,
    LATE_ADMIT_BOUND_S,
    LEASE_TTL_S,
    LOST,
    MEASURED,
    STEP_TIME_S,
    TICK_S,
    WORKER,
)
from bench.soak.checks import Checks
from bench.soak.etcd_view import EtcdView
from bench.soak.faults import Faults
from bench.soak.infra import ChaosEtcd, Netns, mount_tmpfs, umount
from bench.soak.model import Agent, Job, Violation, console_transitions, state_of, tails
from bench.soak.processes import JobProcesses
from bench.soak.procs import reap_orphans, set_subreaper
from bench.soak.schedule import Deck, pick
from bench.soak.state import Options, SoakState
from bench.soak.verdict import NOT_IN_CLASSES
from runner.rendezvous.etcd.job_secret import SecretSource, derive, new_secret_file, read_secret
from runner.testing.etcd_server import free_port


class Soak:
    """The whole soak, as a plan of parts it composes: the shared state (SoakState), a job's processes
    (JobProcesses), the etcd as faults and checks read it (EtcdView), the faults (Faults) and the invariants (Checks).
    Soak itself sets up and tears down the infrastructure, writes each job's spec, runs the loop (jobs one after
    another; per tick: exits, due actions, due expectations, the next fault) and prints the table. One concern, the
    run's plan and its report; the modes (bench/soak/hosts.py, replicas.py) subclass it and compose their own parts."""

    # What this soak draws and reports (bench/soak/replicas.py's soak has its own).
    classes: tuple[str, ...] = CLASSES  # drawn by the seeded schedule
    all_classes: tuple[str, ...] = ALL_CLASSES  # in the table (late_join is drawn per job)
    lost_rows: dict[str, str] = LOST
    measured: dict[str, str] = MEASURED

    def __init__(self, args: Options, base: Path | None = None) -> None:
        """`base`: the soak's folder, owned by the caller (a test's tmp_path); None: setup makes one under TMPDIR,
        and teardown removes it unless the run is kept."""
        self.state = SoakState(args, self.all_classes, self.lost_rows, folder=base)
        self.procs = self.new_procs()
        self.kv = self.new_etcd_view()
        self.faults = self.new_faults()
        self.checks = self.new_checks()
        self.next_scan = 0.0
        self.next_fault = 0.0
        self.pending: tuple[str, list[float], int] | None = None  # a drawn fault waiting for a target
        self.deck = Deck(self.state.rng, ())  # the job's classes, dealt in seeded rounds (replaced per job)

    @property
    def args(self) -> Options:
        """The soak's options (the state's)."""
        return self.state.args

    # ------------------------------------------------------------------ the parts (a mode makes its own)

    def new_procs(self) -> JobProcesses:
        """This mode's view of a job's processes."""
        return JobProcesses(self.state)

    def new_etcd_view(self) -> EtcdView:
        """This mode's etcd, as the faults and checks read it."""
        return EtcdView(self.state)

    def new_faults(self) -> Faults:
        """This mode's fault classes."""
        return Faults(self.state, self.procs, self.kv)

    def new_checks(self) -> Checks:
        """This mode's invariants."""
        return Checks(self.state, self.procs, self.kv)

    # ------------------------------------------------------------------ output

    def mode_flags(self) -> str:
        """The flags that choose this soak's mode, for its replay line (the base mode: where etcd is)."""
        return " --hosted" if self.args.hosted else ""

    def nodes_flag(self) -> str:
        """The node count, for the replay line."""
        return f" --nodes {self.args.nodes}"

    def replay(self, job: int | None = None) -> str:
        """The command that replays this seed (only job `job`, when given)."""
        a = self.args
        duration = a.job_window if job is not None else a.duration
        line = f"python bench/chaos.py{self.mode_flags()} --seed {a.seed} --duration {duration:g}{self.nodes_flag()}"
        if job is not None or a.first_job != 1:
            line += f" --first-job {job if job is not None else a.first_job}"
        line += f" --failure-every {a.failure_every:g} --steps {a.steps} --job-window {a.job_window:g}"
        if a.classes:
            line += f" --classes {a.classes}"
        if not a.standby:
            line += " --no-standby"
        return line

    # ------------------------------------------------------------------ setup / teardown

    def setup(self) -> None:
        """Subreaper, tmpfs for the logs, the network namespace, etcd."""
        st = self.state
        set_subreaper()
        self.select_classes()
        size = 512 if st.args.hosted else 64  # a hosted etcd preallocates a 64 MB WAL in the run dir
        why = mount_tmpfs(st.logs_root, size)
        if why is None:
            st.mounted = True
            st.say(f"logs.dir on a {size} MiB tmpfs at {st.logs_root}")
        else:
            st.disabled.setdefault("disk_full", f"cannot mount a tmpfs for logs.dir ({why})")
        if "partition" not in st.disabled:
            self.setup_netns()
        if not st.args.hosted:
            st.etcd = ChaosEtcd(st.base / "etcd-data", st.net.host_addr if st.net else None)
            st.etcd.start()
            st.say(f"etcd at {st.etcd.endpoint} (data {st.etcd.data_dir})")
        for cls, why in sorted(st.tally.skipped().items()):
            st.say(f"class {cls} skipped: {why}")

    @classmethod
    def ruled_out(cls, args: Options) -> dict[str, str]:
        """The classes this soak's own settings rule out, with why. Asked for by name (--classes), one is refused
        on the command line (cli.py); else it is skipped, named as skipped with the reason, and never counted as
        fired."""
        out = {}
        if args.nodes < 3:
            out["late_join"] = "needs --nodes 3 or more (a late node of nodes 2:K, K > 2)"
            out["partition"] = ("needs --nodes 3 or more (the cut-off node fences itself for good: nothing here "
                                "requeues it, and nodes 2:2 cannot go on without it)")
        return {c: why for c, why in out.items() if c in cls.all_classes}

    def select_classes(self) -> None:
        """The classes --classes leaves out, and those the soak's own settings rule out, are not enabled."""
        wanted = set(self.args.classes.split(",")) if self.args.classes else set(self.all_classes)
        for cls in self.all_classes:
            if cls not in wanted:
                self.state.tally.disable(cls, NOT_IN_CLASSES)
        for cls, why in self.ruled_out(self.args).items():
            self.state.tally.disable(cls, why)

    def setup_netns(self) -> None:
        """The namespace the last node runs in, or the partition class skipped with the reason."""
        st = self.state
        try:
            st.net = Netns()
            st.net.setup()
            st.say(f"node n{st.args.nodes - 1} runs in network namespace {st.net.name} "
                   f"({st.net.ns_addr}, the others {st.net.host_addr})")
        except (OSError, subprocess.SubprocessError) as e:
            if st.net is not None:
                st.net.teardown()
            st.net = None
            st.disabled["partition"] = f"no network namespace with a veth pair here ({e})"

    def teardown(self, keep: bool) -> None:
        """Kill and reap everything started, unmount, delete the namespace, stop etcd; the folder the soak made is
        removed unless kept (a folder given to it is its caller's). Bounded; never raises."""
        st = self.state
        for job in st.jobs:
            with contextlib.suppress(Exception):
                self.procs.kill_job(job)
        if st.net is not None:
            with contextlib.suppress(Exception):
                if st.net.cut:
                    st.net.up()
            st.net.teardown()
        if st.etcd is not None:
            with contextlib.suppress(Exception):
                st.etcd.kill()
        if st.mounted:
            if keep:
                with contextlib.suppress(OSError):
                    shutil.copytree(st.logs_root, st.base / "logs", symlinks=True, dirs_exist_ok=True,
                                    ignore=shutil.ignore_patterns(".chaos-filler"))
            umount(st.logs_root)
            st.mounted = False
        reap_orphans(self.procs.own_pids())
        if st.folder is None:
            return
        if keep:
            print(f"kept: {st.folder}", flush=True)
        elif st.made_folder:
            shutil.rmtree(st.folder, ignore_errors=True)

    # ------------------------------------------------------------------ jobs

    def spec_tail(self) -> str:
        """What every soak job's spec ends with: the restart policy, the watchdog, the shutdown and the logs."""
        return textwrap.dedent(f"""\
            restart:
              max_restarts: 10000
              crash_loop: 0          # the soak repeats the same fault on purpose: no crash-loop stop
              standby: {str(self.args.standby).lower()}  # the product's default unless --no-standby
              backoff: {{initial: 0.5s, max: 2s}}
            watchdog:
              enabled: true
              heartbeat_timeout: {HEARTBEAT_TIMEOUT_S}s
            shutdown: {{grace_period: {GRACE_S}s}}
            logs: {{dir: "${{CHAOS_LOGS}}", format: json, tee: false}}
            """)

    def spec_text(self, job: Job, endpoint: str) -> str:
        """The job's spec (the same file for every node; per-node values come from each agent's environment)."""
        k = self.args.nodes
        secret = f"\n  secret_file: {job.dir / 'job.secret'}" if job.trust else ""
        members = self.hosted_members()
        if self.args.hosted and members is not None:
            secret += f"\n  hosted_members: {members}"
        return textwrap.dedent(f"""\
            # chaos soak job {job.index} (seed {self.args.seed}); generated by bench/chaos.py
            version: 1
            name: {job.name}
            entrypoint:
              script: {WORKER}
              args: ["--steps", "{self.args.steps}", "--ckpt", "{job.dir / 'ckpt'}", "--out", "{job.out}",
                     "--step-time", "{STEP_TIME_S}"]
            nodes: "{min(2, k)}:{k}"
            nproc_per_node: 1
            env: {{OMP_NUM_THREADS: "1"}}
            rendezvous:
              backend: etcd
              hosted: {str(self.args.hosted).lower()}{{secret}}
              endpoints: {json.dumps(endpoint.split(","))}
              last_call: {LAST_CALL_S}s
              lease_ttl: {LEASE_TTL_S}s
              join_timeout: {JOIN_TIMEOUT_S}s
              connect_timeout: {CONNECT_TIMEOUT_S}s
            {{tail}}
            """).replace("{tail}", self.spec_tail()).replace("{secret}", secret)

    def hosted_members(self) -> int | None:
        """--hosted: the spec's rendezvous.hosted_members; None: not written, the default (3). The nodes here run on
        two machines as the members count them (the last node's network namespace, the others' shared address), so
        the default keeps one member (runner/rendezvous/etcd/members.py `may_grow`): the soak judges one member
        (state.args.hosted_members 1). The members are soaked on hosts (bench/soak/hosts.py)."""
        return None

    def new_job(self) -> Job:
        """Folders, spec; nodes are started by run_job(). Each job draws from its own generator, seeded with the
        soak's seed and the job's number: job N's schedule is the same whatever happened to jobs 1..N-1, and
        `--first-job N` replays it alone."""
        index = self.args.first_job + len(self.state.jobs)
        self.state.rng = random.Random(f"{self.args.seed}:{index}")
        name = f"chaos-{self.args.seed}-{index}"
        d = self.state.base / f"job{index}"
        logs = (self.state.logs_root if self.state.mounted else self.state.base / "logs") / f"job{index}"
        endpoint = self.job_endpoint()
        job = Job(index, name, os.urandom(8).hex(), d, logs, d / "job.yaml",
                  [f"n{i}" for i in range(self.args.nodes)], endpoint)
        for sub in (d, job.out, job.tmp, job.state, d / "ckpt", logs):
            sub.mkdir(parents=True, exist_ok=True)
        if self.args.hosted:  # as a user runs a hosted job: closed by its secret (docs/security.md)
            secret = d / "job.secret"
            new_secret_file(secret)
            trust = derive(read_secret(SecretSource(str(secret), "rendezvous.secret_file")), name)
            (d / "job-ca.pem").write_bytes(trust.ca_pem)
            job.trust = (d / "job-ca.pem", trust.password)
        job.spec.write_text(self.spec_text(job, endpoint))
        env = {**os.environ, "CHAOS_LOGS": str(logs)}
        done = subprocess.run([sys.executable, "-m", "runner", "validate", str(job.spec)], env=env,
                              capture_output=True, text=True, timeout=60, check=False)
        if done.returncode:
            raise RuntimeError(f"the soak's own spec is refused:\n{done.stdout}{done.stderr}")
        self.state.jobs.append(job)
        return job

    def job_endpoint(self) -> str:
        """The rendezvous endpoint of a new job (several: comma-separated)."""
        if self.args.hosted:
            host = self.state.net.host_addr if self.state.net else "127.0.0.1"
            return f"{host}:{free_port()}"
        assert self.state.etcd is not None
        net, etcd = self.state.net, self.state.etcd
        return f"{net.host_addr}:{etcd.client_port}" if net else etcd.endpoint

    # ------------------------------------------------------------------ the loop

    def tick(self, job: Job) -> None:
        """Agents' exits, due actions, due expectations; orphans reaped."""
        for a in job.agents:
            if a.code is None and a.proc.poll() is not None:
                a.code, a.ended = a.proc.returncode, time.time()
                self.state.say(f"job {job.index}: {a.label} exited {a.code}")
        for a in job.agents:
            if a.code is not None and not a.checked:
                self.checks.check_agent_end(job, a)
        now = time.monotonic()
        due = [t for t in job.timed if t[0] <= now]
        job.timed = [t for t in job.timed if t[0] > now]
        for _, _what, action in sorted(due, key=lambda t: t[0]):
            action()
        self.checks.check_expects(job)
        self.checks.check_own_etcd()
        if now >= self.next_scan:
            self.next_scan = now + 1.0
            for a in job.live():
                self.checks.scan_output(job, a)
        reap_orphans(self.procs.own_pids())

    def over(self, job: Job) -> bool:
        """No agent runs and none will be started."""
        if job.live():
            return False
        starts = [t for t in job.timed if t[1].startswith(("requeue", "late"))]
        return not starts or job.trained() or job.host_stopped

    def run_job(self, soak_end: float, only: list[str] | None = None) -> None:
        """One job: start, faults until its window closes, then its end within a bound; invariants throughout.
        `only`: the classes it draws (a make-up job's); by default every enabled one."""
        job = self.new_job()
        self.state.job = job
        self.deck = Deck(self.state.rng, only or [c for c in self.classes if c not in self.state.disabled])
        window = min(self.args.job_window, max(0.0, soak_end - time.monotonic()))
        job.quiet_from = time.monotonic() + window
        self.start_nodes(job, window)
        self.next_fault, self.pending = time.monotonic() + self.interval(), None
        end_bound = 0.0
        while not self.over(job):
            self.tick(job)
            now = time.monotonic()
            if now < job.quiet_from and now >= self.next_fault:
                self.fault_step(job, now)
            if now >= job.quiet_from and not end_bound:
                end_bound = now + self.end_bound()
                self.state.say(f"job {job.index}: no more faults; it must end within {self.end_bound():.0f} s")
            if end_bound and now > end_bound:
                raise Violation("job_completes", f"job {job.index} still runs {self.end_bound():.0f} s after its "
                                f"last fault: " + ", ".join(f"{a.label}: {state_of(a)}" for a in job.live())
                                + "\n" + tails(job))
            time.sleep(TICK_S)
        self.finish_job(job)

    def start_nodes(self, job: Job, window: float) -> None:
        """Start every node, but the late one, which starts 3-18 s later: drawn for half the jobs, and for every job
        until a late node joined once in this run (so that the class fires)."""
        late_u = [self.state.rng.random() for _ in range(3)]
        late = None
        count = self.state.tally.per_class.get("late_join")
        owed = count is not None and not count.injected
        if "late_join" not in self.state.disabled and self.args.nodes > 2 and (late_u[0] < 0.5 or owed):
            late = pick(job.nodes, late_u[1])
            self.state.tally.drawn("late_join")
        self.state.say(f"job {job.index}: {job.name}, {len(job.nodes)} nodes, {self.args.steps} steps, faults for "
                       f"{window:.0f} s{'; late node ' + late if late else ''}")
        for node in job.nodes:
            if node != late:
                self.procs.start_agent(job, node)
        if late is None:
            return
        delay = 3 + late_u[2] * 15

        def join() -> None:
            if job.trained():
                self.state.tally.no_target("late_join")
                self.state.say(f"job {job.index}: late_join of {late} found no target (the training finished first)")
                return
            agent = self.procs.start_agent(job, late)
            agent.joining = True
            self.state.record(job, "late_join", late, f"started {delay:.1f} s after the others")
            self.state.firing = "late_join"
            self.state.expect(job, "late_join_admitted", LATE_ADMIT_BOUND_S, lambda: self.admitted(job, agent),
                              lambda: f"the late node {late} did not get to RUNNING within {LATE_ADMIT_BOUND_S:g} s; "
                              f"it is in {state_of(agent)}", met=f"late node {late} RUNNING")
            self.state.firing = ""

        self.state.at(job, delay, "late join", join)

    def fault_step(self, job: Job, now: float) -> None:
        """Deal the next fault's class from the job's deck, draw its parameters, and inject it; a class with no
        target right now is tried again each second, 4 times, then counted as "no target" and put back under the
        deck (it comes up again later: a class that never finds one fails the run, see verdict.py)."""
        if self.pending is None:
            cls = self.deck.draw()
            if cls is None:
                self.next_fault = job.quiet_from
                return
            self.state.tally.drawn(cls)
            self.pending = (cls, [self.state.rng.random() for _ in range(4)], 0)
        cls, u, tries = self.pending
        if self.faults.inject(job, cls, u):
            self.pending, self.next_fault = None, now + self.interval()
        elif tries >= 4:
            self.state.tally.no_target(cls)
            self.deck.put_back(cls)
            self.state.say(f"job {job.index}: {cls} found no target (drawn again later)")
            self.pending, self.next_fault = None, now + self.interval()
        else:
            self.pending, self.next_fault = (cls, u, tries + 1), now + 1.0

    def finish_job(self, job: Job) -> None:
        """Every agent ended: restore what a fault still holds, check the job's end, count, clean up."""
        self.tick(job)
        for _, what, action in job.timed:
            if not what.startswith(("requeue", "late")):
                self.state.say(f"job {job.index}: {what} (at the job's end)")
                action()
        job.timed = []
        self.faults.restore()
        self.kv.start()
        self.checks.check_job_end(job)
        took = time.monotonic() - job.started
        for f in job.faults:
            self.state.tally.survived(f.cls)
        ends = ", ".join(f"{a.label}={a.code}{'/' + a.fate if a.fate else ''}" for a in job.agents)
        self.state.say(f"job {job.index}: ended in {took:.1f} s, {len(job.faults)} faults, invariants held; {ends}")
        self.state.outcomes.append(f"job {job.index}: {took:.0f} s, {len(job.faults)} faults"
                                   + (f", documented loss: {job.loss}" if job.loss else ", trained"))
        if not self.args.keep:
            shutil.rmtree(job.logs, ignore_errors=True)

    def admitted(self, job: Job, agent: Agent) -> bool | None:
        """The agent got to RUNNING (None: moot, it ended or got a fault, or the job finished). Once judged, the
        late node is a fault's target like any other."""
        if agent.code is not None or agent.fate or job.trained():
            agent.joining = False
            return None
        agent.joining = not any(t.get("dst") == "RUNNING" for t in console_transitions(agent))
        return not agent.joining

    def owed(self) -> list[str]:
        """The enabled classes of the deck that never fired with a target. A class can miss its chance by the draw
        alone (etcd_restart drawn only while an etcd_stop held etcd down, then the job trained): the run then gets
        one make-up job for them, and fails only if they miss it too (verdict.py)."""
        return [c for c in self.classes if c not in self.state.disabled and not self.state.tally.per_class[c].injected]

    def interval(self) -> float:
        """Seconds to the next fault: --failure-every, +-50 %."""
        return self.args.failure_every * (0.5 + self.state.rng.random())

    def end_bound(self) -> float:
        """How long a job may take to end after its last fault."""
        return 180.0 + self.args.steps * STEP_TIME_S * 3

    def run(self) -> int:
        """The soak; its exit code: 0 every invariant held and the run tried everything it was asked to, 1 an
        invariant broke or the run did not try (verdict.py), 2 the soak itself failed or was interrupted."""
        soak_end = self.state.t0 + self.args.duration
        violation: Violation | None = None
        error = ""
        try:
            self.state.make_folder()
            self.setup()
            # a new job only while a fault can still come in its window
            while not self.state.jobs or soak_end - time.monotonic() >= min(self.args.failure_every,
                                                                              self.args.job_window):
                self.run_job(soak_end)
            if owed := self.owed():
                self.state.say(f"the soak's window closed before {', '.join(owed)} fired with a target: one make-up "
                               "job, drawing only those")
                self.run_job(time.monotonic() + self.args.job_window, only=owed)
        except Violation as v:
            violation = v
            self.state.tally.broke(v.invariant)
            if v.invariant in self.state.lost:
                self.state.lost[v.invariant] += 1
        except KeyboardInterrupt:
            error = "interrupted"
        except Exception:
            error = traceback.format_exc()
        finally:
            self.teardown(keep=self.args.keep or violation is not None or bool(error))
        untried = [] if violation is not None or error else self.state.tally.failures()
        self.print_table(violation, error, untried)
        if violation is not None or untried:
            return 1
        return 2 if error else 0

    def setting(self) -> str:
        """The soak's setting, for the table's title."""
        return f"{'hosted etcd' if self.args.hosted else 'external etcd'}, {self.args.nodes} nodes"

    def extra_tables(self) -> list[str]:
        """More tables printed before the jobs' outcomes (none here)."""
        return []

    def print_table(self, violation: Violation | None, error: str, untried: list[str]) -> None:
        """Faults per class; per invariant, its checks that held, broke, did not apply; what was lost; the times
        measured; the verdict."""
        print()
        print(f"Chaos soak, seed {self.args.seed}, {time.monotonic() - self.state.t0:.0f} s, "
              f"{len(self.state.jobs)} job(s), {self.setting()}")
        print(f"Machine: {machine_line()}")
        print()
        print(table(["class", "drawn", "injected", "survived (invariants held)", "no target", "note"],
                    self.state.tally.class_rows()))
        print()
        print(table(["invariant", "held", "broke", "did not apply", "min held", "brought by"],
                    self.state.tally.invariant_rows()))
        print()
        print(table(["lost", "count"], [*([what, str(self.state.lost[key])] for key, what in self.lost_rows.items()),
                                        [ETCD_CRASHED, str(len(self.state.etcd_crashes))]]))
        if self.state.timings:
            print()
            rows = [[self.measured.get(k, k), str(len(v)), f"{statistics.median(v):.2f}", f"{max(v):.2f}"]
                    for k, v in sorted(self.state.timings.items())]
            print(table(["from the fault to", "n", "median s", "max s"], rows))
        for extra in self.extra_tables():
            print()
            print(extra)
        print()
        for line in self.state.outcomes:
            print(f"- {line}")
        for cls, why in sorted(self.state.tally.skipped().items()):
            print(f"class {cls} skipped: {why}")
        if violation is not None:
            print(f"\nFAILED: seed {self.args.seed}: invariant {violation.invariant} broke:\n{violation.detail}")
        elif error:
            print(f"\nERROR (the soak itself, not an invariant): seed {self.args.seed}:\n{error}")
        elif untried:
            print(f"\nFAILED: seed {self.args.seed}: no invariant broke, but the run did not try everything:")
            for line in untried:
                print(f"- {line}")
        else:
            skipped = "".join(f"; class {c} skipped, not fired: {why}"
                              for c, why in sorted(self.state.tally.skipped().items()))
            print(f"\nOK: every invariant held, every enabled class fired (seed {self.args.seed}){skipped}")
        print(f"Replay: {self.replay()}", flush=True)
        if (violation is not None or error) and self.state.job is not None:
            print(f"Replay only job {self.state.job.index}: {self.replay(self.state.job.index)}", flush=True)
