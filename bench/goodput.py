"""Goodput under failures: samples committed per second while a worker is SIGKILLed every T s, over the same arm's
failure-free rate.

Every arm runs examples/jobs/ft_train.py (a character-level transformer, gloo on the CPU) on the same W workers
with the same global batch (--global-batch sequences a step, global/W per worker):
  a: torchrun --standalone --nproc-per-node W --max-restarts 1000, --mode ddp: plain DDP, a checkpoint every K
     steps; a failure restarts every worker, which resume from the last checkpoint (the steps since are redone).
  b: runner, nproc_per_node W, the same --mode ddp command and checkpoints (its defaults: pre-warmed standbys).
  c: runner, replica_groups: N groups x W/N workers, --mode ft (TorchFT's Manager, runner's hosted lighthouse,
     min_active 1): a failure restarts the failed group only, the others step on; no checkpoint file (a restarted
     group copies the live weights from a peer). Per-group batch global/N: a step in which k of the N groups
     took part commits k x global/N samples.
Each round runs every arm without failures (--baseline-duration s), then every arm under failures (--duration s),
then every arm without failures again, all in one process, interleaved; an arm's failure-free rate is the mean of
its runs right before and right after its run under failures (the machine's speed drifts; both are reported).

The clock starts at the first step any worker prints (so the first start-up is not counted) and the run is stopped
--duration s later. From then on, every --failure-every s the injector SIGKILLs one worker drawn by
random.Random(--seed) (the same draws for every arm): the launcher's descendants whose command line runs the
script (/proc), signalled through a pidfd after /proc, with the pidfd open, still shows the same start time and the
launcher as an ancestor, so a recycled pid is never signalled. This process is a child subreaper: every process
the launchers leave behind is its own child, killed and reaped at the end of each run.

Everything is parsed from the workers' own lines (`ft_train step ... samples=S time=T`, see the script):
- committed samples: each step number counts once, at the first time any group committed it (a step redone after
  a whole-job restart is not counted twice; samples of the groups that took part in it);
- rate = committed samples in (t0, t0 + duration] / duration; goodput = rate under failures / failure-free rate
  (the mean of the two failure-free runs around it);
- steps lost per failure: (a)/(b) the steps redone (last step before the kill - the step the next attempt resumed
  at); (c) the steps the surviving groups did not commit (commit=0) around the failure;
- survivors' stall per failure: (a)/(b) every rank stalls: kill -> the first step of the next attempt; (c) the
  time the surviving groups' steps took beyond their normal step time (the median interval of the failure-free
  run), summed over the steps slower than 1.5x normal, from the kill until the killed group committed again;
- killed worker stepping again: kill -> the first step committed by the restarted worker's group.

    python bench/goodput.py --failure-every 30 --duration 300 [--seed 1] [--arms a,b,c] [--workers 2]
                            [--groups 2] [--ckpt-every 250] [--baseline-duration 60] [--rounds 1]
                            [--heartbeat-timeout 1] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import itertools
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    ROOT,
    RUNNER,
    TORCHRUN,
    argv_of,
    descendants,
    kill_tree,
    machine_line,
    precompile,
    reproduce_line,
    table,
)

SCRIPT = ROOT / "examples" / "jobs" / "ft_train.py"
LINE = re.compile(r"ft_train (start|step|final|params) ((?:\w+=\S+ ?)+)\s*$")
START_TIMEOUT_S = 180.0  # launch -> first step
STOP_GRACE_S = 30.0  # SIGTERM to the launcher -> SIGKILL of everything
NAMES = {"a": "torchrun, whole-job restart + checkpoint", "b": "runner, whole-job restart + checkpoint",
         "c": "runner, replica groups (TorchFT)"}

DDP_SPEC = """# written by bench/goodput.py: arm b
version: 1
name: goodput-ddp
entrypoint:
  script: {script}
  args: {args}
cwd: {root}
nproc_per_node: {workers}
env:
  OMP_NUM_THREADS: "1"
restart:
  max_restarts: 1000
  backoff: {{initial: 0s}}
  crash_loop: 0        # the same failure on purpose, again and again
shutdown:
  grace_period: 5s
logs:
  dir: {logs}
"""

FT_SPEC = """# written by bench/goodput.py: arm c
version: 1
name: goodput-ft
entrypoint:
  script: {script}
  args: {args}
