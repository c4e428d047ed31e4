"""How a run ends and why an attempt failed: enums inside the agent, strings only where JSON is written."""

from __future__ import annotations

import enum


class Outcome(enum.Enum):
    """The job's result on this node, as report.json, status and the summary say it."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"  # the workers failed and the restart policy gave up
    STOPPED = "stopped"  # a signal or `runner stop`, or the job was closed before this node joined
    ERROR = "error"  # setup or infrastructure: the workers never ran, or could not go on

    def __str__(self) -> str:
        return self.value


class FailureKind(enum.Enum):
    """What failed in an attempt; the restart policy and the report read it."""

    WORKER = "worker"  # a worker exited non-zero or was killed by a signal
    WATCHDOG = "watchdog"  # a file timer or the heartbeat expired
    PEER = "peer"  # another node left or failed
    RENDEZVOUS = "rendezvous"  # the rendezvous timed out or failed (infrastructure)
    DEADLINE = "deadline"  # watchdog.max_run_time passed
    GUARD = "guard"  # the shepherd died and could not be replaced: no-orphan guarantee lost
    HEALTH = "health"  # this node failed its health checks for health.give_up_after (runner/health/)
    FENCED = "fenced"  # this node was cut off from etcd and its peers: it stopped its workers and left

    def __str__(self) -> str:
        return self.value

    @property
    def infrastructure(self) -> bool:
        """Not the workers' fault: never retried by the restart policy, exit code 3."""
        return self in (FailureKind.RENDEZVOUS, FailureKind.GUARD, FailureKind.HEALTH, FailureKind.FENCED)

    @property
    def one_worker(self) -> bool:
        """Confined to one worker, so `restart.scope: worker` can replace just that one."""
        return self is FailureKind.WORKER or self is FailureKind.WATCHDOG


class FailureClass(enum.Enum):
    """Why an attempt failed, as the restart budgets count it (docs/failure_classes.md: the evidence of each)."""

    EXCEPTION = "exception"  # a worker exited non-zero (a Python error: traceback from torch's error file or stderr)
    OOM = "oom"  # the kernel's OOM killer killed a worker (its cgroup's oom_kill count rose, or the kernel log says so)
    SIGNAL = "signal"  # a worker was killed by a signal, with no evidence of the OOM killer
    HANG = "hang"  # the watchdog: a file timer, the heartbeat or (not retried) max_run_time
    NODE_LOST = "node_lost"  # another node left the attempt: its agent vanished, its lease expired, or it failed
    PREEMPTED = "preempted"  # the scheduler's stop signal (SIGTERM) reached a worker or a peer's agent
    INFRA = "infra"  # the rendezvous, etcd or the guard failed: not the workers' fault

    def __str__(self) -> str:
        return self.value
