"""Every path of a run directory, and of the runner's per-user state folder, spelled here and only here.

A run dir, `<logs.dir>/<job>/<UTC time>-<random>/` (`<logs.dir>/<job>/latest` links the newest):

    spec.json                  the spec as run (secrets masked)
    agent.jsonl                every event the agent logged
    transitions.jsonl          the state machine's transitions (a replica job's: the job machine's)
    status.json                the live state, rewritten while the run lives (runner/rundir/records.py Status)
    report.json                the run's end (runner/rundir/records.py Report)
    attempt_<k>/failure.json   attempt k's failure
    attempt_<k>/rank_<r>/      global rank r's stdout.log, stderr.log, error.json (torch's), heartbeat
    standby/server.log         the standbys' fork server
    group_<k>/                 replica group k: a run dir of its own, inside the job's

The per-user state folder (`$XDG_STATE_HOME/runner`, else `~/.local/state/runner`): `runs.jsonl` (the runs
index), `ledger/<job>-<identity>.json` (a one-node job's node ledger), `reports/<name>-report.json` (a report the
run dir refused).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

SPEC = "spec.json"
AGENT_LOG = "agent.jsonl"
TRANSITIONS = "transitions.jsonl"
STATUS = "status.json"
REPORT = "report.json"
FAILURE = "failure.json"
STDOUT = "stdout.log"
STDERR = "stderr.log"
ERROR_FILE = "error.json"
HEARTBEAT = "heartbeat"
STACKS = "stacks.txt"  # a hung rank's Python stacks, beside its logs
TIMER_DIR = "timer"  # the file-timer channels, one FIFO a local rank
LATEST = "latest"
ATTEMPT_PREFIX = "attempt_"
RANK_PREFIX = "rank_"
GROUP_PREFIX = "group_"
AGENT_FILES = (AGENT_LOG, TRANSITIONS)  # the agent holds these open in its run dir until it ends


def numbered(prefix: str, name: str) -> int:
    """3 for ('attempt_', 'attempt_3'); -1 for a name that is not the prefix and a number."""
    tail = name.removeprefix(prefix) if name.startswith(prefix) else ""
    return int(tail) if tail.isdigit() else -1


def attempt_number(name: str) -> int:
    """3 for 'attempt_3' (-1 for anything else)."""
    return numbered(ATTEMPT_PREFIX, name)


def rank_dir(run_dir: str, attempt: int, rank: int) -> str:
    """A worker's log dir: <run dir>/attempt_<k>/rank_<r> (a string: it goes into the worker's environment)."""
    return f"{run_dir}/{ATTEMPT_PREFIX}{attempt}/{RANK_PREFIX}{rank}"


def stdout_log(log_dir: str) -> str:
    """Where a rank's stdout is kept."""
    return f"{log_dir}/{STDOUT}"


def stderr_log(log_dir: str) -> str:
    """Where a rank's stderr is kept."""
    return f"{log_dir}/{STDERR}"


def error_file(log_dir: str) -> str:
    """Where a rank's torch error file goes (TORCHELASTIC_ERROR_FILE)."""
    return f"{log_dir}/{ERROR_FILE}"


def heartbeat_file(log_dir: str) -> str:
    """Where a rank's heartbeat file goes (RUNNER_HEARTBEAT_FILE)."""
    return f"{log_dir}/{HEARTBEAT}"


def stacks_file(log_dir: str) -> Path:
    """Where a hung rank's stacks are kept (the watchdog's and the stall detector's)."""
    return Path(log_dir, STACKS)


def timer_dir(run_dir: str | os.PathLike[str]) -> Path:
    """<run dir>/timer/: the file-timer channels."""
    return Path(run_dir) / TIMER_DIR


def timer_fifo(folder: Path, local_rank: int) -> Path:
    """A local rank's file-timer channel in `folder` (timer_dir): rank_<local rank>.fifo."""
    return folder / f"{RANK_PREFIX}{local_rank}.fifo"


def job_dir(logs_dir: str | os.PathLike[str], job: str) -> Path:
    """<logs.dir>/<job>: every run of the job from this logs folder."""
    return Path(logs_dir).expanduser().absolute() / job


def run_name(stamp: str, random: str) -> str:
    """A run dir's own name: <UTC time>-<random>."""
    return f"{stamp}-{random}"