cwd: {root}
replica_groups:
  count: {groups}
  nproc_per_node: {per_group}
  min_active: 1
  lighthouse: {{hosted: true, heartbeat_timeout: {heartbeat}}}
env:
  OMP_NUM_THREADS: "1"
restart:
  max_restarts: 1000   # per group
  backoff: {{initial: 0s}}
  crash_loop: 0
shutdown:
  grace_period: 5s
logs:
  dir: {logs}
"""


# ---------------------------------------------------------------------------------------------------------------
# Processes

def set_subreaper() -> None:
    """Become the child subreaper of everything started from here: orphans come back to us, to be reaped."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def own_children() -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/children") as f:
                out.extend(int(p) for p in f.read().split())
    return out


def reap_leftovers() -> int:
    """SIGKILL and reap every child left (orphans reparented here); how many there were. A child not yet reaped
    keeps its pid, so these signals reach the processes meant."""
    left = own_children()
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for pid in left:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return len(left)


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: the process's start time in clock ticks (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def is_worker(argv: list[str]) -> bool:
    """`python [-u] .../ft_train.py ...`: a worker (torchrun's own command line names the script further on)."""
    return (len(argv) >= 2 and Path(argv[0]).name.startswith("python")
            and any(a.endswith("ft_train.py") for a in argv[1:3]))


def workers_of(launcher: int) -> list[tuple[int, int]]:
    """(pid, start time) of the launcher's workers right now."""
    out = []
    for pid in descendants(launcher):
        st = start_time(pid)
        if st is not None and is_worker(argv_of(pid)):
            out.append((pid, st))
    return out


def sigkill_checked(launcher: int, pid: int, st: int) -> bool:
    """SIGKILL `pid` through a pidfd, only if with the pidfd open /proc still shows its start time `st` and the
    launcher among its ancestors: the pidfd names one process, so the checks and the signal are about the same."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if start_time(pid) != st or pid not in descendants(launcher):
            return False
        signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
        return False
    else:
        return True
    finally:
        os.close(fd)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the launcher's process group (both stop their workers on it), SIGKILL all after STOP_GRACE_S."""
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid, grace=0)
            proc.wait(timeout=STOP_GRACE_S)
    reap_leftovers()


# ---------------------------------------------------------------------------------------------------------------
# The workers' lines

@dataclass
class Rec:
    kind: str
    f: dict[str, str]

    @property
    def t(self) -> float:
        return float(self.f["time"])

    def i(self, key: str) -> int:
        return int(self.f[key])


