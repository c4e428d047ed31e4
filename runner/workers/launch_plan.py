"""LaunchPlan: every worker's argv, environment and log paths for one attempt. Pure: no I/O.

Workers get what torchrun gives its workers (docs/torchrun.md): the agent's environment, OMP_NUM_THREADS=1 when more
than one runs per node and none is set, the contract variables, and arguments where `$local_rank`/`${local_rank}` is
replaced as torchrun's `macros.substitute` does (Python string.Template: `$$` is a literal `$`).

The agent's own secrets (the etcd password's variable, `rendezvous.auth.password_env`) are removed from every
worker's environment here, and `helper_env` gives helper processes (the shepherd, py-spy) an environment that
holds no secret at all.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from string import Template

from runner.config.spec import JobSpec
from runner.contract import FR_BUFFER_VARS
from runner.contract import HEARTBEAT_FILE_VAR as HEARTBEAT_ENV
from runner.errors import RunnerError
from runner.rendezvous.base import RendezvousResult
from runner.rundir.layout import error_file, heartbeat_file, rank_dir, stderr_log, stdout_log


@dataclass(frozen=True)
class WorkerPlan:
    """One worker process of one attempt."""

    local_rank: int
    rank: int
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # the full environment the worker gets
    contract: tuple[tuple[str, str], ...]  # the torchrun-contract part of env (what `runner plan` shows)
    cwd: str
    log_dir: str  # <run dir>/attempt_<k>/rank_<r>
    # Copy this stream to the console too (torchrun's --redirects/--tee/--local-ranks-filter, via logs.tee,
    # logs.console_streams and logs.console_local_ranks); the log files always get both streams.
    stdout_to_console: bool = True
    stderr_to_console: bool = True

    @property
    def stdout_path(self) -> str:
        """Where the worker's stdout is kept."""
        return stdout_log(self.log_dir)

    @property
    def stderr_path(self) -> str:
        """Where the worker's stderr is kept."""
        return stderr_log(self.log_dir)

    @property
    def error_file(self) -> str:
        """TORCHELASTIC_ERROR_FILE: torch's @record writes the exception here."""
        return error_file(self.log_dir)

    @property
    def heartbeat_file(self) -> str:
        """RUNNER_HEARTBEAT_FILE: the worker touches it to say it is ready and, with heartbeat_timeout, alive."""
        return heartbeat_file(self.log_dir)


@dataclass(frozen=True)
class LaunchPlan:
    """All workers of this node for one attempt."""

    attempt: int
    run_id: str
    node: str
    workers: tuple[WorkerPlan, ...]


def agent_secret_vars(spec: JobSpec) -> frozenset[str]:
    """Environment variables the spec names as the agent's own secret sources (never given to a worker).

    RUNNER_SECRET_FILE (a hosted rendezvous's secret, docs/security.md) is always one of them.
    """
    return frozenset(name for name in (spec.rendezvous.auth.password_env, "RUNNER_SECRET_FILE") if name)


def without_agent_secrets(spec: JobSpec, environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without the variables of `agent_secret_vars`."""
    drop = agent_secret_vars(spec)
    return {k: v for k, v in environ.items() if k not in drop}


class VirtualLocalRankError(RunnerError):
    """virtual_local_rank with fewer CUDA_VISIBLE_DEVICES entries than workers on this node."""


def substitute_local_rank(args: Sequence[str], local_rank: int) -> tuple[str, ...]:
    """Apply torchrun's `macros.substitute`: string.Template.safe_substitute(local_rank=N) on every argument."""
    return tuple(Template(arg).safe_substitute(local_rank=str(local_rank)) for arg in args)


def worker_argv(spec: JobSpec, local_rank: int | None = None, python_exec: str | None = None) -> tuple[str, ...]:
    """The command a worker runs; with `local_rank`, its arguments substituted as torchrun does.

    As with torchrun, everything after the program goes through the substitution (for a script or module, the
    script path or module name too). `python_exec` is torchrun's PYTHON_EXEC; `entrypoint.python` wins over it.
    """
    ep = spec.entrypoint
    python = ep.python or python_exec or sys.executable
    if ep.script is not None:
        program, rest = python, ("-u", ep.script, *ep.args)
    elif ep.module is not None:
        program, rest = python, ("-u", "-m", ep.module, *ep.args)
    else:
        command = ep.command or ()
        program, rest = command[0], (*command[1:], *ep.args)
    if local_rank is not None:
        rest = substitute_local_rank(rest, local_rank)
    return (program, *rest)


def elastic_run_id(spec: JobSpec, run_dir: str) -> str:
    """TORCHELASTIC_RUN_ID of a run of `spec`.

    On a multi-node backend every node must agree on it: the job name. With the local backend it is unique per
    run (`<job name>-<run dir name>`), as torchrun --standalone's uuid is.
    """
    if spec.rendezvous.backend != "local":
        return spec.name
    return f"{spec.name}-{PurePath(run_dir).name}"


def virtual_device(base_env: Mapping[str, str], local_rank: int) -> str:
    """CUDA_VISIBLE_DEVICES for `local_rank` under virtual_local_rank: its entry of the agent's list, else itself."""
    parent = base_env.get("CUDA_VISIBLE_DEVICES")
    if parent is None:
        return str(local_rank)
    devices = parent.split(",")
    if local_rank >= len(devices):
        raise VirtualLocalRankError(
            f"virtual_local_rank: local rank {local_rank} has no GPU in CUDA_VISIBLE_DEVICES={parent}",
            "list one device per worker in CUDA_VISIBLE_DEVICES, or lower nproc_per_node",
        )
    return devices[local_rank].strip()


def contract_env(
    spec: JobSpec, rdzv: RendezvousResult, local_rank: int, run_id: str, restart_count: int
) -> dict[str, str]:
    """The torchrun environment contract for one worker (so torch scripts run unchanged)."""
    rank = rdzv.global_rank(local_rank)
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(rdzv.world_size),
        "LOCAL_WORLD_SIZE": str(rdzv.nproc_per_node),
        "GROUP_RANK": str(rdzv.group_rank),
        "GROUP_WORLD_SIZE": str(rdzv.group_world_size),
        "ROLE_NAME": spec.role,
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(rdzv.world_size),
        "MASTER_ADDR": rdzv.master_addr,
        "MASTER_PORT": str(spec.rendezvous.master_port or rdzv.master_port),
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(spec.restart.max_restarts),
        # The agent never imports torch, so it hosts no store: rank 0 hosts the TCPStore on MASTER_PORT.
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        # torchrun puts this in its own environment, which its workers inherit.
        "TORCHELASTIC_SIGNALS_TO_HANDLE": ",".join(spec.shutdown.signals_to_handle),
    }


