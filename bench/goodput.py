"""Goodput under failures, the field's way: samples committed per second while a worker is SIGKILLed every F s,
against one reference (the best failure-free samples/s of the arms that train as plain torchrun DDP does) and against the arm's own
failure-free rate, in a realistic regime (steps of >= 250 ms, checkpoints at a user's cadence), over rounds.

Every arm trains the same model on the same data with the same global batch (examples/jobs/ft_train.py: a
character-level transformer, gloo on the CPU; by default d_model 256, 4 layers, 128-character windows, 32
sequences a step: 0.3-0.4 s a step on 2 workers of a 2-CPU machine), on the same W workers:
  ref    torchrun --standalone --nproc-per-node W, --mode ddp, no checkpoint: plain DDP, failure-free only.
  a      torchrun ... --max-restarts 1000, --mode ddp, a checkpoint every --ckpt-every steps: a failure restarts
         every worker, which resume from the last checkpoint (the steps since are redone).
  b      runner, nproc_per_node W, the same command and checkpoints (runner's defaults: pre-warmed standbys).
  c      runner, replica_groups: N groups x W/N workers, --mode ft: TorchFT's Manager every step (asynchronous
         quorum, runner's hosted lighthouse, min_active 1); a failure restarts the failed group only, which copies
         the live weights from a peer (no checkpoint file). Per-group batch global/N.
  c-pin  c with group k's workers pinned to the k-th of N equal shares of --cpus (sched_setaffinity in the worker,
         ft_train.py --cpus): a survivor cannot speed up on the cores of the group that died. The other arms get
         the same cores in all (with W = N = 2 on 2 CPUs: ref/a/b's 2 workers on CPUs 0-1, c-pin's groups on CPU 0
         and CPU 1).
  d      runner, replica_groups, TorchFT's LocalSGD (examples/jobs/ft_local_sgd.py): each group steps alone and the
         groups average their weights every --sync-every steps; d-pin: pinned as c-pin.
Every launcher itself runs with the affinity of --cpus.

Each round runs every arm failure-free (--baseline-duration s), then every arm under a failure every F s for each F
of --failure-every (for --periods x F s), the arms in an order rotated each round. The clock (t0) starts at the
first step in which every group took part: the start-up is not measured (with LocalSGD the first group to start
syncs alone, and the others join at its next sync). In period i of a run (t0 + i F, t0 + (i+1) F], one worker,
drawn by random.Random, is SIGKILLed at a moment drawn uniformly in the middle 80% of the period: the same draws
for every arm in a round (so the same moments and roles), other draws in the next round. The kill goes through a
pidfd, after /proc with the pidfd open still shows the same start time and the launcher as an ancestor (a
recycled pid is never signalled). This process is a child subreaper: whatever the launchers leave behind is killed and reaped.

Figures, from the workers' own lines (`ft_train step ... samples=S time=T`, see the scripts):
- committed samples: each step number counts once, at the first time any group committed it (a step redone after
  a whole-job restart is not counted twice); rate = committed samples in (t0, t0 + duration] / duration;
- reference of a round = the highest failure-free rate of the arms that train as plain DDP does (every step
  synchronous: ref, a, b, c, c-pin) in that round; LocalSGD (d) trains another algorithm (its samples are not equal
  progress) and is measured against the reference, never its source;
- vs reference = rate under failures / the round's reference; vs own = rate under failures / the same arm's
  failure-free rate in that round. Medians (min-max) over the rounds. A ratio above 1 is flagged: it cannot be
  real (the machine drifted between runs, or a survivor used a dead group's cores);
- checkpoint cost: the seconds rank 0 spends in torch.save + rename (`ft_train ckpt ... seconds=`), its interval
  in steps and in seconds (steps x the failure-free step time);
- per failure: steps lost ((a)/(b) the steps redone; (c)/(d) the steps/syncs the survivors did not commit), the
  survivors' stall ((a)/(b) kill -> the next attempt's first step; (c)/(d) the survivors' step intervals beyond
  1.5x their failure-free median, summed from the kill until the killed group committed again), the killed
  worker's group committing again (kill -> its first committed step).

The full measurement (about 60 minutes on a 2-CPU machine: 3 rounds x (6 failure-free runs of 30 s + 5 arms x
(120 s + 60 s) under failures), plus about 6 s of start and stop per run):

    python bench/goodput.py --rounds 3

A smoke run of every arm (about 6 minutes): python bench/goodput.py --rounds 1 --periods 1 --failure-every 30
--baseline-duration 20 --ckpt-every 30. Options: [--arms ref,a,b,c,c-pin,d-pin] [--failure-every 60,30] [--periods 2]
[--baseline-duration 30] [--seed 1] [--workers 2] [--groups 2] [--global-batch 32] [--d-model 256] [--layers 4]
[--block 128] [--ckpt-every 100] [--sync-every 10] [--heartbeat-timeout 1] [--quorum-tick 0.01] [--cpus 0,1]
[--keep DIR] [--report-from DIR]
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
from importlib.metadata import PackageNotFoundError, version
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

FT_SCRIPT = ROOT / "examples" / "jobs" / "ft_train.py"
LSGD_SCRIPT = ROOT / "examples" / "jobs" / "ft_local_sgd.py"
SCRIPTS = (FT_SCRIPT.name, LSGD_SCRIPT.name)
LINE = re.compile(r"ft_train (start|step|inner|final|params|ckpt) ((?:\w+=\S+ ?)+)\s*$")
START_TIMEOUT_S = 180.0  # launch -> first step
STOP_GRACE_S = 30.0  # SIGTERM to the launcher -> SIGKILL of everything
REALISTIC_STEP_S = 0.25
SETTLE_S = 30.0  # LocalSGD: how long after the window to wait for the sync that decides its last inner steps
ARMS = ("ref", "a", "b", "c", "c-pin", "d", "d-pin")
DEFAULT_ARMS = "ref,a,b,c,c-pin,d-pin"
NAMES = {
    "ref": "reference: torchrun DDP, no checkpoint",
    "a": "torchrun, whole-job restart + checkpoint",
    "b": "runner, whole-job restart + checkpoint",
    "c": "runner, replica groups (TorchFT, every step)",
    "c-pin": "runner, replica groups (TorchFT, every step), pinned",
    "d": "runner, replica groups (TorchFT LocalSGD)",
    "d-pin": "runner, replica groups (TorchFT LocalSGD), pinned",
}
WHOLE_JOB = ("ref", "a", "b")
SYNCHRONOUS = ("ref", "a", "b", "c", "c-pin")  # every step synchronous across all workers: plain DDP's algorithm

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

FT_SPEC = """# written by bench/goodput.py: arm {arm}
version: 1
name: goodput-{arm}
entrypoint:
  script: {script}
  args: {args}