class Lines:
    """Incremental reader of the launcher's output (the workers' lines, tee'd or inherited)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.recs: list[Rec] = []

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for raw in lines:
            m = LINE.search(raw.decode(errors="replace"))
            if m:
                with contextlib.suppress(ValueError):
                    self.recs.append(Rec(m.group(1), dict(kv.split("=", 1) for kv in m.group(2).split())))

    def steps(self) -> list[Rec]:
        return [r for r in self.recs if r.kind == "step"]


@dataclass
class Kill:
    t: float
    pid: int
    group: int | None
    rank: int | None


@dataclass
class Run:
    arm: str
    failures: bool
    duration: float
    t0: float | None = None
    recs: list[Rec] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    error: str = ""
    leftovers: int = 0
    load: tuple[float, float] = (0.0, 0.0)  # 1-min load average at the start and at the end
    machine: str = ""  # bench.common.machine_line() at the end


def run_once(arm: str, argv: list[str], work: Path, *, duration: float, failure_every: float | None,
             seed: int) -> Run:
    """Launch, wait for the first step, inject failures, stop at t0 + duration; everything killed and reaped."""
    run = Run(arm, failure_every is not None, duration, load=(os.getloadavg()[0], 0.0))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log = work / "launcher.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    rng = random.Random(seed)
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, cwd=work, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    lines = Lines(log)
    started = time.monotonic()
    next_kill = None
    try:
        while True:
            time.sleep(0.1)
            lines.poll()
            if proc.poll() is not None:
                run.error = f"the launcher exited with {proc.returncode} before the end"
                break
            now = time.time()
            if run.t0 is None:
                first = lines.steps()
                if first:
                    run.t0 = first[0].t
                    next_kill = run.t0 + failure_every if failure_every else None
                elif time.monotonic() - started > START_TIMEOUT_S:
                    run.error = f"no step within {START_TIMEOUT_S:.0f} s of the launch"
                    break
                continue
            if now >= run.t0 + duration:
                break
            if next_kill is not None and now >= next_kill:
                run.kills.append(inject(proc.pid, lines, rng))
                next_kill += failure_every
    finally:
        stop(proc)
        run.leftovers = reap_leftovers()
    lines.poll()
    run.recs = lines.recs
    starts = [(r.i("group"), r.i("rank")) for r in run.recs if r.kind == "start"]
    if not run.error and failure_every is None and len(starts) != len(set(starts)):
        run.error = "a worker started twice in a failure-free run"
    run.load = (run.load[0], os.getloadavg()[0])
    run.machine = machine_line()
    return run


def inject(launcher: int, lines: Lines, rng: random.Random) -> Kill:
    """SIGKILL one worker drawn by `rng` among the launcher's workers, ordered by (group, rank) from their start
    lines (the same draw picks the same role in every arm)."""
    lines.poll()
    roles = {r.i("pid"): (r.i("group"), r.i("rank")) for r in lines.recs if r.kind == "start"}
    found = sorted(workers_of(launcher), key=lambda w: (roles.get(w[0], (99, 99)), w[0]))
    t = time.time()
    if not found:
        return Kill(t, 0, None, None)
    pid, st = found[rng.randrange(len(found))]
    if not sigkill_checked(launcher, pid, st):
        return Kill(t, 0, None, None)
    group, rank = roles.get(pid, (None, None))
    return Kill(t, pid, group, rank)


# ---------------------------------------------------------------------------------------------------------------
# Figures

def first_commits(run: Run) -> dict[int, tuple[float, int]]:
    """step -> (time, samples) of the first commit of each step number."""
    first: dict[int, tuple[float, int]] = {}
    for r in run.recs:
        if r.kind == "step" and r.f.get("commit") == "1":
            s = r.i("step")
            if s not in first or r.t < first[s][0]:
                first[s] = (r.t, r.i("samples"))
    return first


def rate(run: Run) -> float | None:
    """Committed samples per second in (t0, t0 + duration]."""
    if run.t0 is None or run.error:
        return None
    end = run.t0 + run.duration
    return sum(n for t, n in first_commits(run).values() if run.t0 < t <= end) / run.duration


def normal_interval(run: Run) -> dict[int, float]:
    """group -> median interval between its consecutive step lines (a failure-free run)."""
    out = {}
    for g in {r.i("group") for r in run.recs if r.kind == "step"}:
        ts = [r.t for r in run.recs if r.kind == "step" and r.i("group") == g]
        gaps = [b - a for a, b in itertools.pairwise(ts)]
        if gaps:
            out[g] = statistics.median(gaps)
    return out


@dataclass
class PerFailure:
    lost: list[float] = field(default_factory=list)  # steps
    stall: list[float] = field(default_factory=list)  # seconds
    back: list[float] = field(default_factory=list)  # seconds: kill -> the killed worker's group stepping again


def per_failure(run: Run, normal: dict[int, float]) -> PerFailure:
    out = PerFailure()
    steps = [r for r in run.recs if r.kind == "step"]
    starts = [r for r in run.recs if r.kind == "start"]
    for k in run.kills:
        if not k.pid:
            continue
        if run.arm in ("a", "b"):
            before = [r.i("step") for r in steps if r.t <= k.t]
            nxt = next((s for s in starts if s.t > k.t and s.i("rank") == 0), None)
            if not before or nxt is None:
                continue
            first = next((r for r in steps if r.t > nxt.t), None)
            out.lost.append(max(before) - nxt.i("resumed"))
            if first is not None:
                out.stall.append(first.t - k.t)
                out.back.append(first.t - k.t)
            continue
        g = k.group
        restarted = next((s for s in starts if s.t > k.t and s.i("group") == g and s.i("rank") == 0), None)
        if g is None or restarted is None:
            continue
        back = next((r for r in steps if r.t > restarted.t and r.i("group") == g and r.f["commit"] == "1"), None)
        if back is None:
            continue
        out.back.append(back.t - k.t)
        survivors = [r for r in steps if r.i("group") != g and k.t - 1.0 <= r.t <= back.t + 1.0]
        out.lost.append(sum(r.f["commit"] == "0" for r in survivors if r.t >= k.t))
        stall = 0.0
        for sg in {r.i("group") for r in survivors}:
            ts = [r.t for r in survivors if r.i("group") == sg]
            norm = normal.get(sg)
            if norm is None:
                continue
            stall = max(stall, sum(b - a - norm for a, b in itertools.pairwise(ts) if b - a > 1.5 * norm))
        out.stall.append(stall)
    return out


def bracket(fail: Run, oks: list[Run]) -> list[Run]:
    """The same arm's failure-free runs right before and right after `fail` (the machine's speed drifts: the
    failure-free rate is the mean of the two)."""
    if fail.t0 is None:
        return []
    before = [o for o in oks if o.t0 is not None and o.t0 < fail.t0]
    after = [o for o in oks if o.t0 is not None and o.t0 > fail.t0]
    return ([max(before, key=lambda o: o.t0 or 0.0)] if before else []) + (
        [min(after, key=lambda o: o.t0 or 0.0)] if after else [])


def fmt(xs: list[float], digits: int = 2) -> str:
    if not xs:
        return "-"
    med = statistics.median(xs)
    return f"{med:.{digits}f} ({min(xs):.{digits}f}-{max(xs):.{digits}f})" if len(xs) > 1 else f"{med:.{digits}f}"


# ---------------------------------------------------------------------------------------------------------------

def commands(args: argparse.Namespace, work: Path) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Each arm's command (run from its own folder) and the runner specs written for it."""
    common = ["--steps", "1000000000", "--global-batch", str(args.global_batch)]
    ckpt = ["--ckpt-dir", "ckpt", "--ckpt-every", str(args.ckpt_every)]  # relative: each run's own folder
    ddp_args = ["--mode", "ddp", *common, *ckpt]
    specs: dict[str, str] = {}
    specs["b"] = DDP_SPEC.format(script=SCRIPT, args=json.dumps(ddp_args), root="${GOODPUT_RUN_DIR}",
                                 workers=args.workers, logs="runner-logs")
    specs["c"] = FT_SPEC.format(script=SCRIPT, args=json.dumps(["--mode", "ft", *common]), root="${GOODPUT_RUN_DIR}",
                                groups=args.groups, per_group=args.workers // args.groups,
                                heartbeat=f"{args.heartbeat_timeout:g}s", logs="runner-logs")
    cmds: dict[str, list[str]] = {
        "a": [*TORCHRUN, "--standalone", "--nproc-per-node", str(args.workers), "--max-restarts", "1000",
              str(SCRIPT), *ddp_args],
    }
    for arm in ("b", "c"):
        path = work / f"{arm}.yaml"
        path.write_text(specs[arm])
        cmds[arm] = [*RUNNER, str(path)]
    return cmds, specs