@dataclass(frozen=True)
class RunDir:
    """One run dir (a replica group's too): each of its paths from its root."""

    root: Path

    @classmethod
    def latest(cls, logs_dir: str | os.PathLike[str], job: str) -> RunDir:
        """The job's newest run from this logs folder (<logs.dir>/<job>/latest)."""
        return cls(job_dir(logs_dir, job) / LATEST)

    @property
    def spec(self) -> Path:
        """The spec as run."""
        return self.root / SPEC

    @property
    def agent_log(self) -> Path:
        """Every event the agent logged."""
        return self.root / AGENT_LOG

    @property
    def transitions(self) -> Path:
        """The state changes."""
        return self.root / TRANSITIONS

    @property
    def status(self) -> Path:
        """The live state."""
        return self.root / STATUS

    @property
    def report(self) -> Path:
        """The run's end."""
        return self.root / REPORT

    @property
    def standby_log(self) -> Path:
        """The standbys' fork server's log."""
        return self.root / "standby" / "server.log"

    def attempt(self, k: int) -> Path:
        """attempt_<k>/."""
        return self.root / f"{ATTEMPT_PREFIX}{k}"

    def failure(self, k: int) -> Path:
        """attempt_<k>/failure.json."""
        return self.attempt(k) / FAILURE

    def rank(self, attempt: int, rank: int) -> Path:
        """attempt_<k>/rank_<r>/: a worker's log dir."""
        return Path(rank_dir(str(self.root), attempt, rank))

    def group(self, k: int) -> RunDir:
        """Replica group k's own run dir."""
        return RunDir(self.root / f"{GROUP_PREFIX}{k}")

    def groups(self) -> list[RunDir]:
        """The replica groups' run dirs found in this one, by group number (none for a job of one group)."""
        found = [p for p in self.root.glob(f"{GROUP_PREFIX}*") if numbered(GROUP_PREFIX, p.name) >= 0]
        return [RunDir(p) for p in sorted(found, key=lambda p: numbered(GROUP_PREFIX, p.name))]

    def has_groups(self) -> bool:
        """Whether any group_<k> entry is here (a run of replica groups)."""
        return any(self.root.glob(f"{GROUP_PREFIX}*"))

    def failures(self) -> list[Path]:
        """Each attempt_<k>/failure.json there is, by attempt."""
        found = self.root.glob(f"{ATTEMPT_PREFIX}*/{FAILURE}")
        return sorted(found, key=lambda p: attempt_number(p.parent.name))

    def is_run_dir(self) -> bool:
        """A folder an agent wrote."""
        return self.transitions.is_file() or self.agent_log.is_file()


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The runner's per-user state folder: $XDG_STATE_HOME/runner, else ~/.local/state/runner."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_STATE_HOME") or ""
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state"  # the XDG spec: ignore relative
    return root / "runner"


def ledger_path(job: str, identity: str, environ: Mapping[str, str] | None = None) -> Path:
    """The node ledger of a one-node job (runner/rendezvous/node_ledger.py): <state dir>/ledger/<job>-<identity>.json.

    `identity` is JobSpec.identity(): two jobs of one name (another folder, another script) keep two ledgers.
    """
    return state_dir(environ) / "ledger" / f"{quote(job, safe='')}-{quote(identity, safe='')}.json"


def members_memo_path(job: str, identity: str, environ: Mapping[str, str] | None = None) -> Path:
    """The hosted etcd's members a node of the job last knew, on its machine: <state dir>/members/<job>-<id>.json.

    Written and read by runner/rendezvous/etcd/member_memo.py.
    """
    return state_dir(environ) / "members" / f"{quote(job, safe='')}-{quote(identity, safe='')}.json"


def index_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where the runs index lives: <state dir>/runs.jsonl."""
    return state_dir(environ) / "runs.jsonl"


def report_fallbacks(name: str) -> tuple[list[Path], OSError | None]:
    """Where a report goes when its run dir refuses it: <state dir>/reports/NAME-report.json, then the temp dir's.

    With the error that left the temp dir out (no usable temp dir at all), if one did.
    """
    places = [state_dir() / "reports" / f"{name}-{REPORT}"]
    try:
        places.append(Path(tempfile.gettempdir()) / f"runner-{name}-{REPORT}")
    except OSError as e:
        return places, e
    return places, None