cwd: {root}
replica_groups:
  count: {groups}
  nproc_per_node: {per_group}
  min_active: 1
  lighthouse: {{hosted: true, heartbeat_timeout: {heartbeat}, quorum_tick: {tick}}}
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
    """`python [-u] .../ft_train.py ...` (or ft_local_sgd.py): a worker (torchrun's own command line names the
    script further on)."""
    return (len(argv) >= 2 and Path(argv[0]).name.startswith("python")
            and any(Path(a).name in SCRIPTS for a in argv[1:3]))


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


@dataclass
class Kill:
    t: float
    pid: int
    group: int | None
    rank: int | None


@dataclass
class Run:
    arm: str
    every: float  # seconds between failures; 0: failure-free
    duration: float
    rnd: int = 0
    t0: float | None = None
    recs: list[Rec] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    error: str = ""
    leftovers: int = 0
    load: tuple[float, float] = (0.0, 0.0)  # 1-min load average at the start and at the end


def kill_moments(every: float, duration: float, seed: int) -> tuple[list[float], random.Random]:
    """Offsets from t0 of the kills (one in the middle 80% of each period) and the generator that draws the
    workers: the same (every, seed) give the same moments and draws in every arm."""
    rng = random.Random(seed)
    periods = int(duration // every + 1e-9)
    return [every * (i + rng.uniform(0.1, 0.9)) for i in range(periods)], rng


def run_once(arm: str, argv: list[str], work: Path, cpus: set[int], *, duration: float, every: float,
             seed: int, rnd: int, groups: int) -> Run:
    """Launch, wait for the first step every group took part in (t0), inject failures, stop at t0 + duration;
    everything killed and reaped."""
    run = Run(arm, every, duration, rnd, load=(os.getloadavg()[0], 0.0))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log = work / "launcher.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "GOODPUT_RUN_DIR": str(work)}
    moments, rng = kill_moments(every, duration, seed) if every else ([], random.Random(seed))
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, cwd=work, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: os.sched_setaffinity(0, cpus))  # noqa: PLW1509 - no threads here
    lines = Lines(log)
    started = time.monotonic()
    try:
        while True:
            time.sleep(0.1)
            lines.poll()
            if proc.poll() is not None:
                run.error = f"the launcher exited with {proc.returncode} before the end"
                break
            now = time.time()
            if run.t0 is None:
                first = [r for r in lines.recs if r.kind == "step" and r.i("groups") >= groups]
                if first:
                    run.t0 = first[0].t
                elif time.monotonic() - started > START_TIMEOUT_S:
                    run.error = f"no step within {START_TIMEOUT_S:.0f} s of the launch"
                    break
                continue
            if now >= run.t0 + duration and settled(lines, run.t0 + duration, now):
                break
            if moments and now >= run.t0 + moments[0]:
                moments.pop(0)
                run.kills.append(inject(proc.pid, lines, rng))
    finally:
        stop(proc)
        run.leftovers = reap_leftovers()
    lines.poll()
    run.recs = lines.recs
    starts = [(r.i("group"), r.i("rank")) for r in run.recs if r.kind == "start"]
    if not run.error and not every and len(starts) != len(set(starts)):
        run.error = "a worker started twice in a failure-free run"
    run.load = (run.load[0], os.getloadavg()[0])
    return run