def validate(argv: list[str]) -> str:
    """'' when runner accepts the spec, else its complaint (an arm this checkout cannot run)."""
    res = subprocess.run([*argv[:-1], "validate", argv[-1]], capture_output=True, text=True, timeout=60,
                         check=False, env={**os.environ, "GOODPUT_RUN_DIR": str(ROOT)})
    return "" if res.returncode == 0 else (res.stderr or res.stdout).strip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--failure-every", type=float, default=30.0, help="seconds between two SIGKILLs")
    p.add_argument("--duration", type=float, default=300.0, help="seconds measured under failures, per arm")
    p.add_argument("--baseline-duration", type=float, default=None,
                   help="seconds measured without failures, per arm (default: min(duration, 60))")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--arms", default="a,b,c")
    p.add_argument("--workers", type=int, default=2, help="W: workers of every arm")
    p.add_argument("--groups", type=int, default=2, help="N: arm c's replica groups (W/N workers each)")
    p.add_argument("--global-batch", type=int, default=32, help="sequences per step over all W workers")
    p.add_argument("--ckpt-every", type=int, default=250, help="arms a/b: steps between checkpoints")
    p.add_argument("--heartbeat-timeout", type=float, default=1.0,
                   help="arm c: the lighthouse's heartbeat_timeout, seconds (TorchFT's default: 5)")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds of every arm")
    p.add_argument("--keep", default=None, help="copy every run's folder (launcher.log, logs) here")
    p.add_argument("--report-from", default=None, help="print the report of the runs kept in this folder (--keep)")
    args = p.parse_args()
    if args.report_from:
        report_from(args, Path(args.report_from))
        return
    if args.workers % args.groups or args.global_batch % args.workers:
        p.error("--workers must be a multiple of --groups, and --global-batch of --workers")
    baseline = args.baseline_duration or min(args.duration, 60.0)
    arms = [a for a in args.arms.split(",") if a]
    precompile()
    set_subreaper()
    with tempfile.TemporaryDirectory(prefix="bench-goodput-") as tmp:
        work = Path(tmp)
        cmds, specs = commands(args, work)
        for arm in [a for a in arms if a in ("b", "c")]:
            why = validate(cmds[arm])
            if why:
                print(f"arm {arm} skipped: runner refuses its spec: {why}", file=sys.stderr)
                arms.remove(arm)
        runs: dict[tuple[str, bool], list[Run]] = {}
        for rnd in range(args.rounds):
            for phase, failures in (("ok", False), ("fail", True), ("ok2", False)):
                for arm in arms:
                    folder = work / f"{arm}-{phase}-{rnd}"
                    os.environ["GOODPUT_RUN_DIR"] = str(folder)
                    r = run_once(arm, cmds[arm], folder, duration=args.duration if failures else baseline,
                                 failure_every=args.failure_every if failures else None, seed=args.seed + rnd)
                    runs.setdefault((arm, failures), []).append(r)
                    rt = rate(r)
                    print(f"round {rnd} arm {arm} {'failures' if failures else 'failure-free'}: "
                          f"{'-' if rt is None else f'{rt:.1f}'} samples/s, {sum(bool(k.pid) for k in r.kills)} "
                          f"kills, load {r.load[0]:.2f}->{r.load[1]:.2f}{'; ' + r.error if r.error else ''}"
                          f"{f'; {r.leftovers} leftover process(es) reaped' if r.leftovers else ''}", file=sys.stderr)
                    if args.keep:
                        keep = Path(args.keep) / folder.name
                        shutil.copytree(folder, keep, dirs_exist_ok=True)
                        save(r, keep / "run.json", rnd)
        report(args, arms, cmds, specs, runs, baseline)


