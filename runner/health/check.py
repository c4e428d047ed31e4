"""One try of every health check a spec asks for (`check`, `check_spec`), and the tries until one passes.

`check` runs the checks at the same time (the commands one after another, in the order written), bounded by one
time limit: what has not finished by then is cancelled (a command's process group killed) and reported as a
failure. It never raises for a check's sake: anything a check could not do is a failure with its reason.

`until_healthy` is what a node does before it joins a round: try; if a check failed, log `health_failed` with
the reasons, hand the report to the caller (status, report.json) and try again after retry_interval; once
give_up_after has passed since the first try, raise `Unhealthy` (exit 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from runner.config.durations import format_duration
from runner.config.redact import redact_value
from runner.errors import EXIT_INFRA, RunnerError
from runner.health.commands import ProcessGuard, run_command
from runner.health.gpus import TIMEOUT_S as NVIDIA_SMI_TIMEOUT_S
from runner.health.gpus import check_gpus
from runner.health.probes import MEMINFO, check_memory, check_space
from runner.health.report import HealthFailure, HealthReport, bounded
from runner.system.environ import helper_env

if TYPE_CHECKING:
    import structlog

    from runner.config.spec import Health, HealthCommand, JobSpec

SHELL = "/bin/sh"
REASON_LINES = 10  # of a failed command's output, at most
MAX_SUBJECT_CHARS = 120  # a command line as a reason names it


class Unhealthy(RunnerError):
    """The node failed its health checks for health.give_up_after: it gives up (exit 3, no worker started)."""

    exit_code = EXIT_INFRA

    def __init__(self, report: HealthReport, tries: int, waited_s: float) -> None:
        self.report, self.tries, self.waited_s = report, tries, waited_s
        tried = f"{tries} tr{'y' if tries == 1 else 'ies'}"
        super().__init__(
            f"health checks failed for {format_duration(round(waited_s, 1))} ({tried}): {'; '.join(report.reasons())}",
            fix="make room, free memory or fix the GPUs on this node, or change the spec's health section "
                "(docs/health.md)",
        )


def shown_command(line: str) -> str:
    """A command line as a reason names it: secrets masked, at most MAX_SUBJECT_CHARS."""
    text = redact_value(" ".join(line.split()))
    return text if len(text) <= MAX_SUBJECT_CHARS else text[: MAX_SUBJECT_CHARS - 3] + "..."


def command_reason(result_code: int | None, output: str, *, timed_out: bool, timeout: float, error: str) -> str:
    """Why a command failed: how it ended, then the last lines of its stderr (else its stdout)."""
    if error:
        return error
    if timed_out:
        how = f"did not finish in {format_duration(timeout)} (its process group was killed)"
    elif result_code is not None and result_code < 0:
        how = f"killed by {_signal_name(-result_code)}"
    else:
        how = f"exit {result_code}"
    lines = [line for line in output.splitlines() if line.strip()][-REASON_LINES:]
    said = redact_value(bounded("\n".join(lines)))
    return f"{how}: {said}" if said else how


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def disk_targets(health: Health, logs_dir: str) -> dict[str, int]:
    """{folder: bytes it needs free}: logs.dir and each path, those with a need above 0 (the larger need wins)."""
    out: dict[str, int] = {}
    wanted = [(logs_dir, health.min_free)]
    wanted += [(p.path, health.min_free if p.min_free is None else p.min_free) for p in health.paths]
    for path, need in wanted:
        if need > 0:
            out[path] = max(need, out.get(path, 0))
    return out


async def check(
    health: Health,
    *,
    logs_dir: str,
    cwd: str,
    environ: Mapping[str, str],
    helper_environ: Mapping[str, str],
    timeout: float | None = None,
    meminfo: Path = MEMINFO,
    nvidia_smi: str | None = None,
    guard: ProcessGuard | None = None,
) -> HealthReport:
    """One try of every check `health` asks for, within `timeout` seconds (None: health.timeout).

    `environ` is the workers' environment (its CUDA_VISIBLE_DEVICES picks the GPUs); commands and nvidia-smi run in
    `helper_environ`, in `cwd`; `logs_dir` is logs.dir made absolute.
    """
    limit = health.timeout if timeout is None else timeout
    started, at = time.monotonic(), time.time()
    jobs: dict[str, Coroutine[object, object, list[HealthFailure]]] = {}
    pending_reason: dict[str, HealthFailure] = {}
    for path, need in disk_targets(health, logs_dir).items():
        name = f"disk {path}"
        jobs[name] = check_space(path, need)
        pending_reason[name] = HealthFailure("disk", f"no answer in {format_duration(limit)} (a hung file system?)",
                                             path)
    if health.gpus > 0:
        jobs["gpus"] = check_gpus(health.gpus, environ=environ, helper_environ=helper_environ, nvidia_smi=nvidia_smi,
                                  timeout=min(NVIDIA_SMI_TIMEOUT_S, limit), guard=guard)
        pending_reason["gpus"] = HealthFailure("gpus", f"nvidia-smi did not finish in {format_duration(limit)}")
    progress: list[HealthCommand] = []  # the command running (last), after those that ran
    if health.commands:
        jobs["commands"] = _commands(health.commands, progress, cwd=cwd, env=helper_environ, guard=guard)
    checked = [*jobs]
    failures: list[HealthFailure] = []
    if health.min_free_memory > 0:
        checked.append("memory")
        failures += check_memory(health.min_free_memory, meminfo)
    tasks = {asyncio.ensure_future(job): name for name, job in jobs.items()}
    try:
        _, late = await asyncio.wait(tasks, timeout=limit) if tasks else (set(), set())
    finally:  # a cancelled try still kills what it started
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
    for task, name in tasks.items():
        if task in late:
            failures += _unfinished(name, pending_reason, progress, health.commands, limit)
        elif task.exception() is not None:
            error = task.exception()
            failures.append(HealthFailure(name.split()[0], f"the check failed: {error!r}"))
        else:
            failures += task.result()
    return HealthReport(tuple(checked), tuple(failures), time.monotonic() - started, at)


def _unfinished(name: str, reasons: dict[str, HealthFailure], progress: list[HealthCommand],
                commands: tuple[HealthCommand, ...], limit: float) -> list[HealthFailure]:
    """The failures of a check the try's time limit cut short."""
    if name != "commands":
        return [reasons[name]]
    out = []
    if progress:
        out.append(HealthFailure("command", f"did not finish in health.timeout ({format_duration(limit)}); killed",
                                 shown_command(progress[-1].run)))
    out += [HealthFailure("command", "not run: health.timeout was up", shown_command(c.run))
            for c in commands[len(progress):]]
    return out


