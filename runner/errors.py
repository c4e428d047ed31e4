"""Domain errors. Each carries data and the process exit code the CLI maps it to."""

from __future__ import annotations

from dataclasses import dataclass

# Exit codes of the `runner` command (documented in README "Exit codes").
EXIT_OK = 0  # every worker succeeded
EXIT_WORKERS_FAILED = 1  # workers failed and the restart policy gave up
EXIT_SPEC = 2  # bad job spec or bad command line
EXIT_INFRA = 3  # rendezvous / etcd / environment failure (not the workers' fault)
EXIT_STOPPED_BASE = 128  # stopped by a signal: 128 + signal number (130 SIGINT, 143 SIGTERM)


class RunnerError(Exception):
    """Base of every error the CLI reports as a short message instead of a traceback."""

    exit_code = EXIT_INFRA

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix


@dataclass(frozen=True)
class SpecProblem:
    """One problem in a job spec: where it is, what is wrong, how to fix it."""

    path: str  # dotted field path, e.g. "restart.backoff.initial" ("" for the document)
    message: str
    fix: str = ""
    line: int | None = None  # 1-based
    column: int | None = None  # 1-based

    def render(self, source: str) -> str:
        """One line, compiler style: `job.yaml:3:1: restart.max_restarts: must be >= 0 (fix: ...)`."""
        where = source
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        field = f"{self.path}: " if self.path else ""
        fix = f" — {self.fix}" if self.fix else ""
        return f"{where}: {field}{self.message}{fix}"


class UsageError(RunnerError):
    """A command line that would not do what it says (an option this job does not read): exit 2, nothing started."""

    exit_code = EXIT_SPEC


class SpecError(RunnerError):
    """The job spec is invalid; carries every problem found, not just the first."""

    exit_code = EXIT_SPEC

    def __init__(self, source: str, problems: list[SpecProblem]) -> None:
        self.source = source
        self.problems = problems
        lines = [p.render(source) for p in problems]
        super().__init__(f"{len(problems)} problem(s) in {source}:\n  " + "\n  ".join(lines))


class RendezvousError(RunnerError):
    """Rendezvous could not complete (timeout, closed job, unreachable store)."""

    exit_code = EXIT_INFRA


class RendezvousTimeout(RendezvousError):
    """Not enough nodes joined within join_timeout."""

    def __init__(self, job: str, waited_s: float, joined: int, needed: int) -> None:
        self.job, self.waited_s, self.joined, self.needed = job, waited_s, joined, needed
        super().__init__(
            f"rendezvous for job '{job}' timed out after {waited_s:.1f} s: {joined} of {needed} node(s) joined",
            fix="start the missing nodes, lower nodes.min, or raise rendezvous.join_timeout",
        )


class JobClosed(RendezvousError):
    """The job was stopped or has finished; a node arriving now must not start workers."""

    def __init__(self, job: str, why: str, stopped_by: str = "") -> None:
        """`why`: the control key's state; `stopped_by`: who wrote a "stopping" one, if not `runner stop`."""
        self.stopping = why == "stopping"  # a stop (runner stop, or the hosting node's), not the job's end
        why = (stopped_by or "stopped by runner stop") if self.stopping else why
        self.job, self.why = job, why
        super().__init__(
            f"job '{job}' is closed ({why}); not joining",
            fix="run `runner reset job.yaml` to forget the ended job's state and reuse its name (or rename the job)",
        )
