"""A replica group as the supervisor sees it (`Group`), and the job's end (`ReplicaJob`).

These are runner/agent/replicas.py's records, apart from it so that its placement and books (placement.py,
replica_books.py) name them without importing the supervisor: no import runs both ways between the three.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from runner.agent.assembly import Run
from runner.agent.result import JobResult, attempts_words, disk_warnings
from runner.agent.services import workers_status
from runner.core import job_policy
from runner.core.context import Context
from runner.core.machine import Model
from runner.errors import EXIT_INFRA
from runner.outcomes import Outcome


@dataclass
class Group:
    """One replica group as the supervisor sees it: its run (context, machine, transition log), what it reported."""

    run: Run
    step: int | None = None  # the last step its rank 0 committed (None: not reported yet)
    steps: list[tuple[float, int]] = field(default_factory=list)  # (epoch seconds, step) on every change
    ended: bool = False  # its run is over: SHUTDOWN's work done, what was left torn down

    @property
    def ctx(self) -> Context:
        """The group's context."""
        return self.run.ctx

    @property
    def model(self) -> Model:
        """The group's machine."""
        return self.run.model

    def view(self) -> job_policy.GroupView:
        """What the job's guards read of it."""
        return job_policy.GroupView(self.index, self.model.state, self.ctx.run.attempt, self.ctx.outcome,
                                    self.ctx.exit_code, self.ended)

    @property
    def index(self) -> int:
        """REPLICA_GROUP_ID."""
        assert self.ctx.inputs.replica is not None
        return self.ctx.inputs.replica.group

    def status(self) -> dict[str, object]:
        """This group's line of the job's status (the JSON boundary)."""
        return {
            "group": self.index,
            "state": self.model.state.value,
            "attempt": self.ctx.run.attempt,
            "restarts": self.ctx.run.restarts,
            "step": self.step,
            "workers": workers_status(self.ctx),  # their pids: `runner status` shows them (docs/replica_groups.md)
            "outcome": self.ctx.outcome.value if self.ctx.outcome is not None else None,
            "ledger": self.ctx.recovery.status().get("ledger"),  # its ETTR so far (docs/goodput.md)
        }


@dataclass
class ReplicaJob:
    """The job's end: outcome, exit code, why, and every group's report (what `runner run` prints and exits with)."""

    name: str
    run_dir: Path
    outcome: Outcome = Outcome.STOPPED
    exit_code: int = EXIT_INFRA
    reason: str = ""
    fix: str = ""  # what to do about an error that kept the groups from starting
    groups: list[Group] = field(default_factory=list)
    report_path: Path | None = None

    def summary(self) -> list[str]:
        """The lines `runner run` prints at the end."""
        lines = [f"runner: job '{self.name}' {self.outcome} ({self.reason}); exit code {self.exit_code}"]
        if self.fix:
            lines.append(f"runner:   fix: {self.fix}")
        for g in self.groups:
            failures = g.ctx.run.failures
            last = f"; last failure: {failures[-1].reason}" if failures else ""
            step = f", step {g.step}" if g.step is not None else ""
            attempts = attempts_words(g.ctx.run.attempt + 1, g.ctx.run.restarts, g.ctx.run.uncharged)
            lines.append(f"runner:   group {g.index}: {g.ctx.outcome} after {attempts}{step}{last}")
        lines.append(f"runner: logs: {self.run_dir}")
        if self.report_path is None:
            lines.append("runner: warning: report.json could not be written")
        elif self.report_path.parent != self.run_dir:  # as a single group's summary: where it went instead
            lines.append(f"runner: report: {self.report_path} (the run dir could not take it)")
        return lines

    def result(self) -> JobResult:
        """The job's end as `runner run` prints and exits with it (the same type as a job of one group's)."""
        return JobResult(self.name, self.run_dir, self.outcome, self.exit_code,
                         (*self.summary(), *disk_warnings(())))
