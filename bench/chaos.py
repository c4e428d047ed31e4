"""Seeded chaos soak: real agents, real etcd, a real training job, and a random schedule of faults; invariants after each.

    python bench/chaos.py --seed N --duration SECONDS [--hosted] [--nodes K] [--failure-every S]
                          [--steps N] [--job-window S] [--classes a,b,...] [--no-standby] [--first-job N] [--keep]
    python bench/chaos.py --replica-groups --seed N --duration SECONDS [...]

--replica-groups soaks single-node replica-group jobs (2 TorchFT groups, the hosted lighthouse) instead, with faults
and invariants of their own: bench/chaos_replicas.py.

Every job of the soak: K agents (`python -m runner run job.yaml --node nK`, each in its own session and folder, as
the bench/ multinode benchmarks start them) on this machine, elastic `nodes: "2:K"`, one gloo DDP worker each
(bench/workers/chaos_train.py: a few steps per second, a checkpoint every 5 steps, resumed by every attempt, exit 0
after --steps steps). The rendezvous is a real etcd (tests/etcd_server.py: temp data dir, loopback ports) or, with
--hosted, the etcd one of the agents hosts (`rendezvous.hosted: true`). The spec turns the watchdog's heartbeat on
(8 s), so a stopped worker is a hang the agent must kill.

Faults, drawn from random.Random("SEED:JOB") about every --failure-every seconds while a job runs (for at most
--job-window seconds per job; then the job must finish, and the next one starts until --duration is spent; job N's
schedule does not depend on the jobs before it, so `--first-job N` replays it alone):

| class | what |
|---|---|
| kill_worker | SIGKILL one worker |
| stop_worker | SIGSTOP one worker: SIGCONT 0.5-3 s later (a pause), or never (a hang the watchdog must kill) |
| kill_agent | SIGKILL one agent; a new agent of that node is started 2-10 s later (a scheduler's requeue) |
| kill_guard | SIGKILL one of an agent's guards (the shepherd: cmdline has runner.system.shepherd_main) |
| signal_agent | SIGTERM, SIGINT or SIGHUP to one agent; requeued 2-10 s later (not the hosting node: it stops the job) |
| etcd_stop | etcd down for 1-12 s (SIGTERM, start again on the same data); hosted: etcd frozen (SIGSTOP/SIGCONT) |
| etcd_restart | SIGKILL etcd and start it again at once; hosted: SIGKILL the hosted etcd (its agent restarts it) |
| etcd_wipe | SIGKILL etcd, delete its data dir, start it fresh on the same ports; hosted: the same to the hosted etcd |
| disk_full | fill the tmpfs every node's logs.dir is on (mounted by the soak) for 3-30 s |
| partition | cut the network of the node that runs in its own network namespace (veth pair) for 1-15 s |
| late_join | (drawn per job) one node starts 3-18 s after the others |

A fault only ever reaches a process the soak started or proved to be the job's: agents are its own children (never
reaped before it signals them); workers, guards and a hosted etcd are signalled through a pidfd after /proc shows
the same start time and the job's mark (its token in the environment, or the agent as parent).

Invariants (the first violation ends the soak with exit code 1, the seed, the invariant, the evidence and the replay
command): report_written, outcome_matches_workers, attempts_recorded, nothing_survives, no_internal_error,
etcd_keys_expire, hang_detected, guard_replaced, lease_revoked, stop_honoured, etcd_restarted, late_join_admitted,
job_completes: see docs/faults.md "Chaos soak". Exit code 2: the soak itself failed (or was interrupted), not the
runner.

Everything is bounded: every wait has a timeout, and on exit every process started is killed and reaped, the tmpfs
unmounted, the network namespace deleted and etcd stopped.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import errno
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, argv_of, machine_line, table
from tests.etcd_server import EtcdServer, etcd_binary, free_port

WORKER = ROOT / "bench" / "workers" / "chaos_train.py"
PREFIX = "/runner"

STEP_TIME_S = 0.1
LEASE_TTL_S = 5.0
HEARTBEAT_TIMEOUT_S = 8.0
GRACE_S = 3.0
CONNECT_TIMEOUT_S = 30.0
JOIN_TIMEOUT_S = 300.0
LAST_CALL_S = 2.0
FINAL_TTL_S = 3600  # docs/multinode.md: final states are kept for an hour

TICK_S = 0.1
GONE_BOUND_S = 25.0  # an ended agent's processes: the guard's kill, revoke (2 s) and cgroup wait (10 s), plus load
HANG_BOUND_S = HEARTBEAT_TIMEOUT_S * 1.25 + 20.0  # timeout, one check interval, py-spy's stacks, load
GUARD_BOUND_S = 10.0
REVOKE_BOUND_S = 10.0  # docs: the guard revokes within 2 s of the agent's death
# A stopped agent: grace, then publishing its state and leaving the rendezvous, each bounded by connect_timeout
# when etcd does not answer (docs/multinode.md §6).
STOP_BOUND_S = GRACE_S + 2 * CONNECT_TIMEOUT_S + 25.0
# The others, once the hosting node is stopped: their own stop, while the host lingers at most grace + lease_ttl +
# connect_timeout before it stops etcd (docs/multinode.md §8).
HOSTED_STOP_BOUND_S = GRACE_S + LEASE_TTL_S + CONNECT_TIMEOUT_S + STOP_BOUND_S
ETCD_BACK_BOUND_S = 20.0
LATE_ADMIT_BOUND_S = 120.0
RACE_S = 5.0  # a worker's done marker to its exit 0 and the agent's notice, under load
HOSTED_ETCD_KILLS = 2  # the hosting agent restarts its etcd 3 times at most (docs/multinode.md §8)

CLASSES = ("kill_worker", "stop_worker", "kill_agent", "kill_guard", "signal_agent", "etcd_stop", "etcd_restart",
           "etcd_wipe", "disk_full", "partition")
ALL_CLASSES = (*CLASSES, "late_join")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# What the final table counts as lost (only the first two may be non-zero in a run whose invariants held).
LOST = {
    "documented": "jobs that did not finish their training: a documented loss (the hosting node lost or stopped)",
    "killed": "node runs without report.json: the agent was SIGKILLed by the soak (by design)",
    "job_completes": "jobs, or nodes' results, lost otherwise",
    "report_written": "node runs without report.json otherwise",
    "nothing_survives": "processes that outlived their job",
    "etcd_keys_expire": "etcd keys left on a live lease",
}
# The times the soak measures, from each fault to its expectation met.
MEASURED = {
    "hang_detected": "a worker left stopped gone (heartbeat_timeout 8 s)",
    "lease_revoked": "a SIGKILLed agent's lease revoked",
    "guard_replaced": "a killed guard replaced",
    "nothing_survives": "a SIGKILLed agent's processes gone",
    "etcd_restarted": "a killed hosted etcd started again",
    "late_join_admitted": "a late node RUNNING",
}
# Agent events quoted when a job did not complete.
EVIDENCE = ("hosted_etcd_gone", "hosted_etcd_restarting", "etcd_data_lost", '"give_up"', "rendezvous_timeout")
# In an agent's output: the CLI's last resort, and asyncio's words for an exception nobody handled.
INTERNAL_ERRORS = ("internal error", "Exception in callback", "Task exception was never retrieved",
                   "exception was never retrieved", "Unhandled exception")


class Violation(Exception):
    """An invariant broke."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant, self.detail = invariant, detail


# ---------------------------------------------------------------------------------------------------------- /proc


@dataclass(frozen=True)
class Proc:
    """One process for good: its pid and its start time in clock ticks (a recycled pid has a later one)."""

    pid: int
    ticks: int


def stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start ticks) of `pid`, None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[19])


def ident(pid: int) -> Proc | None:
    """The process that has `pid` now."""
    st = stat(pid)
    return Proc(pid, st[2]) if st else None


def running(p: Proc) -> bool:
    """`p` still exists and is not a zombie."""
    st = stat(p.pid)
    return st is not None and st[2] == p.ticks and st[0] != "Z"