def report_from(args: argparse.Namespace, kept_dir: Path) -> None:
    """The report of runs kept by an earlier --keep (the same flags give the same table)."""
    kept: dict[tuple[str, bool], list[tuple[int, Run]]] = {}
    for folder in sorted(kept_dir.iterdir()):
        if (folder / "run.json").exists():
            rnd, r = load(folder)
            kept.setdefault((r.arm, r.failures), []).append((rnd, r))
    runs = {k: [r for _, r in sorted(v, key=lambda x: x[0])] for k, v in kept.items()}
    arms = [a for a in args.arms.split(",") if any(k[0] == a for k in runs)]
    with tempfile.TemporaryDirectory(prefix="bench-goodput-") as tmp:
        cmds, specs = commands(args, Path(tmp))
        report(args, arms, cmds, specs, runs, args.baseline_duration or min(args.duration, 60.0))


def save(run: Run, path: Path, rnd: int) -> None:
    """What the logs do not say (the kills, the clock's start), for --report-from."""
    meta = {k: v for k, v in vars(run).items() if k != "recs"}
    meta["kills"] = [vars(k) for k in run.kills]
    meta["round"] = rnd
    path.write_text(json.dumps(meta))


def load(folder: Path) -> tuple[int, Run]:
    meta = json.loads((folder / "run.json").read_text())
    lines = Lines(folder / "launcher.log")
    lines.poll()
    kills = [Kill(**k) for k in meta.pop("kills")]
    rnd = meta.pop("round")
    run = Run(**{**meta, "load": tuple(meta["load"])}, recs=lines.recs, kills=kills)
    return rnd, run


def steady_rate(run: Run) -> float | None:
    """The run's own rate when nothing fails: the samples of a step every group took part in / the mean interval
    between group 0's consecutive step lines, leaving out the intervals over 3x the median (the stalls a failure
    causes). Immune to the machine's drift between runs; a failure's stall and lost steps are what it misses."""
    steps = [r for r in run.recs if r.kind == "step" and r.i("group") == 0 and r.f["commit"] == "1"]
    gaps = [b.t - a.t for a, b in itertools.pairwise(steps) if b.t > a.t]
    full = max((r.i("samples") for r in steps), default=0)
    if not gaps or not full:
        return None
    cap = 3 * statistics.median(gaps)
    return full / statistics.mean(g for g in gaps if g <= cap)


@dataclass
class ArmSummary:
    goodput: list[float] = field(default_factory=list)  # per run under failures
    own: list[float] = field(default_factory=list)  # rate under failures / the same run's steady rate
    kills: int = 0
    pf: PerFailure = field(default_factory=PerFailure)


