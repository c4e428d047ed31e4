"""What the state handlers share while one agent runs one job on one node.

Three kinds of thing, kept apart:
- `JobInputs`: what the run is given and never changes (the spec, this node, its run dir, the agent's identity);
- `GroupRun`: one group of workers' run: its attempts, workers, standbys, failures and restart charge. The job has
  one today; replica groups will each own one, so a group's failure and restart touch only its own `GroupRun`;
- narrow services behind Protocols, which handlers call and tests replace with plain fakes: a `WorkerLauncher`
  (plans become running workers), a `StatusPublisher` (status.json and the rendezvous) and a `RecoveryClock`
  (time to recover). Their implementations live in runner/agent/.

`Context` holds one of each and the agent-wide lifecycle (the event queue, a stop request, the outcome). The
machine's current state is not here: the machine (runner/core/machine.py `Model`) is its only owner.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from runner.events import Event, StopRequested, TimerExpired, WorkerExited
from runner.outcomes import FailureKind
from runner.rendezvous.ports import free_port
from runner.system.shepherd import Shepherd
from runner.system.soft_io import WarnOnce
from runner.system.stop_scope import StopScope
from runner.workers.launch_plan import LaunchPlan, build_plan

if TYPE_CHECKING:
    import structlog

    from runner.config.spec import JobSpec
    from runner.core.group_state import GroupState
    from runner.diagnosis.failure import Failure
    from runner.outcomes import Outcome
    from runner.rendezvous.base import Rendezvous, RendezvousResult, RoundCharge
    from runner.watchdog.flight import FlightRecorder
    from runner.watchdog.service import Watchdog
    from runner.watchdog.stall import StallWatch
    from runner.workers.group import Worker, WorkerGroup
    from runner.workers.standby import StandbyPool


@dataclass(frozen=True)
class Replica:
    """A replica group's place in the job (docs/replica_groups.md): what its workers get on top of the contract."""

    group: int  # REPLICA_GROUP_ID
    count: int  # NUM_REPLICA_GROUPS
    lighthouse: str  # TORCHFT_LIGHTHOUSE: http://host:port

    def env(self, manager_port: int) -> dict[str, str]:
        """The variables torchft reads, for one attempt (the manager's port is fresh every attempt)."""
        return {
            "TORCHFT_LIGHTHOUSE": self.lighthouse,
            "REPLICA_GROUP_ID": str(self.group),
            "NUM_REPLICA_GROUPS": str(self.count),
            "TORCHFT_MANAGER_PORT": str(manager_port),
        }


@dataclass(frozen=True)
class JobInputs:
    """What one run (of the job, or of one replica group) is given; nothing changes it while the agent runs."""

    spec: JobSpec  # a replica group's: nproc_per_node is the group's
    node: str
    run_dir: Path
    started: float  # the agent's start, on the monotonic clock
    identity: Mapping[str, object] = field(default_factory=dict)  # agent pid and start time (`runner stop`)
    replica: Replica | None = None  # set for each replica group; its job-level supervisor owns the signals


@dataclass(frozen=True)
class Charge:
    """What charging a restart to the budgets gave: the round's charge (None: not reached), or why it failed."""

    round: RoundCharge | None  # as the round's first charging node decided it: its count, class, charged or not
    error: str = ""  # the budgets could not be reached (etcd down past its connect timeout)

    @property
    def used(self) -> int | None:
        """The job's restarts after this charge (None: refused, or the budgets not reached)."""
        return self.round.count if self.round is not None else None


@dataclass
class GroupRun:
    """One group of workers' run: attempts, the current workers and standbys, failures, restarts charged."""

    attempt: int = 0
    restarts: int = 0  # restarts charged to the budget so far
    uncharged: dict[str, int] = field(default_factory=dict)  # attempts restart.max_restarts did not pay, by cause
    result: RendezvousResult | None = None
    plan: LaunchPlan | None = None
    group: WorkerGroup | None = None
    standbys: StandbyPool | None = None  # pre-warmed standby workers (restart.standby)
    failure: Failure | None = None  # the current attempt's root cause
    failures: list[Failure] = field(default_factory=list)
    charge: Charge | None = None  # this failure's restart charge, once the policy needed it
    health: list[dict[str, object]] = field(default_factory=list)  # failed tries of the health checks (the last 20)
    unhealthy: dict[str, object] | None = None  # the last try, while the node stays out of a round for its health
    output_lost: dict[int, int] = field(default_factory=dict)  # by rank: worker output the logs disk refused
    kept_out: str = ""  # why this node sits out the next round: it held up the last hang (docs/hangs.md)

    @property
    def leaves_alone(self) -> bool:
        """This node stepped out on its own (kept out, or its health checks gave up): the others go on."""
        return self.failure is not None and self.failure.kind is FailureKind.HEALTH

    def keep_lost_output(self) -> None:
        """Keep what the current group's log files refused in the run's count (before the group is dropped)."""
        self.output_lost = self.lost_output()
        if self.group is not None:
            self.group.lost_bytes.clear()

    def lost_output(self) -> dict[int, int]:
        """By rank, the worker output the log files refused in this run: earlier groups' and the current one's."""
        total = dict(self.output_lost)
        for rank, size in (self.group.lost_bytes.items() if self.group is not None else ()):
            total[rank] = total.get(rank, 0) + size
        return total

    def is_stale(self, event: Event) -> bool:
        """True for a worker exit or timer expiry of a process that is not one of the current workers."""
        if not isinstance(event, (WorkerExited, TimerExpired)):
            return False
        worker = self.group.workers.get(event.local_rank) if self.group is not None else None
        return worker is None or worker.pid != event.pid


