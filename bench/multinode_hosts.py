"""Three hosts, one node each: launch, host loss, a cut-off host and etcd's leader lost, runner vs torchrun.

Every node runs on a simulated host of its own (runner/testing/hosts.py: own network namespace and address, hostname,
/tmp and PID namespace; a lab per run, deleted after it), one worker each: bench/workers/host_beat.py (torch, gloo:
init_process_group, a stamp, then all_reduce and a beat every 0.1 s). Root only.

runner: 3 agents on hosts a, b, c (nodes "2:3", etcd backend, every rendezvous and restart setting at its default:
  lease_ttl 10 s, last_call 30 s, standbys with torch preloaded), a 1-member etcd on host "etcd".
torchrun: 3 agents on a, b, c (--nnodes 2:3 --rdzv-backend c10d --rdzv-endpoint a:29400, the store on host a, by
  its name, never loopback; --max-restarts 3 --monitor-interval 0.1), the same worker.

1. launch: first agent started -> every rank past init_process_group (taken from the launches of 2 and 3: two
   samples per run and tool);
2. host loss: `host.lose()` of a host that holds neither rank 0 nor the c10d store, --settle s after every rank got
   past init (every process of it killed at once) -> both survivors' new workers past init_process_group;
3. a cut-off host (`host.cut()`, its link down; healed once the run is over) -> its worker gone (runner: the fence),
   the others' new workers past init_process_group, and its launcher exited (still cut off);
4. etcd's leader lost during training (runner only; 3-member etcd on hosts e1-e3, election timeout 1 s, heartbeat
   0.1 s; the 3 nodes list every member): the longest gap between two beats of a worker around the loss, the time
   until `runner status` (from a login host) answers again, and whether any worker was restarted.
torchrun's figures of 2 and 3 count only what happens within --bound s; otherwise "not within".

    python bench/multinode_hosts.py [--runs 5] [--settle 8] [--bound 120] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    ROOT,
    RUNNER,
    TORCHRUN,
    Stat,
    machine_line,
    precompile,
    ratios,
    reproduce_line,
    table,
)
from runner.testing.etcd_cluster import EtcdCluster
from runner.testing.hosts import Host, HostProcess, Lab, why_not

WORKER = ROOT / "bench" / "workers" / "host_beat.py"
NODES = ("a", "b", "c")
C10D_PORT = 29400
ELECTION_TIMEOUT_S = 1.0  # runner/testing/etcd_cluster.py: --election-timeout 1000 (ms), --heartbeat-interval 100
WATCH_S = 10.0  # how long the job is watched after etcd's leader is lost
TOOLS = ("runner", "torchrun")


def wait_until(cond: Callable[[], bool], timeout: float) -> bool:
    """Poll `cond()` every 20 ms until true or `timeout` s passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


@dataclass(frozen=True)
class Stamp:
    """A worker past init_process_group: when, its rank, attempt, host and pid (as its host numbers it)."""

    time: float
    rank: int
    attempt: int
    host: str
    pid: int


def stamps(out: Path, after: float = 0.0) -> list[Stamp]:
    """Every worker past init_process_group after `after` (time.time())."""
    found = []
    for p in out.glob("past-*"):
        if p.suffix == ".tmp":
            continue
        with contextlib.suppress(OSError, ValueError):
            _, rank, attempt, host, pid = p.name.split("-")
            found.append(Stamp(float(p.read_text()), int(rank), int(attempt), host, int(pid)))
    return [s for s in found if s.time > after]


def beats(out: Path) -> dict[str, list[float]]:
    """host -> the times of its workers' beats, in order."""
    found: dict[str, list[float]] = {}
    for p in out.glob("beat-*"):
        with contextlib.suppress(OSError):
            lines = p.read_text().splitlines()
            found[p.name.removeprefix("beat-")] = sorted(float(x) for x in lines if x.strip())
    return found


def longest_gap(series: dict[str, list[float]], fault: float, end: float) -> float:
    """The longest time any host went without a beat in a stretch that covers part of [fault, end] (a host whose beats
    stopped counts up to `end`)."""
    worst = 0.0
    for times in series.values():
        before = [t for t in times if t <= fault]
        points = [before[-1] if before else fault, *[t for t in times if fault < t <= end], end]
        worst = max(worst, *(b - a for a, b in itertools.pairwise(points)))
    return worst


