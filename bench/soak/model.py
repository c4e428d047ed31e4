"""What the soak keeps about a job: its agents, faults, expectations; a broken invariant; reading agents' files."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.soak.procs import Proc


class Violation(Exception):
    """An invariant broke."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant, self.detail = invariant, detail


@dataclass
class Agent:
    """One agent process (a node's run); a node started again after a fault is a new Agent."""

    node: str
    serial: int
    proc: subprocess.Popen[bytes]
    me: Proc
    out: Path  # stdout + stderr
    started: float  # time.time()
    fate: str = ""  # "" (left alone), "killed", "lost" (its host: --hosts), or the stop signal's name
    fate_at: float = 0.0
    joining: bool = False  # a late node not yet RUNNING: no fault targets it until its admission is judged
    cut_off: bool = False  # its node's network was partitioned (or its host's link cut: --hosts) while it ran
    host_pid: int = 0  # --hosts: its pid on its simulated host (runs.jsonl records that one); 0: the same as me.pid
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
    cls: str = ""  # the fault class whose fault set it up ('' for none)


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
    timed: list[tuple[float, str, Callable[[], object]]] = field(default_factory=list)
    expects: list[Expect] = field(default_factory=list)
    quiet_from: float = 0.0  # monotonic: no new fault after this
    loss: str = ""  # a documented way for this job to end without its training done
    host_stopped: bool = False
    closed_at: float = 0.0
    trust: tuple[Path, str] | None = None  # hosted: the job's CA file and etcd root's password (from its secret)

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


def state_of(a: Agent) -> str:
    """The agent's last state, from the transitions on its console (a full logs disk does not hide them)."""
    lines = console_transitions(a)
    return str(lines[-1].get("dst", "?")) if lines else "INIT"


def evidence(job: Job, needles: tuple[str, ...]) -> str:
    """The agents' events holding one of `needles` (bounds.EVIDENCE: what explains a lost rendezvous)."""
    out = []
    for a in job.agents:
        for line in read_text(a.out).splitlines():
            if any(k in line for k in needles):
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    what = {k: v for k, v in event.items() if k not in ("event", "job", "node", "level")}
                    out.append(f"{a.label}: {event.get('event')} {json.dumps(what)[:400]}")
    return "".join(f"{line}\n" for line in out[-12:])


def tails(job: Job) -> str:
    """The last lines of every agent's output."""
    return "\n".join(f"--- {a.label} (exit {a.code})\n{tail(read_text(a.out))}" for a in job.agents)


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
