"""What every part of the soak shares: its options (typed), the run's state (tally, jobs, clock) and its folder.

The soak is a plan of separate objects (bench/soak/soak.py composes them): `JobProcesses` (a job's processes and
files), `EtcdView` (the rendezvous store's keys and leases), `Faults` (inject one fault of a class) and `Checks` (the
invariants). Each receives the one `SoakState` below, and reads only what it declares.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

from bench.soak.infra import ChaosEtcd, Netns
from bench.soak.model import Expect, Fault, Job
from bench.soak.verdict import Tally


@dataclass
class Options:
    """bench/chaos.py's options (bench/soak/cli.py), typed."""

    seed: int
    duration: float
    hosted: bool
    nodes: int
    failure_every: float
    steps: int
    job_window: float
    classes: str  # comma-separated, '' for all
    standby: bool
    first_job: int
    keep: bool
    replica_groups: bool = False
    hosts: bool = False
    etcd_members: int = 1
    hosted_members: int = 1  # --hosts --hosted: rendezvous.hosted_members of every job (1 or 3)
    single_member_faults: bool = False  # --hosted-members 3: every member fault waits for 3 voting members, all up

    @classmethod
    def of(cls, ns: argparse.Namespace) -> Options:
        """The options argparse parsed (those it does not name keep their defaults)."""
        return cls(**{f.name: getattr(ns, f.name) for f in fields(cls) if hasattr(ns, f.name)})


@dataclass
class SoakState:
    """The state every part of a soak reads: options, the seeded generator of the current job, the tally, the jobs,
    the clock of the log, the folder, and the infrastructure of the default mode (its etcd, network namespace and
    logs tmpfs). Its folder is made by `make_folder()` (the soak's setup) unless one is given: a soak only built
    (as tests build one) leaves nothing behind."""

    args: Options
    all_classes: tuple[str, ...]
    lost_rows: dict[str, str]
    folder: Path | None = None  # the soak's folder: given, or made by make_folder()
    made_folder: bool = False  # True: the soak made its folder (and removes it at teardown, unless kept)
    t0: float = field(default_factory=time.monotonic)
    rng: random.Random = field(init=False)  # replaced by each job's own (seed, job number) generator
    tally: Tally = field(init=False)
    lost: dict[str, int] = field(init=False)
    firing: str = ""  # the class of the fault being injected: the expectations it sets up are that class's
    etcd_crashes: list[str] = field(default_factory=list)  # our etcd's exits that no fault caused
    jobs: list[Job] = field(default_factory=list)
    job: Job | None = None
    timings: dict[str, list[float]] = field(default_factory=dict)  # invariant -> seconds its expectations took
    outcomes: list[str] = field(default_factory=list)
    mounted: bool = False  # the logs tmpfs is mounted at logs_root
    etcd: ChaosEtcd | None = None  # the default mode's own etcd (None: hosted, or not started)
    net: Netns | None = None  # the default mode's network namespace (None: none, partition skipped)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.args.seed)
        self.tally = Tally(self.all_classes)
        self.lost = dict.fromkeys(self.lost_rows, 0)

    # ------------------------------------------------------------------ the folder

    def make_folder(self) -> Path:
        """The soak's folder, made now if none was given (chaos-SEED-* under TMPDIR)."""
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(prefix=f"chaos-{self.args.seed}-"))
            self.made_folder = True
        return self.folder

    @property
    def base(self) -> Path:
        """The soak's folder (setup makes it: make_folder)."""
        if self.folder is None:
            raise RuntimeError("the soak's folder is made by its setup (SoakState.make_folder); none yet")
        return self.folder

    @property
    def logs_root(self) -> Path:
        """Where the logs tmpfs is mounted."""
        return self.base / "logsfs"

    @property
    def disabled(self) -> dict[str, str]:
        """Class -> why it is not enabled (the tally's own dict)."""
        return self.tally.disabled

    # ------------------------------------------------------------------ output and timed work

    def say(self, text: str) -> None:
        """One line of the soak's log, with the time since the start."""
        print(f"[{time.monotonic() - self.t0:7.1f}s] {text}", flush=True)

    def at(self, job: Job, delay: float, what: str, action: Callable[[], object]) -> None:
        """Run `action` `delay` s from now (restorative actions run even after the job's fault window; what it
        returns is dropped)."""
        job.timed.append((time.monotonic() + delay, what, action))

    def expect(self, job: Job, invariant: str, within: float, check: Callable[[], bool | None],
               detail: Callable[[], str], met: str = "", cls: str | None = None) -> None:
        """`check` must turn True (or None: moot) within `within` s; `met` is printed with the time it took. The
        class that brings it: `cls`, else the fault being injected (a timed action names its class itself)."""
        now = time.monotonic()
        job.expects.append(Expect(invariant, now + within, check, detail, now, met,
                                  self.firing if cls is None else cls))

    def record(self, job: Job, cls: str, target: str, detail: str) -> Fault:
        """Count and print one fault."""
        f = Fault(cls, job.index, time.monotonic() - self.t0, time.time(), target, detail)
        job.faults.append(f)
        self.tally.injected(cls)
        self.say(f"job {job.index}: {cls} {target}: {detail}")
        return f