def environ_of(pid: int) -> list[bytes]:
    """The environment `pid` was started with, one b'KEY=VALUE' each."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def children_of(pid: int) -> list[int]:
    """Direct children of `pid` (every thread's list)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f:
                out.extend(int(p) for p in f.read().split())
    return out


def descendants_of(pid: int) -> list[int]:
    """Every descendant of `pid` now."""
    todo, seen = children_of(pid), []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo.extend(children_of(p))
    return seen


def all_pids() -> list[int]:
    """Every pid in /proc."""
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def signal_proven(p: Proc, sig: int, proof: Callable[[int], bool]) -> bool:
    """Send `sig` to `p` through a pidfd, only if, with the pidfd open, /proc still shows p's start time and
    `proof(pid)` holds: the checks are about the process the pidfd names, so a recycled pid is never signalled."""
    try:
        fd = os.pidfd_open(p.pid)
    except OSError:
        return False
    try:
        st = stat(p.pid)
        if st is None or st[2] != p.ticks or st[0] == "Z" or not proof(p.pid):
            return False
        signal.pidfd_send_signal(fd, sig)
    except OSError:
        return False
    else:
        return True
    finally:
        os.close(fd)


def describe(p: Proc) -> str:
    """pid, state, parent and command line, for a violation's evidence."""
    st = stat(p.pid)
    state = f"{st[0]}, ppid {st[1]}" if st else "gone"
    return f"pid {p.pid} ({state}): {' '.join(argv_of(p.pid))[:160]}"


def set_subreaper() -> None:
    """Orphans of the agents (a SIGKILLed agent's guard and workers) reparent to this process: seen and reaped."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def reap_orphans(mine: set[int]) -> None:
    """Reap zombie children that are not ours to wait for (orphans reparented to this subreaper)."""
    for pid in children_of(os.getpid()):
        if pid not in mine and (st := stat(pid)) is not None and st[0] == "Z":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


# ----------------------------------------------------------------------------------------------- infrastructure


class ChaosEtcd(EtcdServer):
    """tests/etcd_server.py's etcd, also listening on `extra_host` (the veth address a namespaced node reaches)."""

    def __init__(self, data_dir: Path, extra_host: str | None) -> None:
        super().__init__(data_dir)
        self.extra_host = extra_host

    def _argv(self) -> list[str]:
        argv = super()._argv()
        if self.extra_host:
            i = argv.index("--listen-client-urls") + 1
            argv[i] += f",http://{self.extra_host}:{self.client_port}"
        return argv

    @property
    def up(self) -> bool:
        """Running (started and not stopped)."""
        return self.proc is not None and self.proc.poll() is None

    def wipe(self) -> None:
        """SIGKILL, delete the data dir, start fresh on the same ports."""
        self.kill()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self.start()


class Netns:
    """A network namespace joined to this one by a veth pair; one node runs in it; `down()` is the partition.

    Host side: <veth>h with 10.213.X.1/30 (stays reachable from this namespace when the link is down: a local
    address); namespace side: <veth>n with 10.213.X.2/30, default route through the host side.
    """

    def __init__(self) -> None:
        tag = os.getpid() % 10_000_000
        self.name, self.vh, self.vn = f"chaos{tag}", f"chv{tag}h", f"chv{tag}n"
        used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, timeout=10, check=True).stdout
        start = os.getpid() % 256  # two soaks at once start their search apart
        free = [x for x in (*range(start, 256), *range(start)) if f"10.213.{x}." not in used]
        if not free:
            raise OSError("no free 10.213.X.0/30 subnet")
        self.host_addr, self.ns_addr = f"10.213.{free[0]}.1", f"10.213.{free[0]}.2"
        self.made = False
        self.cut = False

    def _ip(self, *args: str) -> None:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=False)
        if done.returncode:
            raise OSError(f"ip {' '.join(args)}: {done.stderr.strip()}")

    def setup(self) -> None:
        """Create the namespace and the veth pair (root only); raises OSError with the reason."""
        self._ip("netns", "add", self.name)
        self.made = True
        self._ip("link", "add", self.vh, "type", "veth", "peer", "name", self.vn)
        self._ip("link", "set", self.vn, "netns", self.name)
        self._ip("addr", "add", f"{self.host_addr}/30", "dev", self.vh)
        self._ip("link", "set", self.vh, "up")
        self._ip("-n", self.name, "addr", "add", f"{self.ns_addr}/30", "dev", self.vn)
        self._ip("-n", self.name, "link", "set", self.vn, "up")
        self._ip("-n", self.name, "link", "set", "lo", "up")
        self._ip("-n", self.name, "route", "add", "default", "via", self.host_addr)

    def wrap(self, argv: list[str]) -> list[str]:
        """argv run inside the namespace (nsenter execs it: the pid stays the one Popen returns)."""
        return ["nsenter", f"--net=/var/run/netns/{self.name}", *argv]

    def down(self) -> None:
        """Partition: the host side of the link goes down (the namespace's packets go nowhere)."""
        self._ip("link", "set", self.vh, "down")
        self.cut = True

    def up(self) -> None:
        """Heal the partition."""
        self._ip("link", "set", self.vh, "up")
        self.cut = False

    def teardown(self) -> None:
        """Delete the pair and the namespace (never raises)."""
        if not self.made:
            return
        for args in (("link", "del", self.vh), ("netns", "del", self.name)):
            with contextlib.suppress(OSError):
                self._ip(*args)
        self.made = False