@dataclass
class Job:
    """One job's 3 launchers on hosts a, b, c of `lab`, their output under work/nodes/NAME."""

    tool: str
    lab: Lab
    work: Path
    endpoints: list[str] = field(default_factory=list)
    procs: dict[str, HostProcess] = field(default_factory=dict)
    t0: float = 0.0
    name: str = "bench-hosts"

    @property
    def out(self) -> Path:
        """$BENCH_OUT: the workers' stamps and beats."""
        return self.work / "out"

    def spec(self) -> Path:
        """The runner's spec: 3-node elastic job, every rendezvous and restart setting at its default."""
        spec = self.work / "job.yaml"
        spec.write_text(textwrap.dedent(f"""\
            version: 1
            name: {self.name}
            entrypoint: {{script: {WORKER}}}
            nodes: "2:3"
            nproc_per_node: 1
            rendezvous: {self.rendezvous()}
            logs: {{dir: logs, tee: false, format: json}}
            """))
        return spec

    def rendezvous(self) -> str:
        """The spec's rendezvous section, inline: the etcd on a host of its own."""
        return f"{{backend: etcd, endpoints: {json.dumps(self.endpoints)}}}"

    def argv(self) -> list[str]:
        """The launcher's command line (the same on every host: a runner's node id is its hostname)."""
        if self.tool == "runner":
            return [*RUNNER, str(self.spec())]
        return [*TORCHRUN, "--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"{NODES[0]}:{C10D_PORT}", "--rdzv-id", "bench-hosts", "--max-restarts", "3",
                "--monitor-interval", "0.1", str(WORKER)]

    def start(self) -> None:
        """Start the 3 launchers, one per host, at once (hosts already up); t0 = just before the first."""
        self.out.mkdir(parents=True, exist_ok=True)
        hosts = [self.lab.hosts.get(n) or self.lab.add(n) for n in NODES]
        argv = self.argv()
        self.t0 = time.time()
        for host in hosts:
            home = self.work / "nodes" / host.name
            home.mkdir(parents=True, exist_ok=True)
            env = host.env({"BENCH_OUT": str(self.out), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
            with (home / "stdout").open("wb") as o, (home / "stderr").open("wb") as e:
                self.procs[host.name] = host.popen(argv, cwd=home, env=env, stdout=o, stderr=e)

    def launched(self, timeout: float = 180.0) -> float | None:
        """Seconds from t0 to every rank of the first attempt past init_process_group; None if not within timeout."""
        if not wait_until(lambda: len(stamps(self.out)) >= len(NODES), timeout):
            return None
        return max(s.time for s in stamps(self.out)) - self.t0

    def victim(self) -> Host:
        """A host that holds neither rank 0 nor the c10d store (host a): c unless c holds rank 0."""
        rank0 = {s.host for s in stamps(self.out) if s.rank == 0}
        return self.lab.hosts[next(n for n in reversed(NODES[1:]) if n not in rank0)]

    def worker_of(self, host: Host) -> Stamp:
        """The first attempt's worker on `host`."""
        return next(s for s in stamps(self.out) if s.host == host.name)

    def tail(self, name: str) -> str:
        """The end of a node's stderr (for a failed run's message)."""
        with contextlib.suppress(OSError):
            return (self.work / "nodes" / name / "stderr").read_text(errors="replace")[-1500:]
        return ""


LAB_TAGS: list[str] = []  # every lab's tag (its namespaces' prefix), for the check that nothing is left


def fresh_lab(base: Path, label: str) -> Lab:
    """A new lab whose shared folder is base/label."""
    lab = Lab(base / label)
    LAB_TAGS.append(lab.tag)
    return lab


def etcd_one(lab: Lab) -> EtcdCluster:
    """The runner's 1-member etcd on a host of its own ("etcd"); started."""
    etcd = EtcdCluster([lab.add("etcd")])
    etcd.start()
    return etcd


@dataclass
class FaultRun:
    """One run of a fault: launch and the seconds from the fault to what followed (None: not within the bound)."""

    launch: float | None
    gone: float | None = None  # the victim's worker gone (cut only)
    past_init: float | None = None  # both survivors' new workers past init_process_group
    exited: float | None = None  # the victim's launcher exited (cut only)
    note: str = ""


def add_hosts(lab: Lab) -> None:
    """Hosts a, b, c, up before any clock starts."""
    for n in NODES:
        lab.add(n)


@contextlib.contextmanager
def started(tool: str, base: Path, label: str) -> Iterator[tuple[Job, float | None]]:
    """A fresh lab (the runner's etcd on a host of its own), hosts a, b, c, the job started on them: the job and
    its launch (None: it did not launch); the lab goes at the end."""
    with fresh_lab(base, label) as lab:
        etcd = etcd_one(lab) if tool == "runner" else None
        add_hosts(lab)
        job = Job(tool, lab, lab.shared / "job", etcd.endpoints if etcd else [])
        job.start()
        yield job, job.launched()


def loss_run(tool: str, run: int, base: Path, settle: float, bound: float) -> FaultRun:
    """Host loss: `lose()` of a non-master host --settle s after every rank got past init."""
    with started(tool, base, f"loss-{tool}-{run}") as (job, launch):
        if launch is None:
            return FaultRun(None, note="launch failed: " + job.tail("a"))
        time.sleep(settle)
        took = lose_and_recover(job, job.victim(), bound)
        if took is not None:
            return FaultRun(launch, past_init=took)
        return FaultRun(launch, note=f"no new workers within {bound:g} s")


def lose_and_recover(job: Job, victim: Host, bound: float) -> float | None:
    """`victim.lose()`; seconds until every survivor's new worker got past init (None: not within `bound` s)."""
    t_fault = time.time()
    victim.lose()
    survivors = [n for n in NODES if n != victim.name]

    def new() -> list[Stamp]:
        return [s for s in stamps(job.out, t_fault) if s.host in survivors]

    if wait_until(lambda: {s.host for s in new()} == set(survivors), bound):
        return max(s.time for s in new()) - t_fault
    return None


def cut_run(tool: str, run: int, base: Path, settle: float, bound: float) -> FaultRun:
    """A cut-off host: its link down --settle s after every rank got past init; healed before the lab goes."""
    with started(tool, base, f"cut-{tool}-{run}") as (job, launch):
        if launch is None:
            return FaultRun(None, note="launch failed: " + job.tail("a"))
        time.sleep(settle)
        victim = job.victim()
        old = job.worker_of(victim)
        survivors = [n for n in NODES if n != victim.name]
        t_fault = time.time()
        victim.cut()
        proc = job.procs[victim.name]
        try:
            gone_at = new_at = exit_at = None
            deadline = time.monotonic() + bound
            while None in (gone_at, new_at, exit_at) and time.monotonic() < deadline:
                now = time.time()
                if gone_at is None and not victim.alive(old.pid):
                    gone_at = now - t_fault
                if exit_at is None and proc.poll() is not None:  # a fenced agent leaves by itself, still cut off
                    exit_at = now - t_fault
                if new_at is None:
                    new = [s for s in stamps(job.out, t_fault) if s.host in survivors]
                    if {s.host for s in new} == set(survivors):
                        new_at = max(s.time for s in new) - t_fault
                time.sleep(0.02)
            code = proc.poll()
            note = f"exit code {code}" if code is not None else "still running"
            return FaultRun(launch, gone=gone_at, past_init=new_at, exited=exit_at,
                            note=f"{victim.name}'s {tool} at the end: {note}")
        finally:
            victim.heal()


@dataclass
class LeaderRun:
    """One run of etcd's leader lost while the job trains."""

    gap: float | None  # the longest gap between two beats of a worker around the loss
    status: float | None = None  # `runner status` answers again, s after the loss
    restarted: bool = False  # a worker of a later attempt appeared
    leader: str = ""
    note: str = ""


def status_ok(login: Host, spec: Path) -> bool:
    """`runner status SPEC` from the login host answers (through etcd)."""
    return login.run([*RUNNER, "status", "--json", str(spec)], timeout=30, cwd=spec.parent).returncode == 0


def leader_run(run: int, base: Path, settle: float) -> LeaderRun:
    """etcd's leader host lost while 3 nodes train on a 3-member etcd."""
    with fresh_lab(base, f"leader-{run}") as lab:
        etcd = EtcdCluster([lab.add(f"e{k}") for k in (1, 2, 3)])
        etcd.start()
        add_hosts(lab)
        login = lab.add("login")
        job = Job("runner", lab, lab.shared / "job", etcd.endpoints)
        job.start()
        if job.launched() is None:
            return LeaderRun(None, note="launch failed: " + job.tail("a"))
        time.sleep(settle)
        leader = etcd.leader()
        t_fault = time.time()
        leader.host.lose()
        status = None
        if wait_until(lambda: status_ok(login, job.work / "job.yaml"), WATCH_S):
            status = time.time() - t_fault
        time.sleep(max(0.0, t_fault + WATCH_S - time.time()))
        gap = longest_gap(beats(job.out), t_fault, t_fault + WATCH_S)
        restarted = any(s.attempt > 0 for s in stamps(job.out))
        return LeaderRun(gap, status, restarted, leader.name)


def interrupt(signum: int, _frame: FrameType | None) -> None:
    """SIGTERM/SIGHUP end the benchmark as Ctrl-C does: every `with Lab` on the stack closes its hosts."""
    raise KeyboardInterrupt(signal.Signals(signum).name)


def leftovers(base: Path) -> list[str]:
    """What of this benchmark's labs is still here: a namespace of one of its labs, a process of one of its jobs."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    found = [f"netns {line.split()[0]}" for line in netns.splitlines()
             if line.split() and line.split()[0].startswith(tuple(f"{tag}-" for tag in LAB_TAGS))]
    ps = subprocess.run(["pgrep", "-af", f"{base}|{WORKER.name}|bench-hosts"], capture_output=True, text=True,
                        check=False).stdout
    found += [f"process {line}" for line in ps.splitlines() if "pgrep" not in line]
    return found


@contextlib.contextmanager
def bench_base(script: str, prefix: str, *, keep: bool = False) -> Iterator[Path]:
    """Root's simulated hosts checked (exit with the reason where they cannot be made), SIGTERM/SIGHUP made a Ctrl-C,
    the runner precompiled; the folder for the runs' labs, checked for leftovers and removed at the end."""
    why = why_not()
    if why:
        sys.exit(f"{script}: {why}")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)
    precompile()
    base = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield base
    finally:
        left = leftovers(base)
        if left:
            print("left behind: " + "; ".join(left), file=sys.stderr)
        if keep:
            print(f"runs kept in {base}", file=sys.stderr)
        else:
            with contextlib.suppress(OSError):
                shutil.rmtree(base)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--settle", type=float, default=8.0, help="s between every rank past init and the fault")
    p.add_argument("--bound", type=float, default=120.0, help="how long a fault's outcome is waited for, s")
    p.add_argument("--keep", action="store_true", help="keep the runs' folders (their path is printed)")
    args = p.parse_args()
    start_line = machine_line()
    loss: dict[str, list[FaultRun]] = {t: [] for t in TOOLS}
    cut: dict[str, list[FaultRun]] = {t: [] for t in TOOLS}
    leader: list[LeaderRun] = []
    with bench_base("bench/multinode_hosts.py", "bench-hosts-", keep=args.keep) as base:
        for run in range(args.runs):
            for tool in TOOLS:
                loss[tool].append(loss_run(tool, run, base, args.settle, args.bound))
                print(f"loss {tool} run {run}: {loss[tool][-1]}", file=sys.stderr, flush=True)
            for tool in TOOLS:
                cut[tool].append(cut_run(tool, run, base, args.settle, args.bound))
                print(f"cut {tool} run {run}: {cut[tool][-1]}", file=sys.stderr, flush=True)
            leader.append(leader_run(run, base, args.settle))
            print(f"leader run {run}: {leader[-1]}", file=sys.stderr, flush=True)
    print(report(loss, cut, leader, args, start_line, machine_line()))


def fmt(xs: list[float | None], bound: float) -> str:
    """'median (min-max)' of the runs that had the figure, and how many had it."""
    good = [x for x in xs if x is not None]
    if not good:
        return f"not within {bound:g} s (0/{len(xs)})"
    return f"{Stat.of(good).fmt(digits=2)} ({len(good)}/{len(xs)})"


def ratio(a: list[float | None], b: list[float | None]) -> str:
    """runner/torchrun, pair by pair, over the runs where both had the figure."""
    pairs = [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None]
    if not pairs:
        return "-"
    return ratios([x for x, _ in pairs], [y for _, y in pairs]).fmt(digits=2)


def launches(runs: dict[str, list[FaultRun]], other: dict[str, list[FaultRun]], tool: str) -> list[float | None]:
    """Both launches of every run (host loss's, then the cut's)."""
    return [r.launch for pair in zip(runs[tool], other[tool], strict=True) for r in pair]


def report(loss: dict[str, list[FaultRun]], cut: dict[str, list[FaultRun]], leader: list[LeaderRun],
           args: argparse.Namespace, start_line: str, end_line: str) -> str:
    """The Markdown section."""
    b = args.bound
    rows = []
    figures: list[tuple[str, list[float | None], list[float | None]]] = [
        ("1. launch -> every rank past init", launches(loss, cut, "runner"), launches(loss, cut, "torchrun")),
        ("2. host lost -> survivors' new workers past init", [r.past_init for r in loss["runner"]],
         [r.past_init for r in loss["torchrun"]]),
        ("3. host cut off -> its worker gone", [r.gone for r in cut["runner"]], [r.gone for r in cut["torchrun"]]),
        ("3. host cut off -> the others' new workers past init", [r.past_init for r in cut["runner"]],
         [r.past_init for r in cut["torchrun"]]),
    ]
    for name, a, t in figures:
        rows.append([name, fmt(a, b), fmt(t, b), ratio(a, t)])
    gaps = [r.gap for r in leader]
    rows.append(["3. host cut off -> its launcher exited", fmt([r.exited for r in cut["runner"]], b),
                 fmt([r.exited for r in cut["torchrun"]], b), ratio([r.exited for r in cut["runner"]],
                                                                     [r.exited for r in cut["torchrun"]])])
    first = [sum(1 for r in cut[t] if r.gone is not None and (r.past_init is None or r.gone < r.past_init))
             for t in TOOLS]
    rows.append(["3. cut-off host's worker gone before the others' new ones", *(f"{n}/{len(cut[t])} runs"
                 for n, t in zip(first, TOOLS, strict=True)), "-"])
    rows.append(["4. etcd leader lost -> longest gap between beats", fmt(gaps, WATCH_S), "-", "-"])
    rows.append(["4. etcd leader lost -> `runner status` answers again", fmt([r.status for r in leader], WATCH_S),
                 "-", "-"])
    restarted = sum(r.restarted for r in leader)
    notes = [f"- cut, {tool} run {i}: {r.note}" for tool in TOOLS for i, r in enumerate(cut[tool]) if r.note]
    notes += [f"- host loss, {tool} run {i}: {r.note}" for tool in TOOLS for i, r in enumerate(loss[tool]) if r.note]
    notes += [f"- leader loss run {i}: {r.note}" for i, r in enumerate(leader) if r.note]
    return "\n".join([
        "### Three hosts: launch, host loss, a cut-off host, etcd's leader lost",
        "",
        f"Machine at the start: {start_line}",
        f"Machine at the end:   {end_line}",
        "",
        (f"{args.runs} runs; faults {args.settle:g} s after every rank got past init_process_group; torchrun's "
         f"figures count only what happened within {b:g} s of the fault. Figure 1 is taken from the launches of 2 "
         "and 3 (two per run)."),
        "",
        table(["figure, s (runs that had it)", "runner", "torchrun", "runner/torchrun"], rows),
        "",
        (f"etcd's election timeout: {ELECTION_TIMEOUT_S:g} s (heartbeat 0.1 s); leaders lost: "
         f"{', '.join(r.leader for r in leader if r.leader)}; runs where a worker was restarted after the leader's "
         f"loss: {restarted}/{len(leader)}. Target for 4: a stall under 2 x {ELECTION_TIMEOUT_S:g} s + one rendezvous "
         "round."),
        *(["", "Notes:", *notes] if notes else []),
        "",
        f"Reproduce: `{reproduce_line()}`",
    ])


if __name__ == "__main__":
    main()