async def _commands(commands: tuple[HealthCommand, ...], progress: list[HealthCommand], *, cwd: str,
                    env: Mapping[str, str], guard: ProcessGuard | None) -> list[HealthFailure]:
    """Run each command in turn; a failure per command that did not exit 0."""
    failures = []
    for command in commands:
        progress.append(command)
        result = await run_command([SHELL, "-c", command.run], timeout=command.timeout, env=env, cwd=cwd,
                                   guard=guard)
        if result.exit_code != 0:
            reason = command_reason(result.exit_code, result.output(), timed_out=result.timed_out,
                                    timeout=command.timeout, error=result.error)
            failures.append(HealthFailure("command", reason, shown_command(command.run)))
    return failures


def helper_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What a check command and nvidia-smi get: runner.system.environ.helper_env, with a PATH in any case."""
    return {"PATH": os.defpath, **helper_env(environ)}


def check_spec(
    spec: JobSpec,
    *,
    environ: Mapping[str, str] | None = None,
    timeout: float | None = None,
    guard: ProcessGuard | None = None,
) -> Coroutine[object, object, HealthReport]:
    """`check` for a loaded spec on this node: logs.dir against this directory, the workers' env = agent's + env."""
    agent_env = os.environ if environ is None else environ
    return check(
        spec.health,
        logs_dir=os.path.abspath(spec.logs.dir),
        cwd=spec.cwd,
        environ={**agent_env, **dict(spec.env)},
        helper_environ=helper_environment(agent_env),
        timeout=timeout,
        guard=guard,
    )


async def until_healthy(
    health: Health,
    try_once: Callable[[float], Awaitable[HealthReport]],
    *,
    log: structlog.typing.FilteringBoundLogger,
    on_failed: Callable[[HealthReport], Awaitable[None]] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> HealthReport:
    """Try (`try_once(time limit)`) until the checks pass; the passing report, or Unhealthy after give_up_after.

    The first try has health.timeout; later ones at most what is left before give_up_after (None: never give up).
    Each failed try is logged as `health_failed` and given to `on_failed` before the wait.
    """
    start = clock()
    deadline = None if health.give_up_after is None else start + health.give_up_after
    tries = 0
    while True:
        left = None if deadline is None or tries == 0 else deadline - clock()
        report = await try_once(health.timeout if left is None else max(0.0, min(health.timeout, left)))
        tries += 1
        if report.healthy:
            if tries > 1:
                log.info("health_passed", tries=tries, waited_s=round(clock() - start, 1), checked=list(report.checked))
            else:
                log.info("health_ok", checked=list(report.checked), duration_s=round(report.duration_s, 3))
            return report
        now = clock()
        wait = health.retry_interval if deadline is None else min(health.retry_interval, max(0.0, deadline - now))
        giving_up = deadline is not None and now + wait >= deadline
        log.warning("health_failed", reasons=report.reasons(), tries=tries, checked=list(report.checked),
                    duration_s=round(report.duration_s, 3), **({"giving_up_in_s": round(wait, 1)} if giving_up
                                                              else {"retry_in_s": round(wait, 1)}))
        if on_failed is not None:
            await on_failed(report)
        await sleep(wait)
        if giving_up:
            raise Unhealthy(report, tries, clock() - start)