def settled(lines: Lines, end: float, now: float) -> bool:
    """Every inner step before `end` is decided: its process committed a sync after `end`, or died (a LocalSGD
    run goes on until each group synced once past the window, at most SETTLE_S; other runs stop at once)."""
    inner = [r for r in lines.recs if r.kind == "inner" and r.t <= end]
    if not inner or now > end + SETTLE_S:
        return True
    latest = {r.i("group"): r.i("pid") for r in lines.recs if r.kind == "start" and r.i("rank") == 0}
    pending = {r.i("pid") for r in inner} & set(latest.values())  # alive (as far as we know) with steps to decide
    synced = {r.i("pid") for r in lines.recs if r.kind == "step" and r.t > end}
    return pending <= synced


def inject(launcher: int, lines: Lines, rng: random.Random) -> Kill:
    """SIGKILL one worker drawn by `rng` among the launcher's workers, ordered by (group, rank) from their start
    lines (the same draw picks the same role in every arm)."""
    lines.poll()
    roles = {r.i("pid"): (r.i("group"), r.i("rank")) for r in lines.recs if r.kind == "start"}
    found = sorted(workers_of(launcher), key=lambda w: (roles.get(w[0], (99, 99)), w[0]))
    t = time.time()
    draw = rng.random()  # drawn whatever is found: the next draws stay the same in every arm
    if not found:
        return Kill(t, 0, None, None)
    pid, st = found[int(draw * len(found))]
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