def mount_tmpfs(path: Path, mib: int) -> str | None:
    """Mount a tmpfs of `mib` MiB at `path`; None, or why it could not."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m,mode=0755", "chaos-logs", str(path)],
                              capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None if done.returncode == 0 else (done.stderr.strip() or f"mount exited {done.returncode}")


def umount(path: Path) -> None:
    """Unmount (lazily if busy); never raises."""
    for args in (["umount", str(path)], ["umount", "-l", str(path)]):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            if subprocess.run(args, capture_output=True, timeout=20, check=False).returncode == 0:
                return


def fill(folder: Path) -> int:
    """Write one file into `folder` until its file system is full; the bytes written."""
    path, size = folder / ".chaos-filler", 0
    chunk = b"\0" * (1 << 20)
    with path.open("wb", buffering=0) as f:
        for piece in (chunk, chunk[:4096]):
            while True:
                try:
                    size += f.write(piece)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
    return size


# ------------------------------------------------------------------------------------------------------- the job


@dataclass
class Agent:
    """One agent process (a node's run); a node started again after a fault is a new Agent."""

    node: str
    serial: int
    proc: subprocess.Popen[bytes]
    me: Proc
    out: Path  # stdout + stderr
    started: float  # time.time()
    fate: str = ""  # "" (left alone), "killed", or the stop signal's name
    fate_at: float = 0.0
    cut_off: bool = False  # its node's network was partitioned while it ran
    code: int | None = None
    ended: float = 0.0
    run_dir: Path | None = None
    checked: bool = False
    scanned: int = 0  # bytes of `out` searched for INTERNAL_ERRORS so far

    @property
    def label(self) -> str:
        """n1 for the first agent of n1, n1#2 for the second."""
        return self.node if self.serial == 0 else f"{self.node}#{self.serial + 1}"


@dataclass
class Expect:
    """Something that must hold by `deadline` (monotonic): `check()` is True (met), False (not yet), None (moot)."""

    invariant: str
    deadline: float
    check: Callable[[], bool | None]
    detail: Callable[[], str]
    since: float = 0.0  # monotonic time of the fault
    met: str = ""  # printed with the elapsed time when the check turns True ('' prints nothing)


@dataclass
class Fault:
    """One injected fault."""

    cls: str
    job: int
    at: float  # seconds since the soak started
    wall: float  # time.time()
    target: str
    detail: str


@dataclass
class Job:
    """One job of the soak."""

    index: int
    name: str
    token: str
    dir: Path
    logs: Path
    spec: Path
    nodes: list[str]
    endpoint: str
    started: float = field(default_factory=time.monotonic)
    agents: list[Agent] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    timed: list[tuple[float, str, Callable[[], None]]] = field(default_factory=list)
    expects: list[Expect] = field(default_factory=list)
    quiet_from: float = 0.0  # monotonic: no new fault after this
    loss: str = ""  # a documented way for this job to end without its training done
    host_stopped: bool = False
    closed_at: float = 0.0

    @property
    def out(self) -> Path:
        """Worker markers (start-*, done-*)."""
        return self.dir / "out"

    @property
    def tmp(self) -> Path:
        """TMPDIR of every process of the job (the guards and a hosted etcd keep it: their mark)."""
        return self.dir / "tmp"

    @property
    def state(self) -> Path:
        """XDG_STATE_HOME of the agents: runs.jsonl, and reports/ when a run dir cannot take report.json."""
        return self.dir / "state"

    def markers(self, kind: str) -> list[dict[str, Any]]:
        """Every start-* or done-* marker the workers wrote."""
        found = []
        for path in sorted(self.out.glob(f"{kind}-*.json")):
            with contextlib.suppress(OSError, ValueError):
                found.append(json.loads(path.read_text()))
        return found

    def trained(self) -> bool:
        """Some worker finished every step."""
        return bool(self.markers("done"))

    def live(self) -> list[Agent]:
        """Agents still running."""
        return [a for a in self.agents if a.code is None]


def read_text(path: Path) -> str:
    """A file's text ('' when unreadable)."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The JSON lines of a file and how many lines were not JSON (a write cut short by a full disk)."""
    good, bad = [], 0
    for line in read_text(path).splitlines():
        if line.strip():
            try:
                good.append(json.loads(line))
            except ValueError:
                bad += 1
    return good, bad


# ------------------------------------------------------------------------------------------------------ the soak


class Soak:
    """The whole soak: infrastructure, jobs, faults, invariants, the final table."""

    # What this soak draws and reports (bench/chaos_replicas.py's soak has its own).
    classes: tuple[str, ...] = CLASSES  # drawn by the seeded schedule
    all_classes: tuple[str, ...] = ALL_CLASSES  # in the table (late_join is drawn per job)
    lost_rows: dict[str, str] = LOST
    measured: dict[str, str] = MEASURED

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)  # replaced by each job's own (seed, job number) generator
        self.t0 = time.monotonic()
        self.base = Path(tempfile.mkdtemp(prefix=f"chaos-{args.seed}-"))
        self.logs_root = self.base / "logsfs"
        self.mounted = False
        self.etcd: ChaosEtcd | None = None
        self.net: Netns | None = None
        self.disabled: dict[str, str] = {}
        self.injected: dict[str, int] = dict.fromkeys(self.all_classes, 0)
        self.survived: dict[str, int] = dict.fromkeys(self.all_classes, 0)
        self.skipped: dict[str, int] = dict.fromkeys(self.all_classes, 0)
        self.lost: dict[str, int] = dict.fromkeys(self.lost_rows, 0)
        self.jobs: list[Job] = []
        self.job: Job | None = None
        self.filled = False
        self.hosted_kills: dict[int, int] = {}  # hosting agent pid -> hosted etcd kills
        self.outcomes: list[str] = []
        self.next_scan = 0.0
        self.timings: dict[str, list[float]] = {}  # invariant -> seconds its expectations took to be met
        self.next_fault = 0.0
        self.pending: tuple[str, list[float], int] | None = None  # a drawn fault waiting for a target

    # ------------------------------------------------------------------ output

    def say(self, text: str) -> None:
        """One line of the soak's log, with the time since the start."""
        print(f"[{time.monotonic() - self.t0:7.1f}s] {text}", flush=True)

    def replay(self, job: int | None = None) -> str:
        """The command that replays this seed (only job `job`, when given)."""
        a = self.args
        duration = a.job_window if job is not None else a.duration
        line = f"python bench/chaos.py --seed {a.seed} --duration {duration:g} --nodes {a.nodes}"
        if job is not None or a.first_job != 1:
            line += f" --first-job {job if job is not None else a.first_job}"
        line += f" --failure-every {a.failure_every:g} --steps {a.steps} --job-window {a.job_window:g}"
        if a.hosted:
            line += " --hosted"
        if a.classes:
            line += f" --classes {a.classes}"
        if not a.standby:
            line += " --no-standby"
        return line

    # ------------------------------------------------------------------ setup / teardown

    def setup(self) -> None:
        """Subreaper, tmpfs for the logs, the network namespace, etcd."""
        set_subreaper()
        wanted = set(self.args.classes.split(",")) if self.args.classes else set(ALL_CLASSES)
        for cls in ALL_CLASSES:
            if cls not in wanted:
                self.disabled[cls] = "not in --classes"
        if self.args.nodes < 3:
            self.disabled.setdefault("late_join", "needs --nodes 3 or more (a late node of nodes 2:K, K > 2)")
        size = 512 if self.args.hosted else 64  # a hosted etcd preallocates a 64 MB WAL in the run dir
        why = mount_tmpfs(self.logs_root, size)
        if why is None:
            self.mounted = True
            self.say(f"logs.dir on a {size} MiB tmpfs at {self.logs_root}")
        else:
            self.disabled.setdefault("disk_full", f"cannot mount a tmpfs for logs.dir ({why})")
        if "partition" not in self.disabled:
            self.setup_netns()
        if not self.args.hosted:
            self.etcd = ChaosEtcd(self.base / "etcd-data", self.net.host_addr if self.net else None)
            self.etcd.start()
            self.say(f"etcd at {self.etcd.endpoint} (data {self.etcd.data_dir})")
        for cls, why in sorted(self.disabled.items()):
            if why != "not in --classes":
                self.say(f"class {cls} skipped: {why}")

    def setup_netns(self) -> None:
        """The namespace the last node runs in, or the partition class skipped with the reason."""
        try:
            self.net = Netns()
            self.net.setup()
            self.say(f"node n{self.args.nodes - 1} runs in network namespace {self.net.name} "
                     f"({self.net.ns_addr}, the others {self.net.host_addr})")
        except (OSError, subprocess.SubprocessError) as e:
            if self.net is not None:
                self.net.teardown()
            self.net = None
            self.disabled["partition"] = f"no network namespace with a veth pair here ({e})"

    def teardown(self, keep: bool) -> None:
        """Kill and reap everything started, unmount, delete the namespace, stop etcd. Bounded; never raises."""
        for job in self.jobs:
            with contextlib.suppress(Exception):
                self.kill_job(job)
        if self.net is not None:
            with contextlib.suppress(Exception):
                if self.net.cut:
                    self.net.up()
            self.net.teardown()
        if self.etcd is not None:
            with contextlib.suppress(Exception):
                self.etcd.kill()
        if self.mounted:
            if keep:
                with contextlib.suppress(OSError):
                    shutil.copytree(self.logs_root, self.base / "logs", symlinks=True, dirs_exist_ok=True,
                                    ignore=shutil.ignore_patterns(".chaos-filler"))
            umount(self.logs_root)
            self.mounted = False
        reap_orphans(self.own_pids())
        if keep:
            print(f"kept: {self.base}", flush=True)
        else:
            shutil.rmtree(self.base, ignore_errors=True)

    def own_pids(self) -> set[int]:
        """Children this process waits for itself (Popen): every agent, and our etcd. Not for reap_orphans."""
        pids = {a.proc.pid for j in self.jobs for a in j.agents}
        if self.etcd is not None and self.etcd.proc is not None:
            pids.add(self.etcd.proc.pid)
        return pids

    def kill_job(self, job: Job) -> None:
        """SIGKILL the job's agents (ours: Popen) and every process carrying the job's mark; reap them."""
        for a in job.agents:
            if a.proc.poll() is None:
                a.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                a.proc.wait(10)
        for _ in range(3):
            found = self.job_processes(job)
            for p, _why in found:
                signal_proven(p, signal.SIGKILL, lambda pid: self.marked(job, pid))
            if not found:
                break
            time.sleep(0.5)
        reap_orphans(self.own_pids())

    # ------------------------------------------------------------------ processes of a job

    def marked(self, job: Job, pid: int) -> bool:
        """The job's mark: its token or TMPDIR in the environment, its folder on the command line or as cwd."""
        env = environ_of(pid)
        if f"CHAOS_TOKEN={job.token}".encode() in env or f"TMPDIR={job.tmp}".encode() in env:
            return True
        cmd = " ".join(argv_of(pid))
        if f"{job.dir}/" in cmd or f"{job.logs}/" in cmd:  # (with the slash: job1 is no prefix of job10)
            return True
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            return False
        return cwd == str(job.dir) or cwd.startswith((f"{job.dir}/", f"{job.logs}/"))

    def job_processes(self, job: Job) -> list[tuple[Proc, str]]:
        """Every live (non-zombie) process with the job's mark, this process excluded."""
        found = []
        for pid in all_pids():
            if pid == os.getpid():
                continue
            st = stat(pid)
            if st is None or st[0] == "Z" or not self.marked(job, pid):
                continue
            found.append((Proc(pid, st[2]), describe(Proc(pid, st[2]))))
        return found

    def guards(self, agent: Agent) -> list[Proc]:
        """The agent's guard processes (its children running runner.system.shepherd_main)."""
        return [p for pid in children_of(agent.proc.pid)
                if any("runner.system.shepherd_main" in a for a in argv_of(pid)) and (p := ident(pid))]

    def hosted_etcd(self, agent: Agent) -> Proc | None:
        """The etcd the agent hosts (a descendant whose program is etcd), if any."""
        for pid in descendants_of(agent.proc.pid):
            argv = argv_of(pid)
            if argv and Path(argv[0]).name == "etcd" and (p := ident(pid)) and running(p):
                return p
        return None

    def host(self, job: Job) -> Agent | None:
        """The live agent hosting the job's etcd (hosted mode)."""
        for a in job.live():
            if self.hosted_etcd(a) is not None:
                return a
        return None

    def workers(self, job: Job, *, live_only: bool = True) -> list[tuple[dict[str, Any], Proc]]:
        """Workers the markers name (start-*), with their identity; running ones only by default."""
        found = []
        for m in job.markers("start"):
            p = Proc(int(m["pid"]), int(m["start_ticks"]))
            if not live_only or running(p):
                found.append((m, p))
        return sorted(found, key=lambda x: (x[0]["node"], x[0]["rank"], x[1].pid))

    def run_dir(self, job: Job, agent: Agent) -> Path | None:
        """The agent's run dir: from the console's last lines, else from runs.jsonl (its pid's start line)."""
        if agent.run_dir is not None:
            return agent.run_dir
        for line in reversed(read_text(agent.out).splitlines()):
            if line.startswith("runner: logs: "):
                agent.run_dir = Path(line.removeprefix("runner: logs: ").strip())
                return agent.run_dir
        lines, _ = jsonl(job.state / "runner" / "runs.jsonl")
        for item in lines:
            if item.get("kind") == "start" and item.get("pid") == agent.proc.pid and item.get("job") == job.name:
                agent.run_dir = Path(item["run_dir"])
                return agent.run_dir
        return None

    def transitions(self, job: Job, agent: Agent) -> tuple[list[dict[str, Any]], int]:
        """The agent's transitions.jsonl (lines, torn lines)."""
        rd = self.run_dir(job, agent)
        return jsonl(rd / "transitions.jsonl") if rd else ([], 0)

    # ------------------------------------------------------------------ etcd reads

    def etcd_keys(self, job: Job) -> list[tuple[str, int]] | None:
        """(key, lease) of every key of the job in our etcd; None when it cannot be read."""
        if self.etcd is None or not self.etcd.up:
            return None
        done = self.etcd.etcdctl("get", "--prefix", f"{PREFIX}/{job.name}/", "-w", "json", check=False)
        if done.returncode:
            return None
        kvs = json.loads(done.stdout).get("kvs", [])
        return [(base64.b64decode(kv["key"]).decode(errors="replace"), int(kv.get("lease", 0))) for kv in kvs]

    def lease_ttl(self, lease: int) -> int | None:
        """Remaining TTL of a lease (-1: gone); None when etcd cannot be read."""
        if self.etcd is None or not self.etcd.up:
            return None
        done = self.etcd.etcdctl("lease", "timetolive", f"{lease:x}", "-w", "json", check=False)
        if done.returncode:
            return None
        return int(json.loads(done.stdout).get("ttl", -1))

    # ------------------------------------------------------------------ jobs

    def spec_text(self, job: Job, endpoint: str) -> str:
        """The job's spec (the same file for every node; per-node values come from each agent's environment)."""
        k = self.args.nodes
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
              hosted: {str(self.args.hosted).lower()}
              endpoints: ["{endpoint}"]
              last_call: {LAST_CALL_S}s
              lease_ttl: {LEASE_TTL_S}s
              join_timeout: {JOIN_TIMEOUT_S}s
              connect_timeout: {CONNECT_TIMEOUT_S}s
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

    def new_job(self) -> Job:
        """Folders, spec; nodes are started by run_job(). Each job draws from its own generator, seeded with the
        soak's seed and the job's number: job N's schedule is the same whatever happened to jobs 1..N-1, and
        `--first-job N` replays it alone."""
        index = self.args.first_job + len(self.jobs)
        self.rng = random.Random(f"{self.args.seed}:{index}")
        name = f"chaos-{self.args.seed}-{index}"
        d = self.base / f"job{index}"
        logs = (self.logs_root if self.mounted else self.base / "logs") / f"job{index}"
        if self.args.hosted:
            host = self.net.host_addr if self.net else "127.0.0.1"
            endpoint = f"{host}:{free_port()}"
        else:
            assert self.etcd is not None
            endpoint = f"{self.net.host_addr}:{self.etcd.client_port}" if self.net else self.etcd.endpoint
        job = Job(index, name, os.urandom(8).hex(), d, logs, d / "job.yaml",
                  [f"n{i}" for i in range(self.args.nodes)], endpoint)
        for sub in (d, job.out, job.tmp, job.state, d / "ckpt", logs):
            sub.mkdir(parents=True, exist_ok=True)
        job.spec.write_text(self.spec_text(job, endpoint))
        env = {**os.environ, "CHAOS_LOGS": str(logs)}
        done = subprocess.run([sys.executable, "-m", "runner", "validate", str(job.spec)], env=env,
                              capture_output=True, text=True, timeout=60, check=False)
        if done.returncode:
            raise RuntimeError(f"the soak's own spec is refused:\n{done.stdout}{done.stderr}")
        self.jobs.append(job)
        return job

    def start_agent(self, job: Job, node: str) -> Agent:
        """Start one agent of `node` (a new one after a fault), in its own session, output to a file."""
        home = job.dir / "nodes" / node
        home.mkdir(parents=True, exist_ok=True)
        serial = sum(1 for a in job.agents if a.node == node)
        out = home / f"agent{serial}.log"
        in_ns = self.net is not None and node == job.nodes[-1]
        addr = (self.net.ns_addr if in_ns else self.net.host_addr) if self.net else "127.0.0.1"
        env = {**os.environ, "CHAOS_TOKEN": job.token, "CHAOS_NODE": node, "TMPDIR": str(job.tmp),
               "XDG_STATE_HOME": str(job.state), "CHAOS_LOGS": str(job.logs / node), "PYTHONUNBUFFERED": "1"}
        env.pop("RUNNER_STANDBY", None)  # the spec says (the product's default: on)
        if self.net is not None:
            env["GLOO_SOCKET_IFNAME"] = self.net.vn if in_ns else self.net.vh
        argv = [sys.executable, "-m", "runner", "run", str(job.spec), "--node", node, "--advertise-addr", addr]
        if in_ns and self.net is not None:
            argv = self.net.wrap(argv)
        with out.open("wb") as f:
            proc = subprocess.Popen(argv, cwd=home, env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=f,
                                    start_new_session=True)
        me = ident(proc.pid) or Proc(proc.pid, 0)
        agent = Agent(node, serial, proc, me, out, time.time())
        job.agents.append(agent)
        return agent

    def at(self, job: Job, delay: float, what: str, action: Callable[[], None]) -> None:
        """Run `action` `delay` s from now (restorative actions run even after the job's fault window)."""
        job.timed.append((time.monotonic() + delay, what, action))

    def expect(self, job: Job, invariant: str, within: float, check: Callable[[], bool | None],
               detail: Callable[[], str], met: str = "") -> None:
        """`check` must turn True (or None: moot) within `within` s; `met` is printed with the time it took."""
        now = time.monotonic()
        job.expects.append(Expect(invariant, now + within, check, detail, now, met))

    def record(self, job: Job, cls: str, target: str, detail: str) -> Fault:
        """Count and print one fault."""
        f = Fault(cls, job.index, time.monotonic() - self.t0, time.time(), target, detail)
        job.faults.append(f)
        self.injected[cls] += 1
        self.say(f"job {job.index}: {cls} {target}: {detail}")
        return f

    # ------------------------------------------------------------------ the faults

    def targets(self, job: Job) -> list[Agent]:
        """Agents a process fault may hit: live, left alone so far, and the training not finished (a fault after
        the first worker said done would race with the job's own end)."""
        if job.trained():
            return []
        return sorted((a for a in job.live() if not a.fate), key=lambda a: (a.node, a.serial))

    def pick(self, items: list[Any], u: float) -> Any:
        """items[u * len] (u from the seeded draw)."""
        return items[min(int(u * len(items)), len(items) - 1)] if items else None

    def requeue(self, job: Job, node: str, delay: float) -> None:
        """Start the node again `delay` s from now (a scheduler's requeue), unless the job is over by then; never
        while an agent of that node still runs (a stopped agent may take a while to leave): then 1 s later."""
        def start() -> None:
            if job.trained() or job.host_stopped or (job.loss and not job.live()):
                self.say(f"job {job.index}: requeue of {node} skipped (the job is over)")
                return
            if any(a.node == node for a in job.live()):
                self.at(job, 1.0, f"requeue {node}", start)
                return
            agent = self.start_agent(job, node)
            self.say(f"job {job.index}: {node} started again (pid {agent.proc.pid})")
        self.at(job, delay, f"requeue {node}", start)

    def fault_kill_worker(self, job: Job, u: list[float], sig: int = signal.SIGKILL) -> bool:
        dirs = {str(rd) for a in self.targets(job) if (rd := self.run_dir(job, a))}
        cands = [(m, p) for m, p in self.workers(job) if m["run_dir"] in dirs
                 and (sig == signal.SIGKILL or (stat(p.pid) or ("T",))[0] != "T")]  # a stopped one: not again
        if not cands:
            return False
        m, p = self.pick(cands, u[0])
        if not signal_proven(p, sig, lambda pid: self.marked(job, pid)):
            return False
        who = f"{m['node']} rank {m['rank']} pid {p.pid} (attempt {m['attempt']})"
        if sig == signal.SIGKILL:
            self.record(job, "kill_worker", who, "SIGKILL")
            self.expect(job, "nothing_survives", GONE_BOUND_S, lambda: not running(p), lambda: describe(p))
            return True
        if u[1] < 0.5:
            pause = 0.5 + u[2] * 2.5
            self.record(job, "stop_worker", who, f"SIGSTOP, SIGCONT in {pause:.1f} s")
            self.at(job, pause, f"SIGCONT {p.pid}",
                    lambda: signal_proven(p, signal.SIGCONT, lambda pid: self.marked(job, pid)))
        else:
            self.record(job, "stop_worker", who, f"SIGSTOP, left stopped (heartbeat_timeout {HEARTBEAT_TIMEOUT_S:g} s)")
            self.expect(job, "hang_detected", HANG_BOUND_S, lambda: not running(p),
                        lambda: f"the stopped worker still exists {HANG_BOUND_S:g} s later: {describe(p)}",
                        met=f"stopped worker {p.pid} gone")
        return True

    def fault_stop_worker(self, job: Job, u: list[float]) -> bool:
        return self.fault_kill_worker(job, u, signal.SIGSTOP)

    def fault_kill_agent(self, job: Job, u: list[float]) -> bool:
        agent = self.pick(self.targets(job), u[0])
        if agent is None:
            return False
        tree = [p for pid in descendants_of(agent.proc.pid) if (p := ident(pid))]
        lease = self.node_lease(job, agent.node)
        hosting = self.args.hosted and self.hosted_etcd(agent) is not None
        agent.proc.send_signal(signal.SIGKILL)
        agent.fate, agent.fate_at = "killed", time.time()
        detail = f"SIGKILL pid {agent.proc.pid}; {len(tree)} processes under it"
        if hosting:
            job.loss = "the hosting node's agent was SIGKILLed: its etcd died with it (docs/multinode.md §8)"
            detail += "; it hosts the etcd"
        self.record(job, "kill_agent", agent.label, detail)
        self.expect(job, "nothing_survives", GONE_BOUND_S, lambda: not any(running(p) for p in tree),
                    lambda: "processes of a SIGKILLed agent still run: "
                    + "; ".join(describe(p) for p in tree if running(p)),
                    met=f"the {len(tree)} processes under {agent.label} gone" if tree else "")
        if lease:
            self.expect(job, "lease_revoked", REVOKE_BOUND_S, lambda: self.lease_gone(lease),
                        lambda: f"the SIGKILLed agent's lease {lease:x} is still granted (ttl {self.lease_ttl(lease)})",
                        met=f"{agent.label}'s lease revoked")
        self.requeue(job, agent.node, 2 + u[1] * 8)
        return True

    def node_lease(self, job: Job, node: str) -> int:
        """The lease of the node's live state key (0: none, or etcd unreadable)."""
        for key, lease in self.etcd_keys(job) or []:
            if key == f"{PREFIX}/{job.name}/nodes/{node}":
                return lease
        return 0

    def lease_gone(self, lease: int) -> bool | None:
        """True once the lease is gone; None (moot) while etcd is down or was wiped."""
        ttl = self.lease_ttl(lease)
        return None if ttl is None else ttl < 0

    def fault_kill_guard(self, job: Job, u: list[float]) -> bool:
        cands = [(a, g) for a in self.targets(job) for g in self.guards(a)]
        if not cands:
            return False
        agent, guard = self.pick(cands, u[0])
        before = len(self.guards(agent))

        def proof(pid: int) -> bool:
            st = stat(pid)
            return st is not None and st[1] == agent.proc.pid and any(
                "runner.system.shepherd_main" in a for a in argv_of(pid))

        if not signal_proven(guard, signal.SIGKILL, proof):
            return False
        self.record(job, "kill_guard", agent.label, f"SIGKILL guard pid {guard.pid} (the agent had {before})")

        def replaced() -> bool | None:
            if agent.proc.poll() is not None:
                return None
            now = self.guards(agent)
            return guard not in now and len(now) >= before

        self.expect(job, "guard_replaced", GUARD_BOUND_S, replaced,
                    lambda: f"{agent.label} has guards {[g.pid for g in self.guards(agent)]}, had {before} before "
                    f"the kill of {guard.pid}", met=f"{agent.label}'s guard replaced")
        return True

    def fault_signal_agent(self, job: Job, u: list[float]) -> bool:
        cands = [a for a in self.targets(job) if console_transitions(a) or time.time() - a.started > 10]
        agent = self.pick(cands, u[0])
        if agent is None:
            return False
        sig = STOP_SIGNALS[min(int(u[1] * 3), 2)]
        hosting = self.args.hosted and self.hosted_etcd(agent) is not None
        agent.proc.send_signal(sig)
        agent.fate, agent.fate_at = sig.name, time.time()
        detail = sig.name
        others = [a for a in job.live() if a is not agent]
        if hosting:
            job.host_stopped = True
            job.loss = "the hosting node was stopped by a signal: every node stops (docs/multinode.md §8)"
            detail += "; it hosts the etcd: every node must stop"
            self.expect(job, "stop_honoured", HOSTED_STOP_BOUND_S, lambda: all(a.code is not None for a in others),
                        lambda: "nodes still running after the hosting node was stopped: "
                        + ", ".join(a.label for a in others if a.code is None))
        self.record(job, "signal_agent", agent.label, detail)
        self.expect(job, "stop_honoured", STOP_BOUND_S, lambda: agent.code is not None,
                    lambda: f"{agent.label} still runs {STOP_BOUND_S:g} s after {sig.name}")
        if not hosting:
            self.requeue(job, agent.node, 2 + u[2] * 8)
        return True

    def fault_etcd(self, job: Job, cls: str, u: list[float]) -> bool:
        if self.args.hosted:
            return self.fault_hosted_etcd(job, cls, u)
        etcd = self.etcd
        if etcd is None or not etcd.up or job.trained():
            return False
        if cls == "etcd_stop":
            down = 1 + u[0] * 11
            etcd.stop()
            self.record(job, cls, "etcd", f"SIGTERM, started again in {down:.1f} s")
            self.at(job, down, "etcd start", self.etcd_start)
        elif cls == "etcd_restart":
            etcd.kill()
            etcd.start()
            self.record(job, cls, "etcd", "SIGKILL, started again at once")
        else:
            etcd.wipe()
            self.record(job, cls, "etcd", "SIGKILL, data dir deleted, started fresh on the same ports")
        return True

    def etcd_start(self) -> None:
        """Start our etcd again (same data, same ports) if it is down."""
        if self.etcd is not None and not self.etcd.up:
            self.etcd.start()
            self.say("etcd started again")

    def fault_hosted_etcd(self, job: Job, cls: str, u: list[float]) -> bool:
        host = self.host(job)
        etcd = self.hosted_etcd(host) if host is not None and not host.fate and not job.trained() else None
        if host is None or etcd is None:
            return False
        argv = argv_of(etcd.pid)

        def proof(pid: int) -> bool:
            return pid in descendants_of(host.proc.pid) and argv_of(pid) == argv

        target = f"hosted etcd of {host.label}"
        if cls == "etcd_stop":
            down = 1 + u[0] * 11
            if not signal_proven(etcd, signal.SIGSTOP, proof):
                return False
            self.record(job, cls, target, f"SIGSTOP pid {etcd.pid}, SIGCONT in {down:.1f} s")
            self.at(job, down, "hosted etcd SIGCONT", lambda: signal_proven(etcd, signal.SIGCONT, proof))
            return True
        data = argv[argv.index("--data-dir") + 1] if "--data-dir" in argv else ""
        # Wipe only a data dir proven the job's: the hosted etcd keeps it in the job's TMPDIR (runner-etcd-*/data).
        ours = data and Path(data).parent.name.startswith("runner-etcd-") and Path(data).is_relative_to(job.tmp)
        if self.hosted_kills.get(host.proc.pid, 0) >= HOSTED_ETCD_KILLS or (cls == "etcd_wipe" and not ours):
            return False
        if cls == "etcd_wipe":
            shutil.rmtree(data, ignore_errors=True)
        if not signal_proven(etcd, signal.SIGKILL, proof):
            return False
        self.hosted_kills[host.proc.pid] = self.hosted_kills.get(host.proc.pid, 0) + 1
        what = "data dir deleted, SIGKILL" if cls == "etcd_wipe" else "SIGKILL"
        self.record(job, cls, target, f"{what} pid {etcd.pid} (its agent restarts it)")

        def back() -> bool | None:
            if host.proc.poll() is not None:
                return None
            now = self.hosted_etcd(host)
            return now is not None and now != etcd

        self.expect(job, "etcd_restarted", ETCD_BACK_BOUND_S, back,
                    lambda: f"{host.label} did not start its etcd again within {ETCD_BACK_BOUND_S:g} s\n"
                    + self.evidence(job), met=f"{host.label}'s etcd started again")
        return True

    def fault_disk_full(self, job: Job, u: list[float]) -> bool:
        if self.filled or not self.mounted:
            return False
        size = fill(self.logs_root)
        self.filled = True
        hold = 3 + u[0] * 27
        self.record(job, "disk_full", "logs tmpfs", f"filled ({size >> 20} MiB), freed in {hold:.1f} s")
        self.at(job, hold, "free the logs disk", self.free_disk)
        return True

    def free_disk(self) -> None:
        """Delete the filler."""
        if self.filled:
            (self.logs_root / ".chaos-filler").unlink(missing_ok=True)
            self.filled = False
            self.say("logs disk freed")

    def fault_partition(self, job: Job, u: list[float]) -> bool:
        net = self.net
        node = job.nodes[-1]
        if net is None or net.cut or not any(a.node == node for a in self.targets(job)):
            return False
        cut = 1 + u[0] * 14
        net.down()
        for a in job.live():
            if a.node == node:
                a.cut_off = True
        self.record(job, "partition", node, f"link down for {cut:.1f} s (lease_ttl {LEASE_TTL_S:g} s)")
        self.at(job, cut, "heal the partition", self.heal)
        return True

    def heal(self) -> None:
        """Bring the namespace's link back up."""
        if self.net is not None and self.net.cut:
            self.net.up()
            self.say("partition healed")

    def inject(self, job: Job, cls: str, u: list[float]) -> bool:
        """Inject one fault of `cls` with the draws `u`; False when the class has no target right now."""
        if cls in ("etcd_stop", "etcd_restart", "etcd_wipe"):
            return self.fault_etcd(job, cls, u)
        method: Callable[[Job, list[float]], bool] = getattr(self, f"fault_{cls}")
        return method(job, u)

    # ------------------------------------------------------------------ invariants

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
        if a.fate == "killed":
            self.lost["killed"] += 1
            return
        if a.code is not None and a.code < 0:  # died of a signal: only a stop signal the spec does not handle
            raise Violation("report_written", f"{a.label} died of signal {-a.code} ({a.fate or 'no fault sent'}): "
                            f"no report\n{tail(text)}")
        rd = self.run_dir(job, a)
        report_path = self.report_path(a, rd)
        if report_path is None:
            raise Violation("report_written", f"{a.label} (exit {a.code}) wrote no report.json (run dir {rd}, "
                            f"no fallback named)\n{tail(text)}")
        try:
            report = json.loads(report_path.read_text())
        except (OSError, ValueError) as e:
            raise Violation("report_written", f"{a.label}: {report_path} unreadable: {e}") from e
        self.check_outcome(job, a, report, text)
        self.check_transitions(job, a, report)

    def report_path(self, a: Agent, rd: Path | None) -> Path | None:
        """report.json in the run dir, else the fallback the console names."""
        if rd is not None and (rd / "report.json").is_file():
            return rd / "report.json"
        for line in read_text(a.out).splitlines():
            if line.startswith("runner: report: "):
                path = Path(line.removeprefix("runner: report: ").split(" (")[0])
                if path.is_file():
                    return path
        return None

    def check_outcome(self, job: Job, a: Agent, report: dict[str, Any], text: str) -> None:
        """Exit code, report and the workers' own markers agree."""
        outcome, code = report.get("outcome"), report.get("exit_code")
        where = f"{a.label}: exit {a.code}, report outcome {outcome} exit_code {code}"
        if code != a.code:
            raise Violation("outcome_matches_workers", f"{where}: the report's exit code is not the process's")
        if (outcome == "succeeded") != (a.code == 0):
            raise Violation("outcome_matches_workers", f"{where}: succeeded iff exit code 0")
        rd = self.run_dir(job, a)
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
                                f"finished all {self.args.steps} steps, yet the outcome is {outcome}\n{tail(text)}")
        ended = next((t.get("time", 0.0) for t in console_transitions(a) if t.get("dst") == "SHUTDOWN"), None)
        if a.fate and a.fate != "killed" and outcome != "succeeded" and (ended is None or ended >= a.fate_at):
            sig = signal.Signals[a.fate]  # (an agent already in SHUTDOWN when the signal came keeps its outcome)
            if outcome != "stopped" or a.code != 128 + sig:
                raise Violation("stop_honoured", f"{where}: {a.fate} must end it with outcome stopped and exit code "
                                f"{128 + sig}\n{tail(text)}")

    def fault_near(self, job: Job, a: Agent, when: float) -> bool:
        """A fault hit etcd, the network or this agent within RACE_S of `when` (time.time())."""
        return any(abs(f.wall - when) < RACE_S for f in job.faults
                   if f.cls in ("etcd_stop", "etcd_restart", "etcd_wipe", "partition") or f.target == a.label)

    def check_transitions(self, job: Job, a: Agent, report: dict[str, Any]) -> None:
        """Every attempt of the run (and every attempt a worker of it started in) is in transitions.jsonl, and the
        last transition is the end the report tells; a full disk excuses it only when the report says so."""
        lines, torn = self.transitions(job, a)
        warned = any("transition_write_failed" in str(w) for w in report.get("warnings", []))
        if warned:
            return
        where = f"{a.label} ({self.run_dir(job, a)})"
        if torn:
            raise Violation("attempts_recorded", f"{where}: {torn} torn line(s) in transitions.jsonl and no "
                            "transition_write_failed warning in the report")
        seen = {t.get("attempt") for t in lines}
        rd = str(self.run_dir(job, a))
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
                self.say(f"job {job.index}: {e.met} after {now - e.since:.2f} s")
                self.timings.setdefault(e.invariant, []).append(now - e.since)
            if state is None or state:
                continue
            if now >= e.deadline:
                raise Violation(e.invariant, e.detail())
            keep.append(e)
        job.expects = keep

    def check_job_end(self, job: Job) -> None:
        """Once every agent of the job exited: nothing of it survives, its etcd keys expire, it completed."""
        deadline = time.monotonic() + GONE_BOUND_S
        while (left := self.job_processes(job)) and time.monotonic() < deadline:
            time.sleep(0.2)
            reap_orphans(self.own_pids())
        if left:
            raise Violation("nothing_survives", f"{len(left)} process(es) of job {job.index} outlived it by "
                            f"{GONE_BOUND_S:g} s: " + "; ".join(d for _, d in left))
        while job.expects:  # e.g. a lease revoke still pending: wait out its deadline
            self.check_expects(job)
            if job.expects:
                time.sleep(0.2)
        if self.args.hosted:
            port = int(job.endpoint.rpartition(":")[2])
            if port_listening(port):
                raise Violation("nothing_survives", f"the hosted etcd's port {port} still listens after the job")
        else:
            self.check_keys(job)
        self.check_completed(job)

    def check_keys(self, job: Job) -> None:
        """After the last agent's end plus lease_ttl: no key of the job on a live lease, but the final states (on
        their own lease, at most an hour)."""
        last_end = max((a.ended for a in job.agents), default=time.time())
        time.sleep(max(0.0, last_end + LEASE_TTL_S + 2 - time.time()))
        if self.etcd is not None and not self.etcd.up:
            self.etcd_start()
        keys = self.etcd_keys(job)
        if keys is None:
            raise Violation("etcd_keys_expire", "cannot read the job's keys from etcd")
        leases: dict[int, int | None] = {}
        for key, lease in keys:
            if not lease:
                continue  # the job's record (spec, control, rounds): kept until `runner reset`, by design
            if lease not in leases:
                leases[lease] = self.lease_ttl(lease)
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
                self.say(f"job {job.index}: finished its training despite {job.loss}; agents {summary}")
                job.loss = ""
            else:
                self.lost["documented"] += 1
                self.say(f"job {job.index}: documented loss ({job.loss}); agents {summary}")
            return
        if not job.trained():
            raise Violation("job_completes", f"job {job.index} ended without finishing its training, and no "
                            f"documented loss explains it; agents {summary}\n" + self.evidence(job)
                            + self.tails(job))
        for a in job.agents:
            if a.fate:
                continue
            text = read_text(a.out)
            if a.code == 0 or (a.code == 3 and "is closed" in text):
                continue
            if a.code == 3 and a.cut_off and self.args.hosted and "did not answer" in text:
                # Cut off while the others finished: the hosted etcd ended with its host (after its bounded wait
                # for this node), so the restart this node had to charge found no etcd: exit 3, as documented.
                continue
            raise Violation("job_completes", f"{a.label} ended with exit code {a.code} in a job that completed "
                            f"(only 0, or 3 'job is closed' for a node that joined too late, are expected); "
                            f"agents {summary}\n{self.evidence(job)}--- {a.label}\n{tail(text)}")

    def evidence(self, job: Job) -> str:
        """The agents' events that explain a lost rendezvous (hosted etcd restarts, etcd data loss, give-ups)."""
        out = []
        for a in job.agents:
            for line in read_text(a.out).splitlines():
                if any(k in line for k in EVIDENCE):
                    with contextlib.suppress(ValueError):
                        event = json.loads(line)
                        what = {k: v for k, v in event.items() if k not in ("event", "job", "node", "level")}
                        out.append(f"{a.label}: {event.get('event')} {json.dumps(what)[:400]}")
        return "".join(f"{line}\n" for line in out[-12:])

    def tails(self, job: Job) -> str:
        """The last lines of every agent's output."""
        return "\n".join(f"--- {a.label} (exit {a.code})\n{tail(read_text(a.out))}" for a in job.agents)

    # ------------------------------------------------------------------ the loop

    def tick(self, job: Job) -> None:
        """Agents' exits, due actions, due expectations; orphans reaped."""
        for a in job.agents:
            if a.code is None and a.proc.poll() is not None:
                a.code, a.ended = a.proc.returncode, time.time()
                self.say(f"job {job.index}: {a.label} exited {a.code}")
        for a in job.agents:
            if a.code is not None and not a.checked:
                self.check_agent_end(job, a)
        now = time.monotonic()
        due = [t for t in job.timed if t[0] <= now]
        job.timed = [t for t in job.timed if t[0] > now]
        for _, _what, action in sorted(due, key=lambda t: t[0]):
            action()
        self.check_expects(job)
        if now >= self.next_scan:
            self.next_scan = now + 1.0
            for a in job.live():
                self.scan_output(job, a)
        reap_orphans(self.own_pids())

    def over(self, job: Job) -> bool:
        """No agent runs and none will be started."""
        if job.live():
            return False
        starts = [t for t in job.timed if t[1].startswith(("requeue", "late"))]
        return not starts or job.trained() or job.host_stopped

    def run_job(self, soak_end: float) -> None:
        """One job: start, faults until its window closes, then its end within a bound; invariants throughout."""
        job = self.new_job()
        self.job = job
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
                self.say(f"job {job.index}: no more faults; it must end within {self.end_bound():.0f} s")
            if end_bound and now > end_bound:
                raise Violation("job_completes", f"job {job.index} still runs {self.end_bound():.0f} s after its "
                                f"last fault: " + ", ".join(f"{a.label}: {self.state_of(a)}" for a in job.live())
                                + "\n" + self.tails(job))
            time.sleep(TICK_S)
        self.finish_job(job)

    def start_nodes(self, job: Job, window: float) -> None:
        """Start every node, but the late one (drawn for half the jobs), which starts 3-18 s later."""
        late_u = [self.rng.random() for _ in range(3)]
        late = None
        if "late_join" not in self.disabled and self.args.nodes > 2 and late_u[0] < 0.5:
            late = self.pick(job.nodes, late_u[1])
        self.say(f"job {job.index}: {job.name}, {len(job.nodes)} nodes, {self.args.steps} steps, faults for "
                 f"{window:.0f} s{'; late node ' + late if late else ''}")
        for node in job.nodes:
            if node != late:
                self.start_agent(job, node)
        if late is None:
            return
        delay = 3 + late_u[2] * 15

        def join() -> None:
            if job.trained():
                return
            agent = self.start_agent(job, late)
            self.record(job, "late_join", late, f"started {delay:.1f} s after the others")
            self.expect(job, "late_join_admitted", LATE_ADMIT_BOUND_S, lambda: self.admitted(job, agent),
                        lambda: f"the late node {late} did not get to RUNNING within {LATE_ADMIT_BOUND_S:g} s; "
                        f"it is in {self.state_of(agent)}", met=f"late node {late} RUNNING")

        self.at(job, delay, "late join", join)

    def fault_step(self, job: Job, now: float) -> None:
        """Draw the next fault (class and parameters) and inject it; a class with no target right now is tried
        again each second, 4 times, then counted as skipped. The draws do not depend on the retries."""
        enabled = [c for c in self.classes if c not in self.disabled]
        if not enabled:
            self.next_fault = job.quiet_from
            return
        if self.pending is None:
            self.pending = (self.rng.choice(enabled), [self.rng.random() for _ in range(4)], 0)
        cls, u, tries = self.pending
        if self.inject(job, cls, u):
            self.pending, self.next_fault = None, now + self.interval()
        elif tries >= 4:
            self.skipped[cls] += 1
            self.say(f"job {job.index}: {cls} skipped (no target)")
            self.pending, self.next_fault = None, now + self.interval()
        else:
            self.pending, self.next_fault = (cls, u, tries + 1), now + 1.0

    def finish_job(self, job: Job) -> None:
        """Every agent ended: restore what a fault still holds, check the job's end, count, clean up."""
        self.tick(job)
        for _, what, action in job.timed:
            if not what.startswith(("requeue", "late")):
                self.say(f"job {job.index}: {what} (at the job's end)")
                action()
        job.timed = []
        self.free_disk()
        self.heal()
        self.etcd_start()
        self.check_job_end(job)
        took = time.monotonic() - job.started
        for f in job.faults:
            self.survived[f.cls] += 1
        ends = ", ".join(f"{a.label}={a.code}{'/' + a.fate if a.fate else ''}" for a in job.agents)
        self.say(f"job {job.index}: ended in {took:.1f} s, {len(job.faults)} faults, invariants held; {ends}")
        self.outcomes.append(f"job {job.index}: {took:.0f} s, {len(job.faults)} faults"
                             + (f", documented loss: {job.loss}" if job.loss else ", trained"))
        if not self.args.keep:
            shutil.rmtree(job.logs, ignore_errors=True)

    def admitted(self, job: Job, agent: Agent) -> bool | None:
        """The agent got to RUNNING (None: moot, it ended or got a fault, or the job finished)."""
        if agent.code is not None or agent.fate or job.trained():
            return None
        return any(t.get("dst") == "RUNNING" for t in console_transitions(agent))

    def state_of(self, a: Agent) -> str:
        """The agent's last state, from the transitions on its console (a full logs disk does not hide them)."""
        lines = console_transitions(a)
        return str(lines[-1].get("dst", "?")) if lines else "INIT"

    def interval(self) -> float:
        """Seconds to the next fault: --failure-every, +-50 %."""
        return self.args.failure_every * (0.5 + self.rng.random())

    def end_bound(self) -> float:
        """How long a job may take to end after its last fault."""
        return 180.0 + self.args.steps * STEP_TIME_S * 3

    def run(self) -> int:
        """The soak; its exit code."""
        soak_end = self.t0 + self.args.duration
        violation: Violation | None = None
        error = ""
        try:
            self.setup()
            # a new job only while a fault can still come in its window
            while not self.jobs or soak_end - time.monotonic() >= min(self.args.failure_every, self.args.job_window):
                self.run_job(soak_end)
        except Violation as v:
            violation = v
            if v.invariant in self.lost:
                self.lost[v.invariant] += 1
        except KeyboardInterrupt:
            error = "interrupted"
        except Exception:
            error = traceback.format_exc()
        finally:
            self.teardown(keep=self.args.keep or violation is not None or bool(error))
        self.print_table(violation, error)
        if violation is not None:
            return 1
        return 2 if error else 0

    def setting(self) -> str:
        """The soak's setting, for the table's title."""
        return f"{'hosted etcd' if self.args.hosted else 'external etcd'}, {self.args.nodes} nodes"

    def extra_tables(self) -> list[str]:
        """More tables printed before the jobs' outcomes (none here)."""
        return []

    def print_table(self, violation: Violation | None, error: str) -> None:
        """Faults per class, survived, skipped; what was lost; the verdict."""
        rows = []
        for cls in self.all_classes:
            if self.disabled.get(cls):
                rows.append([cls, "-", "-", "-", f"skipped: {self.disabled[cls]}"])
            else:
                rows.append([cls, str(self.injected[cls]), str(self.survived[cls]), str(self.skipped[cls]), ""])
        print()
        print(f"Chaos soak, seed {self.args.seed}, {time.monotonic() - self.t0:.0f} s, {len(self.jobs)} job(s), "
              f"{self.setting()}")
        print(f"Machine: {machine_line()}")
        print()
        print(table(["class", "injected", "survived (invariants held)", "no target", "note"], rows))
        print()
        print(table(["lost", "count"], [[what, str(self.lost[key])] for key, what in self.lost_rows.items()]))
        if self.timings:
            print()
            rows = [[self.measured.get(k, k), str(len(v)), f"{statistics.median(v):.2f}", f"{max(v):.2f}"]
                    for k, v in sorted(self.timings.items())]
            print(table(["from the fault to", "n", "median s", "max s"], rows))
        for extra in self.extra_tables():
            print()
            print(extra)
        print()
        for line in self.outcomes:
            print(f"- {line}")
        if violation is not None:
            print(f"\nFAILED: seed {self.args.seed}: invariant {violation.invariant} broke:\n{violation.detail}")
        elif error:
            print(f"\nERROR (the soak itself, not an invariant): seed {self.args.seed}:\n{error}")
        else:
            print(f"\nOK: every invariant held (seed {self.args.seed})")
        print(f"Replay: {self.replay()}", flush=True)
        if (violation is not None or error) and self.job is not None:
            print(f"Replay only job {self.job.index}: {self.replay(self.job.index)}", flush=True)