def attempt_free_env(spec: JobSpec, base_env: Mapping[str, str], nproc_per_node: int) -> dict[str, str]:
    """A worker's environment before its contract: what every attempt shares (and a standby starts with).

    `base_env` (as torchrun: the agent's environment), then the defaults, then `spec.env`, then the flight
    recorder's size (watchdog.flight_recorder, unless either of torch's variables for it is set); without the
    agent's secret sources.
    """
    env = dict(base_env)
    if nproc_per_node > 1:  # as torchrun: only when workers share the node, and never over the user's
        env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    env.update(dict(spec.env))
    if spec.watchdog.flight_recorder and not any(name in env for name in FR_BUFFER_VARS):  # a value of yours wins
        env["TORCH_FR_BUFFER_SIZE"] = str(spec.watchdog.flight_recorder)
    for name in agent_secret_vars(spec):
        env.pop(name, None)
    return env


def build_plan(
    spec: JobSpec,
    rdzv: RendezvousResult,
    *,
    attempt: int,
    run_dir: str,
    base_env: Mapping[str, str],
    extra_env: Mapping[str, str] | None = None,
    rank_env: Mapping[int, Mapping[str, str]] | None = None,
) -> LaunchPlan:
    """Plan every worker of this node for `attempt`. `extra_env` adds agent variables; `rank_env` per local rank.

    Each worker gets `base_env` (as torchrun: the agent's environment), then the defaults, then `spec.env`, then
    the contract; the agent's secret sources (`agent_secret_vars`) are removed from the result wherever they came
    from, so the etcd password reaches no worker even if `spec.env` names its variable. TORCHELASTIC_RUN_ID is
    `elastic_run_id`; TORCHELASTIC_RESTART_COUNT is `attempt` (0, 1, ...).
    """
    withheld = agent_secret_vars(spec)
    elastic_id = elastic_run_id(spec, run_dir)
    workers = []
    for local_rank in range(rdzv.nproc_per_node):
        rank = rdzv.global_rank(local_rank)
        log_dir = rank_dir(run_dir, attempt, rank)
        contract = contract_env(spec, rdzv, local_rank, elastic_id, attempt)
        if spec.virtual_local_rank:
            contract["LOCAL_RANK"] = "0"
            contract["CUDA_VISIBLE_DEVICES"] = virtual_device(base_env, local_rank)
        contract["TORCHELASTIC_ERROR_FILE"] = error_file(log_dir)
        contract[HEARTBEAT_ENV] = heartbeat_file(log_dir)  # watched with heartbeat_timeout; always "ready"
        contract.update(extra_env or {})
        contract.update((rank_env or {}).get(local_rank, {}))  # e.g. the rank's own TORCHELASTIC_TIMER_FILE
        env = attempt_free_env(spec, base_env, rdzv.nproc_per_node)
        env.update(contract)
        for name in withheld:
            env.pop(name, None)
        to_stdout, to_stderr = spec.logs.to_console(local_rank)
        workers.append(
            WorkerPlan(
                local_rank=local_rank,
                rank=rank,
                argv=worker_argv(spec, local_rank, base_env.get("PYTHON_EXEC")),
                env=tuple(sorted(env.items())),
                contract=tuple(sorted(contract.items())),
                cwd=spec.cwd,
                log_dir=log_dir,
                stdout_to_console=to_stdout,
                stderr_to_console=to_stderr,
            )
        )
    return LaunchPlan(attempt=attempt, run_id=elastic_id, node=rdzv.node, workers=tuple(workers))