def inner_commits(run: Run) -> list[tuple[float, int]]:
    """LocalSGD: (time, samples) of every inner step a later sync of the same process committed."""
    out: list[tuple[float, int]] = []
    pending: dict[int, list[tuple[float, int]]] = {}
    for r in run.recs:
        if r.kind == "inner":
            pending.setdefault(r.i("pid"), []).append((r.t, r.i("samples")))
        elif r.kind == "step" and "pid" in r.f and r.f.get("commit") == "1":
            out += pending.pop(r.i("pid"), [])
    return out


def rate(run: Run) -> float | None:
    """Committed samples per second in (t0, t0 + duration]: each step number once (its first commit); for LocalSGD
    each inner step at its own time, once a sync committed it (no jump at each sync)."""
    if run.t0 is None or run.error:
        return None
    end = run.t0 + run.duration
    commits = inner_commits(run) if any(r.kind == "inner" for r in run.recs) else first_commits(run).values()
    return sum(n for t, n in commits if run.t0 < t <= end) / run.duration


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
        if run.arm in WHOLE_JOB:
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


def fmt(xs: list[float], digits: int = 2, flag_above_one: bool = False) -> str:
    """median (min-max); with flag_above_one, a median or max above 1 is marked as an artefact."""
    if not xs:
        return "-"
    med = statistics.median(xs)
    text = f"{med:.{digits}f} ({min(xs):.{digits}f}-{max(xs):.{digits}f})" if len(xs) > 1 else f"{med:.{digits}f}"
    if flag_above_one and max(xs) > 1.0:
        text += " ⚠ >1: artefact"
    return text


# ---------------------------------------------------------------------------------------------------------------
# Commands