def console_transitions(a: Agent) -> list[dict[str, Any]]:
    """The `transition` events among the agent's JSON log lines (its console, on the soak's own disk)."""
    found = []
    for line in read_text(a.out).splitlines():
        if line.startswith("{") and '"transition"' in line:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if event.get("event") == "transition":
                    found.append(event)
    return found


def port_listening(port: int) -> bool:
    """Something listens on TCP `port` on this machine (any address)."""
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in read_text(Path(name)).splitlines()[1:]:
            parts = line.split()
            if len(parts) > 3 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def tail(text: str, lines: int = 12) -> str:
    """The last lines of an agent's output."""
    return "\n".join(text.splitlines()[-lines:])


def context(text: str, needle: str, after: int = 12) -> str:
    """The lines from the one holding `needle` on."""
    lines = text.splitlines()
    i = next((i for i, line in enumerate(lines) if needle in line), 0)
    return "\n".join(lines[max(0, i - 1):i + after])


def excerpt(text: str, needle: str) -> str:
    """The line of `text` holding `needle`."""
    return next((line for line in text.splitlines() if needle in line), "")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    p.add_argument("--duration", type=float, default=300.0, help="seconds of faults in all (jobs end after it)")
    p.add_argument("--hosted", action="store_true", help="rendezvous.hosted: one agent hosts etcd")
    p.add_argument("--nodes", type=int, default=3, help="agents per job (nodes: 2:K)")
    p.add_argument("--failure-every", type=float, default=10.0, help="mean seconds between faults")
    p.add_argument("--steps", type=int, default=200, help="training steps per job (0.1 s each)")
    p.add_argument("--job-window", type=float, default=60.0, help="seconds of faults per job, then it must end")
    p.add_argument("--classes", default="", help="comma-separated fault classes to draw from (default: all)")
    p.add_argument("--no-standby", dest="standby", action="store_false",
                   help="restart.standby false (cold workers); the default is the product's: warm workers forked "
                        "from the fork server")
    p.add_argument("--first-job", type=int, default=1, help="number of the first job (replays job N's schedule)")
    p.add_argument("--keep", action="store_true", help="keep every log (a failing run keeps them anyway)")
    p.add_argument("--replica-groups", action="store_true",
                   help="single-node replica-group jobs (2 groups, hosted TorchFT lighthouse): bench/chaos_replicas.py")
    args = p.parse_args()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 10**6)
    soak: type[Soak] = Soak
    if args.replica_groups:
        from bench.chaos_replicas import ReplicaSoak, missing_torchft

        if args.hosted:
            p.error("--replica-groups runs one node with no etcd: --hosted does not apply")
        if why := missing_torchft():
            print(f"chaos soak: {why}", file=sys.stderr)
            return 2
        soak = ReplicaSoak
    elif args.nodes < 2:
        p.error("--nodes must be at least 2")
    unknown = set(filter(None, args.classes.split(","))) - set(soak.all_classes)
    if unknown:
        p.error(f"unknown classes {sorted(unknown)}; known: {', '.join(soak.all_classes)}")
    print(f"chaos soak: seed {args.seed}", flush=True)

    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    if soak is Soak:
        shutil.which("etcd") or etcd_binary()  # fails early, with the fix, when etcd is not installed
    return soak(args).run()


if __name__ == "__main__":
    sys.exit(main())