class WorkerLauncher(Protocol):
    """Turns an attempt's plan into running workers."""

    def launch(self, plan: LaunchPlan, standbys: StandbyPool | None) -> WorkerGroup:
        """Spawn every worker of `plan` (in a standby where one is ready) and return their group."""
        ...


class StatusPublisher(Protocol):
    """Publishes this node's status (status.json, the rendezvous); a failure there is a warning, never an error."""

    async def publish(self, *, only_in: GroupState | None = None) -> None:
        """Publish now (in order); with `only_in`, only if the machine is still in that state when its turn comes."""
        ...

    def publish_soon(self, *, only_in: GroupState) -> None:
        """Publish from a callback (a task of its own, kept until done)."""
        ...

    async def refresh_loop(self) -> None:
        """Republish the live totals (wall time, ETTR) every few seconds until cancelled; never in SHUTDOWN."""
        ...


class RecoveryClock(Protocol):
    """Times the launch and every recovery: failure -> workers running -> workers ready (observe/recovery.py)."""

    def event_seen(self) -> None:
        """RUNNING took an event off the queue: if it ends the attempt, the agent learnt of it now."""
        ...

    def attempt_failed(self, trigger: str, failure: Failure | None) -> None:
        """The attempt ended in a failure (or a membership change): a recovery starts, if one follows."""
        ...

    def failure_classed(self, failure: Failure) -> None:
        """FAILED classed the failure on its evidence."""
        ...

    def workers_spawned(self, attempt: int, workers: Sequence[Worker], *, scope: str = "job") -> None:
        """Every worker of `attempt` in `workers` is spawned; watch each until it says it is ready."""
        ...

    def state_changed(self, src: GroupState, dst: GroupState) -> None:
        """A transition: the ETTR ledger marks the teardown's end and the round's (observe/ledger.py)."""
        ...

    def figures(self) -> dict[str, object]:
        """The ETTR ledger so far (report.json's `ledger` as of now), from any thread: the metrics' gauges."""
        ...

    def status(self) -> dict[str, object]:
        """The launch and the last recovery, for status.json."""
        ...

    def report(self) -> dict[str, object]:
        """Every recovery, for report.json."""
        ...

    def line(self) -> str:
        """The summary's line on recoveries ("" when there was none)."""
        ...


@dataclass
class Context:
    """What the handlers share: the inputs, the group's run, the services, and the agent's lifecycle."""

    inputs: JobInputs
    rendezvous: Rendezvous
    log: structlog.typing.FilteringBoundLogger
    launcher: WorkerLauncher
    status: StatusPublisher
    recovery: RecoveryClock
    warnings: WarnOnce  # side failures that never change the job's result, logged once per kind (the run's scope)
    run: GroupRun = field(default_factory=GroupRun)
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    shepherd: Shepherd = field(default_factory=Shepherd)
    stop: StopRequested | None = None
    hurry: asyncio.Event = field(default_factory=asyncio.Event)  # a second stop signal: kill now
    outcome: Outcome | None = None  # set once a step settles it (None while the job goes on)
    exit_code: int = 0
    timer: Watchdog | None = None  # the file-timer server and heartbeat monitor, when the watchdog is on
    recorder: FlightRecorder | None = None  # every rank's flight recorder, read on a hang (docs/hangs.md)
    stall: StallWatch | None = None  # no rank of this node makes progress: a hang (watchdog.stall_timeout)
    deadline_armed: bool = False
    report_path: Path | None = None  # where report.json went (the run dir, or a fallback when it could not)
    # a replica group's, on several nodes: waits (bounded) until the lighthouse its inputs name answers, or another
    # is published, before the attempt's plan (runner/agent/placement.py: its host may have been lost)
    before_plan: Callable[[], Awaitable[None]] | None = None
    stops: StopScope = field(init=False)  # the stop requests this run received (runner/system/stop_scope.py)
    outer_stops: InitVar[StopScope | None] = None  # a replica group's: the job's scope, which holds this one

    def __post_init__(self, outer_stops: StopScope | None) -> None:
        """This run's stop scope: its own, or one inside the job's (a replica group's)."""
        self.stops = outer_stops.inside(self.events) if outer_stops is not None else StopScope(self.events)

    @property
    def spec(self) -> JobSpec:
        """The job's spec (the inputs' own, for the many handlers that read it)."""
        return self.inputs.spec

    def rank_env(self, nproc: int) -> dict[int, dict[str, str]]:
        """Per local rank: the watchdog's timer FIFO and the flight recorder's socket, for those that are on."""
        env: dict[int, dict[str, str]] = {r: {} for r in range(nproc)}
        for part in (self.timer.worker_env(range(nproc)) if self.timer is not None else {},
                     self.recorder.worker_env(range(nproc)) if self.recorder is not None else {}):
            for r, values in part.items():
                env[r].update(values)
        return env

    def make_plan(self) -> LaunchPlan:
        """Plan this node's workers for the current attempt from the last rendezvous result."""
        run, replica = self.run, self.inputs.replica
        assert run.result is not None  # only called after a completed round
        return build_plan(
            self.spec,
            run.result,
            attempt=run.attempt,
            run_dir=str(self.inputs.run_dir),
            base_env=os.environ,
            extra_env=replica.env(free_port("127.0.0.1")) if replica is not None else None,
            rank_env=self.rank_env(run.result.nproc_per_node),
        )
