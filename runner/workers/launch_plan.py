"""LaunchPlan: every worker's argv, environment and log paths for one attempt. Pure: no I/O.

The agent's own secrets (the etcd password's variable, `rendezvous.auth.password_env`) are removed from every
worker's environment here, and `helper_env` gives helper processes (the shepherd, py-spy) an environment that
holds no secret at all.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass

from runner.config.spec import JobSpec
from runner.rendezvous.base import RendezvousResult
from runner.watchdog.heartbeat import ENV_VAR as HEARTBEAT_ENV


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

    @property
    def stdout_path(self) -> str:
        """Where the worker's stdout is kept."""
        return f"{self.log_dir}/stdout.log"

    @property
    def stderr_path(self) -> str:
        """Where the worker's stderr is kept."""
        return f"{self.log_dir}/stderr.log"

    @property
    def error_file(self) -> str:
        """TORCHELASTIC_ERROR_FILE: torch's @record writes the exception here."""
        return error_file(self.log_dir)

    @property
    def heartbeat_file(self) -> str:
        """RUNNER_HEARTBEAT_FILE: the worker touches it to show it is alive (watchdog.heartbeat_timeout)."""
        return heartbeat_file(self.log_dir)


def error_file(log_dir: str) -> str:
    """Where a rank's torch error file goes."""
    return f"{log_dir}/error.json"


def heartbeat_file(log_dir: str) -> str:
    """Where a rank's heartbeat file goes."""
    return f"{log_dir}/heartbeat"


@dataclass(frozen=True)
class LaunchPlan:
    """All workers of this node for one attempt."""

    attempt: int
    run_id: str
    node: str
    workers: tuple[WorkerPlan, ...]


# Inherited variables a helper process keeps (locale and search path only: a helper needs nothing else).
HELPER_ENV_KEEP = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TZ", "TMPDIR")


def agent_secret_vars(spec: JobSpec) -> frozenset[str]:
    """Environment variables the spec names as the agent's own secret sources (never given to a worker)."""
    return frozenset(name for name in (spec.rendezvous.auth.password_env,) if name)


def without_agent_secrets(spec: JobSpec, environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without the variables of `agent_secret_vars`."""
    drop = agent_secret_vars(spec)
    return {k: v for k, v in environ.items() if k not in drop}


def helper_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment for a helper process the agent starts (shepherd, py-spy): HELPER_ENV_KEEP only.

    Helpers need no credential, so none is passed: not the etcd password, not a token the workers inherit.
    """
    return {k: environ[k] for k in HELPER_ENV_KEEP if k in environ}


def worker_argv(spec: JobSpec) -> tuple[str, ...]:
    """The command every worker runs (the same on every rank)."""
    ep = spec.entrypoint
    python = ep.python or sys.executable
    if ep.script is not None:
        return (python, "-u", ep.script, *ep.args)
    if ep.module is not None:
        return (python, "-u", "-m", ep.module, *ep.args)
    return (*(ep.command or ()), *ep.args)


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
        "ROLE_NAME": "default",
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(rdzv.world_size),
        "MASTER_ADDR": rdzv.master_addr,
        "MASTER_PORT": str(rdzv.master_port),
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(spec.restart.max_restarts),
        # The agent never imports torch, so it hosts no store: rank 0 hosts the TCPStore on MASTER_PORT.
        "TORCHELASTIC_USE_AGENT_STORE": "False",
    }


def build_plan(
    spec: JobSpec,
    rdzv: RendezvousResult,
    *,
    attempt: int,
    restart_count: int,
    run_id: str,
    run_dir: str,
    base_env: Mapping[str, str],
    extra_env: Mapping[str, str] | None = None,
    rank_env: Mapping[int, Mapping[str, str]] | None = None,
) -> LaunchPlan:
    """Plan every worker of this node for `attempt`. `extra_env` adds agent variables; `rank_env` per local rank.

    Each worker gets `base_env` (as torchrun: the agent's environment), then the defaults, then `spec.env`, then
    the contract; the agent's secret sources (`agent_secret_vars`) are removed from the result wherever they came
    from, so the etcd password reaches no worker even if `spec.env` names its variable.
    """
    argv = worker_argv(spec)
    withheld = agent_secret_vars(spec)
    workers = []
    for local_rank in range(rdzv.nproc_per_node):
        rank = rdzv.global_rank(local_rank)
        log_dir = f"{run_dir}/attempt_{attempt}/rank_{rank}"
        contract = contract_env(spec, rdzv, local_rank, run_id, restart_count)
        contract["TORCHELASTIC_ERROR_FILE"] = error_file(log_dir)
        if spec.watchdog.enabled and spec.watchdog.heartbeat_timeout:
            contract[HEARTBEAT_ENV] = heartbeat_file(log_dir)
        contract.update(extra_env or {})
        contract.update((rank_env or {}).get(local_rank, {}))  # e.g. the rank's own TORCHELASTIC_TIMER_FILE
        env = dict(base_env)
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        env.update(dict(spec.env))
        env.update(contract)
        for name in withheld:
            env.pop(name, None)
        workers.append(
            WorkerPlan(
                local_rank=local_rank,
                rank=rank,
                argv=argv,
                env=tuple(sorted(env.items())),
                contract=tuple(sorted(contract.items())),
                cwd=spec.cwd,
                log_dir=log_dir,
            )
        )
    return LaunchPlan(attempt=attempt, run_id=run_id, node=rdzv.node, workers=tuple(workers))