def group_cpus(cpus: list[int], groups: int) -> str:
    """ft_train.py --cpus: the CPUs split into `groups` equal shares, '|'-separated ("0|1")."""
    share = max(1, len(cpus) // groups)
    return "|".join(",".join(str(c) for c in cpus[k * share:(k + 1) * share] or cpus) for k in range(groups))


def commands(args: argparse.Namespace, work: Path, cpus: list[int]) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Each arm's command (run from its own folder) and the runner specs written for it."""
    model = ["--global-batch", str(args.global_batch), "--d-model", str(args.d_model), "--layers", str(args.layers),
             "--block", str(args.block)]
    all_cpus = ["--cpus", ",".join(map(str, cpus))]  # one list: every worker may run on any of them
    pinned = ["--cpus", group_cpus(cpus, args.groups)]
    ddp = ["--mode", "ddp", "--steps", "1000000000", *model, *all_cpus]
    ckpt = ["--ckpt-dir", "ckpt", "--ckpt-every", str(args.ckpt_every)]  # relative: each run's own folder
    ft = ["--mode", "ft", "--steps", "1000000000", *model]
    lsgd = ["--outer-steps", "1000000000", "--sync-every", str(args.sync_every), *model]
    per_group = args.workers // args.groups
    fill = {"root": "${GOODPUT_RUN_DIR}", "groups": args.groups, "per_group": per_group,
            "heartbeat": f"{args.heartbeat_timeout:g}s", "tick": f"{args.quorum_tick * 1000:g}ms",
            "logs": "runner-logs"}
    specs = {
        "b": DDP_SPEC.format(script=FT_SCRIPT, args=json.dumps([*ddp, *ckpt]), root="${GOODPUT_RUN_DIR}",
                             workers=args.workers, logs="runner-logs"),
        "c": FT_SPEC.format(arm="c", script=FT_SCRIPT, args=json.dumps(ft), **fill),
        "c-pin": FT_SPEC.format(arm="c-pin", script=FT_SCRIPT, args=json.dumps([*ft, *pinned]), **fill),
        "d": FT_SPEC.format(arm="d", script=LSGD_SCRIPT, args=json.dumps(lsgd), **fill),
        "d-pin": FT_SPEC.format(arm="d-pin", script=LSGD_SCRIPT, args=json.dumps([*lsgd, *pinned]), **fill),
    }
    torchrun = [*TORCHRUN, "--standalone", "--nproc-per-node", str(args.workers)]
    cmds: dict[str, list[str]] = {
        "ref": [*torchrun, str(FT_SCRIPT), *ddp],
        "a": [*torchrun, "--max-restarts", "1000", str(FT_SCRIPT), *ddp, *ckpt],
    }
    for arm, spec in specs.items():
        path = work / f"{arm}.yaml"
        path.write_text(spec)
        cmds[arm] = [*RUNNER, str(path)]
    return cmds, specs


def validate(argv: list[str]) -> str:
    """'' when runner accepts the spec, else its complaint (an arm this checkout cannot run)."""
    res = subprocess.run([*argv[:-1], "validate", argv[-1]], capture_output=True, text=True, timeout=60,
                         check=False, env={**os.environ, "GOODPUT_RUN_DIR": str(ROOT)})
    return "" if res.returncode == 0 else (res.stderr or res.stdout).strip()


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--arms", default=DEFAULT_ARMS, help=f"a comma-separated subset of {','.join(ARMS)}")
    p.add_argument("--failure-every", default="60,30", help="seconds between two SIGKILLs; one regime per value")
    p.add_argument("--periods", type=int, default=2, help="failure periods measured per run (duration = periods x F)")
    p.add_argument("--baseline-duration", type=float, default=30.0, help="seconds measured per failure-free run")
    p.add_argument("--rounds", type=int, default=3, help="rounds of every arm and regime (median, min-max)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=2, help="W: workers of every arm")
    p.add_argument("--groups", type=int, default=2, help="N: replica groups of c/d (W/N workers each)")
    p.add_argument("--global-batch", type=int, default=32, help="sequences per step over all W workers")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--block", type=int, default=128, help="characters per sequence")
    p.add_argument("--ckpt-every", type=int, default=100, help="a/b: steps between checkpoints (~30 s at 300 ms)")
    p.add_argument("--sync-every", type=int, default=10, help="d: steps between LocalSGD syncs")
    p.add_argument("--heartbeat-timeout", type=float, default=1.0,
                   help="c/d: the lighthouse's heartbeat_timeout, seconds (TorchFT's default: 5)")
    p.add_argument("--quorum-tick", type=float, default=0.01, help="c/d: the lighthouse's quorum_tick, seconds")
    p.add_argument("--cpus", default=None, help="CPUs every arm gets in all (default: this process's affinity)")
    p.add_argument("--keep", default=None, help="copy every run's folder (launcher.log, logs) here")
    p.add_argument("--report-from", default=None, help="print the report of the runs kept in this folder (--keep)")
    args = p.parse_args()
    bad = [a for a in args.arms.split(",") if a not in ARMS]
    if bad:
        p.error(f"unknown arm(s) {bad}: pick from {','.join(ARMS)}")
    if args.workers % args.groups or args.global_batch % args.workers:
        p.error("--workers must be a multiple of --groups, and --global-batch of --workers")
    return args


def cpu_list(args: argparse.Namespace) -> list[int]:
    if args.cpus:
        return sorted({int(c) for c in args.cpus.split(",")})
    return sorted(os.sched_getaffinity(0))


def main() -> None:
    args = parse_args()
    everies = [float(x) for x in args.failure_every.split(",") if x]
    if args.report_from:
        report_from(args, Path(args.report_from), everies)
        return
    arms = [a for a in args.arms.split(",") if a]
    cpus = cpu_list(args)
    precompile()
    set_subreaper()
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-goodput-") as tmp:
        work = Path(tmp)
        cmds, specs = commands(args, work, cpus)
        for arm in [a for a in arms if a not in ("ref", "a")]:
            why = validate(cmds[arm])
            if why:
                print(f"arm {arm} skipped: runner refuses its spec: {why}", file=sys.stderr)
                arms.remove(arm)
        runs: list[Run] = []
        for rnd in range(args.rounds):
            order = arms[rnd % len(arms):] + arms[:rnd % len(arms)]  # rotated: no arm always runs first
            for every in [0.0, *everies]:
                for arm in order:
                    if every and arm == "ref":
                        continue
                    folder = work / f"{arm}-{'ok' if not every else f'f{every:g}'}-{rnd}"
                    duration = args.periods * every if every else args.baseline_duration
                    r = run_once(arm, cmds[arm], folder, set(cpus), duration=duration, every=every,
                                 seed=args.seed * 1000 + rnd * 100 + int(every), rnd=rnd,
                                 groups=1 if arm in WHOLE_JOB else args.groups)
                    runs.append(r)
                    rt = rate(r)
                    print(f"[{time.monotonic() - began:6.0f} s] round {rnd} {arm} "
                          f"{'failure-free' if not every else f'a failure every {every:g} s'}: "
                          f"{'-' if rt is None else f'{rt:.1f}'} samples/s, {sum(bool(k.pid) for k in r.kills)} "
                          f"kills, load {r.load[0]:.2f}->{r.load[1]:.2f}{'; ' + r.error if r.error else ''}"
                          f"{f'; {r.leftovers} leftover process(es) reaped' if r.leftovers else ''}",
                          file=sys.stderr, flush=True)
                    if args.keep:
                        keep = Path(args.keep) / folder.name
                        shutil.copytree(folder, keep, dirs_exist_ok=True)
                        save(r, keep / "run.json")
        report(args, arms, everies, cmds, specs, runs, cpus, time.monotonic() - began)


def report_from(args: argparse.Namespace, kept_dir: Path, everies: list[float]) -> None:
    """The report of runs kept by an earlier --keep (the same flags give the same commands)."""
    runs = [load(folder) for folder in sorted(kept_dir.iterdir()) if (folder / "run.json").exists()]
    arms = [a for a in args.arms.split(",") if any(r.arm == a for r in runs)]
    with tempfile.TemporaryDirectory(prefix="bench-goodput-") as tmp:
        cmds, specs = commands(args, Path(tmp), cpu_list(args))
        report(args, arms, everies, cmds, specs, runs, cpu_list(args), 0.0)


def save(run: Run, path: Path) -> None:
    """What the logs do not say (the kills, the clock's start), for --report-from."""
    meta = {k: v for k, v in vars(run).items() if k != "recs"}
    meta["kills"] = [vars(k) for k in run.kills]
    path.write_text(json.dumps(meta))


def load(folder: Path) -> Run:
    meta = json.loads((folder / "run.json").read_text())
    lines = Lines(folder / "launcher.log")
    lines.poll()
    kills = [Kill(**k) for k in meta.pop("kills")]
    return Run(**{**meta, "load": tuple(meta["load"])}, recs=lines.recs, kills=kills)


# ---------------------------------------------------------------------------------------------------------------
# The report

def ckpt_costs(runs: list[Run]) -> list[float]:
    return [float(r.f["seconds"]) for run in runs for r in run.recs if r.kind == "ckpt"]


def step_time(run: Run) -> float | None:
    """Median interval between group 0's committed step lines (a sync for d), failure-free."""
    return normal_interval(run).get(0)


def torchft_version() -> str:
    try:
        return version("torchft")
    except PackageNotFoundError:
        return "?"


def runs_of(runs: list[Run], arm: str, every: float) -> dict[int, Run]:
    """round -> the arm's run in that regime."""
    return {r.rnd: r for r in runs if r.arm == arm and r.every == every}


def references(runs: list[Run]) -> tuple[dict[int, float], set[str]]:
    """round -> the best failure-free rate of any arm that trains as plain DDP does (every step synchronous), and the
    arms that gave it. LocalSGD (d) trains another algorithm: its groups average every N steps, so a sample of it
    buys less progress than one of DDP's; its samples/s are shown against the reference, never set it."""
    best: dict[int, tuple[float, str]] = {}
    for r in runs:
        x = rate(r)
        if not r.every and x and r.arm in SYNCHRONOUS and (r.rnd not in best or x > best[r.rnd][0]):
            best[r.rnd] = (x, r.arm)
    return {rnd: x for rnd, (x, _) in best.items()}, {arm for _, arm in best.values()}


def failure_free_rows(args: argparse.Namespace, arms: list[str], runs: list[Run],
                      reference: dict[int, float]) -> list[list[str]]:
    rows = []
    for arm in arms:
        oks = list(runs_of(runs, arm, 0.0).values())
        rates = [x for x in (rate(r) for r in oks) if x]
        vs_ref = [x / reference[r.rnd] for r in oks if (x := rate(r)) and r.rnd in reference]
        steps = [x for x in (step_time(r) for r in oks) if x]
        costs = ckpt_costs([r for r in runs if r.arm == arm])
        ckpt = (f"every {args.ckpt_every} steps (≈ {args.ckpt_every * statistics.median(steps):.0f} s); "
                f"{fmt(costs, 3)} s each" if arm in ("a", "b") and steps else "-")
        layout = f"1 x {args.workers}" if arm in WHOLE_JOB else f"{args.groups} x {args.workers // args.groups}"
        unit = f"sync of {args.sync_every} steps" if arm.startswith("d") else "step"
        rows.append([f"({arm}) {NAMES[arm]}", layout, fmt(rates, 1), fmt(vs_ref, 3),
                     f"{fmt(steps, 3)} / {unit}", ckpt, "; ".join(sorted({r.error for r in oks if r.error})) or "-"])
    return rows


def regime_rows(arms: list[str], runs: list[Run], reference: dict[int, float],
                every: float) -> tuple[list[list[str]], list[str]]:
    """The table of one failure regime, and the target's verdicts."""
    rows, verdicts = [], []
    for arm in [a for a in arms if a != "ref"]:
        fails, oks = runs_of(runs, arm, every), runs_of(runs, arm, 0.0)
        rates = {rnd: x for rnd, r in fails.items() if (x := rate(r)) is not None}
        vs_ref = [x / reference[rnd] for rnd, x in rates.items() if rnd in reference]
        own = [x / o for rnd, x in rates.items() if rnd in oks and (o := rate(oks[rnd]))]
        pf = PerFailure()
        for rnd, r in fails.items():
            one = per_failure(r, normal_interval(oks[rnd]) if rnd in oks else {})
            pf.lost += one.lost
            pf.stall += one.stall
            pf.back += one.back
        kills = sum(sum(bool(k.pid) for k in r.kills) for r in fails.values())
        errors = "; ".join(sorted({r.error for r in fails.values() if r.error})) or "-"
        rows.append([f"({arm}) {NAMES[arm]}", f"**{fmt(list(rates.values()), 1)}**",
                     f"**{fmt(vs_ref, 3, flag_above_one=True)}**", fmt(own, 3, flag_above_one=True), str(kills),
                     fmt(pf.lost, 1), fmt(pf.stall), fmt(pf.back), errors])
        a_rates = {rnd: x for rnd, r in runs_of(runs, "a", every).items() if (x := rate(r))}
        vs_a = [x / a_rates[rnd] for rnd, x in rates.items() if rnd in a_rates]
        if arm not in WHOLE_JOB and vs_ref and vs_a:
            ok = statistics.median(vs_ref) >= 0.95 and statistics.median(vs_a) >= 1.1
            other = "" if arm in SYNCHRONOUS else (" (LocalSGD: another algorithm, its samples are not equal "
                                                   "progress; shown, not comparable one for one)")
            verdicts.append(f"- a failure every {every:g} s, ({arm}): {statistics.median(vs_ref):.3f} x the "
                            f"reference (target >= 0.95), {statistics.median(vs_a):.3f} x (a) (target >= 1.1): "
                            f"**{'met' if ok else 'not met'}**{other}")
    return rows, verdicts


def report(args: argparse.Namespace, arms: list[str], everies: list[float], cmds: dict[str, list[str]],
           specs: dict[str, str], runs: list[Run], cpus: list[int], took: float) -> None:
    reference, best = references(runs)
    print(f"### Goodput under failures: absolute samples/s against the reference ({args.workers} workers, global "
          f"batch {args.global_batch}, d_model {args.d_model} x {args.layers} layers, {args.block}-character "
          f"windows; {len({r.rnd for r in runs})} round(s); {machine_line()}; torchft {torchft_version()}; CPUs "
          f"{','.join(map(str, cpus))})\n")
    ref_steps = [x for x in (step_time(r) for r in runs_of(runs, "ref", 0.0).values()) if x]
    if ref_steps and statistics.median(ref_steps) < REALISTIC_STEP_S:
        print(f"**Not the realistic regime**: the reference's step takes {statistics.median(ref_steps):.3f} s "
              f"(< {REALISTIC_STEP_S} s). Raise --d-model/--layers/--block or --global-batch.\n")
    print(f"Reference of each round: the best failure-free rate of any arm that trains as plain DDP does, every step "
          f"synchronous ({', '.join(sorted(best))}): {fmt(list(reference.values()), 1)} samples/s. LocalSGD (d) is "
          "another algorithm (a sync every N steps: fewer allreduces, less progress per sample): measured against "
          "the reference, never its source; its ratios above 1 say that, not an artefact.\n")
    print("Failure-free:\n")
    print(table(["arm", "groups x workers", "samples/s", "vs reference", "step time s",
                 "checkpoint (cost: torch.save + rename on rank 0)", "errors"],
                failure_free_rows(args, arms, runs, reference)))
    verdicts: list[str] = []
    for every in everies:
        print(f"\nA failure every {every:g} s ({args.periods} per run of {args.periods * every:g} s, one SIGKILL "
              "of a random worker per period):\n")
        rows, said = regime_rows(arms, runs, reference, every)
        verdicts += said
        print(table(["arm", "samples/s under failures", "vs reference", "vs own failure-free", "failures",
                     "steps lost / failure (syncs for d)", "survivors' stall / failure s",
                     "killed worker's group committing again after s", "errors"], rows))
    if verdicts:
        print("\nTarget (issue 24: replica groups >= 0.95 x the reference and >= 1.1 x (a), median of the rounds; "
              "set for a failure every 60 s):\n")
        print("\n".join(verdicts))
    loads = [x for r in runs for x in r.load] or [0.0]
    print(f"\nMedians (min-max) over the rounds; per failure: over every failure of every round. Failure-free runs "
          f"{args.baseline_duration:g} s, clock from the first step; lighthouse heartbeat_timeout "
          f"{args.heartbeat_timeout:g} s, quorum_tick {args.quorum_tick:g} s (c/d); LocalSGD sync every "
          f"{args.sync_every} steps (d); 1-min load average during the runs {min(loads):.2f}-{max(loads):.2f}"
          f"{f'; {took / 60:.0f} minutes in all' if took else ''}.")
    print("\nCommands (each run in a fresh folder, GOODPUT_RUN_DIR; every launcher with the affinity of the CPUs "
          "above):")
    for arm in arms:
        argv = cmds[arm] if arm not in specs else [*cmds[arm][:-1], f"{arm}.yaml"]  # the spec is printed below
        print(f"- ({arm}): `{' '.join(os.path.relpath(a, ROOT) if a.startswith('/') else a for a in argv)}`")
    for arm in [a for a in arms if a in specs]:
        print(f"\n({arm}) spec:\n```yaml\n{specs[arm].replace(str(ROOT) + '/', '')}```")
    print(f"\nReproduce: `{reproduce_line()}`")

if __name__ == "__main__":
    main()