def summarize(oks: list[Run], fails: list[Run]) -> ArmSummary:
    out = ArmSummary(kills=sum(sum(bool(k.pid) for k in f.kills) for f in fails))
    for f in fails:
        around = bracket(f, oks)
        base = [x for x in (rate(o) for o in around) if x]
        got, steady = rate(f), steady_rate(f)
        if base and got is not None:
            out.goodput.append(got / statistics.mean(base))
        if steady and got is not None:
            out.own.append(got / steady)
        if around:
            one = per_failure(f, normal_interval(around[0]))
            out.pf.lost += one.lost
            out.pf.stall += one.stall
            out.pf.back += one.back
    return out


def report(args: argparse.Namespace, arms: list[str], cmds: dict[str, list[str]], specs: dict[str, str],
           runs: dict[tuple[str, bool], list[Run]], baseline: float) -> None:
    last = max((r for rs in runs.values() for r in rs), key=lambda r: r.t0 or 0.0, default=None)
    print(f"### Goodput under failures ({args.workers} workers, global batch {args.global_batch}; a SIGKILL every "
          f"{args.failure_every:g} s for {args.duration:g} s, seed {args.seed}; "
          f"{last.machine if last and last.machine else machine_line()})\n")
    rows = []
    sums: dict[str, ArmSummary] = {}
    for arm in arms:
        oks, fails = runs.get((arm, False), []), runs.get((arm, True), [])
        sm = sums[arm] = summarize(oks, fails)
        per_kill = len(fails) * args.duration / sm.kills if sm.kills else 0.0
        errors = "; ".join(sorted({r.error for r in oks + fails if r.error}))
        layout = (f"{args.groups} x {args.workers // args.groups}" if arm == "c" else f"1 x {args.workers}")
        rows.append([f"({arm}) {NAMES[arm]}", layout, fmt([x for x in (rate(o) for o in oks) if x], 1),
                     fmt([x for x in (rate(f) for f in fails) if x is not None], 1), f"**{fmt(sm.goodput, 3)}**",
                     fmt(sm.own, 3), str(sm.kills), fmt([(1 - g) * per_kill for g in sm.goodput]),
                     fmt([(1 - g) * per_kill for g in sm.own]), fmt(sm.pf.lost, 1), fmt(sm.pf.stall),
                     fmt(sm.pf.back), errors or "-"])
    print(table(["arm", "groups x workers", "failure-free samples/s (before, after)", "under failures samples/s",
                 "goodput", "goodput vs the run's own steady rate", "failures", "time lost / failure s",
                 "(vs own steady rate) s", "steps lost / failure", "survivors' stall / failure s",
                 "killed worker's group stepping again after s", "errors"], rows))
    print()
    for base in ("a", "b"):
        c, b = sums.get("c"), sums.get(base)
        if c and b and c.goodput and b.goodput:
            print(f"- (c) - ({base}): {statistics.median(c.goodput) - statistics.median(b.goodput):+.3f} goodput, "
                  f"{statistics.median(c.own) - statistics.median(b.own):+.3f} against each run's own steady rate")
    loads = [x for rs in runs.values() for r in rs for x in r.load] or [0.0]
    print(f"\nFailure-free runs {baseline:g} s each, runs under failures {args.duration:g} s each (clock from the "
          f"first step); checkpoint every {args.ckpt_every} steps (a/b); lighthouse heartbeat_timeout "
          f"{args.heartbeat_timeout:g} s (c); 1-min load average during the runs {min(loads):.2f}-{max(loads):.2f}. "
          "Medians (min-max) over the failures. The run's own steady rate: a full step's samples / the mean "
          "interval between its steps, stalls (> 3x the median) left out: insensitive to the machine's drift "
          "between runs.")
    print("\nCommands (each run in a fresh folder, GOODPUT_RUN_DIR; arm c's spec is the runner spec below):")
    for arm in arms:
        print(f"- ({arm}): `{' '.join(os.path.relpath(a, ROOT) if a.startswith('/') else a for a in cmds[arm])}`")
    for arm in [a for a in arms if a in specs]:
        print(f"\n({arm}) spec:\n```yaml\n{specs[arm].replace(str(ROOT) + '/', '')}```")
    print(f"\nReproduce: `{reproduce_line()}`")


if __name__ == "__main__":
    main()
