"""How a job ended on this node, for a job of one group or of many: what `runner run` prints and exits with."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runner.outcomes import Outcome
from runner.system import soft_io

if TYPE_CHECKING:
    from runner.core.context import Context


@dataclass(frozen=True)
class JobResult:
    """The job's outcome and exit code on this node, and the summary a human reads at the end."""

    name: str
    run_dir: Path
    outcome: Outcome
    exit_code: int
    summary: tuple[str, ...]  # lines for stderr, each starting with "runner:"


def of_group(ctx: Context) -> JobResult:
    """A job of one group: outcome, attempts, each root cause, recoveries, warnings, where the logs are."""
    outcome = ctx.outcome or Outcome.STOPPED
    head = (f"runner: job '{ctx.spec.name}' {ctx.outcome} after "
            f"{attempts_words(ctx.run.attempt + 1, ctx.run.restarts, ctx.run.uncharged)}; exit code {ctx.exit_code}")
    lines = [head]
    failures = ctx.run.failures  # SHUTDOWN adds a fatal failure that skipped FAILED
    lines += [f"runner:   attempt {f.attempt}: {f.reason}" for f in failures[:-1]]
    if failures and ctx.outcome is not Outcome.SUCCEEDED:
        lines.append("runner: " + failures[-1].report().replace("\n", "\nrunner: "))
    elif failures:
        lines.append(f"runner:   attempt {failures[-1].attempt}: {failures[-1].reason}")
    if recovered := ctx.recovery.line():
        lines.append(f"runner: {recovered}")
    details = "details above" if "agent_log_write_failed" in soft_io.failures() else "details in agent.jsonl"
    lines += [f"runner: warning: {w.replace('_', ' ')} (the job's result stands; {details})" for w in ctx.warnings.seen]
    lines += disk_warnings(ctx.warnings.seen)
    lines.append(f"runner: logs: {ctx.inputs.run_dir}")
    if ctx.report_path is None:
        lines.append("runner: warning: report.json could not be written anywhere")
    elif ctx.report_path.parent != ctx.inputs.run_dir:
        lines.append(f"runner: report: {ctx.report_path} (the run dir could not take it)")
    return JobResult(ctx.spec.name, ctx.inputs.run_dir, outcome, ctx.exit_code, tuple(lines))


# An attempt restart.max_restarts did not pay for, by its cause (runner/states/restarting.py): one, several.
UNCHARGED_WORDS = {
    "node_lost": ("re-rendezvous after a lost node", "re-rendezvous after lost nodes"),
    "preempted": ("re-rendezvous after a preempted node", "re-rendezvous after preempted nodes"),
    "membership": ("re-rendezvous for a joining node", "re-rendezvous for joining nodes"),
}


def attempts_words(attempts: int, restarts: int, uncharged: Mapping[str, int]) -> str:
    """The summary's count of attempts in words, e.g. `2 attempts (1 restart)`.

    `1 attempt`; `2 attempts (1 re-rendezvous after a lost node, uncharged; 0 restarts)`.
    `restarts`: those charged to restart.max_restarts; `uncharged`: the other new attempts, by cause.
    """
    text = f"{attempts} attempt{'' if attempts == 1 else 's'}"
    parts = []
    for cause, count in uncharged.items():
        one, many = UNCHARGED_WORDS.get(cause, (f"restart after a failure of class {cause}",
                                                 f"restarts after failures of class {cause}"))
        parts.append(f"{count} {one if count == 1 else many}, uncharged")
    if parts or restarts or attempts > 1:
        parts.append(f"{restarts} restart{'' if restarts == 1 else 's'}")
        text += f" ({'; '.join(parts)})"
    return text


def disk_warnings(seen: Iterable[str]) -> list[str]:
    """A line per kind of write the disk refused (runner/system/soft_io.py) that is not among `seen` already."""
    skip = set(seen)
    return [f"runner: warning: {kind.replace('_', ' ')}: {detail} (the job's result stands)"
            for kind, detail in soft_io.failures().items() if kind not in skip]
