"""The resolved job spec: frozen dataclasses, built only by `runner.config.loader`.

Every field has the default that schemas/job.schema.json documents; durations are seconds (float).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from runner.outcomes import FailureClass

Scope = Literal["group", "worker"]
LogFormat = Literal["auto", "console", "json"]


@dataclass(frozen=True)
class Entrypoint:
    """What each worker runs: exactly one of script, module, command."""

    script: str | None = None  # python script, relative to cwd
    module: str | None = None  # python -m module
    command: tuple[str, ...] | None = None  # argv run as is (no interpreter added)
    args: tuple[str, ...] = ()
    python: str | None = None  # interpreter for script/module; None = the runner's own

    @property
    def kind(self) -> str:
        """'script', 'module' or 'command'."""
        if self.script is not None:
            return "script"
        if self.module is not None:
            return "module"
        return "command"


@dataclass(frozen=True)
class Nodes:
    """How many nodes (machines) the job spans; min == max for a fixed-size job."""

    min: int = 1
    max: int = 1


@dataclass(frozen=True)
class TLS:
    """TLS to etcd: CA bundle, optional client certificate and key (paths)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None


@dataclass(frozen=True)
class Auth:
    """etcd user/password auth; the password comes from an env var or a file, never the spec itself."""

    user: str | None = None
    password_env: str | None = None
    password_file: str | None = None


@dataclass(frozen=True)
class Rendezvous:
    """How nodes find each other: `local` (embedded, one node) or `etcd` (v3 API, external or hosted by a node)."""

    backend: Literal["local", "etcd"] = "local"
    endpoints: tuple[str, ...] = ("127.0.0.1:2379",)
    hosted: bool = False  # one node (the one at endpoints[0]) starts the etcd itself: the etcd extra
    hosted_members: int = 3  # hosted: the etcd grows to this many members on the first nodes (1, 3 or 5)
    prefix: str = "/runner"
    join_timeout: float = 600.0
    last_call: float = 30.0  # after min nodes joined, wait this long for more (up to max)
    lease_ttl: float = 10.0
    connect_timeout: float = 30.0
    status_interval: float | None = 5.0  # etcd: the live status republished this often (None: on changes only)
    master_addr: str | None = None  # address other nodes use to reach this one; None = detected
    master_port: int | None = None  # fixed MASTER_PORT (torchrun's --master-port); None = a free port each attempt
    tls: TLS = field(default_factory=TLS)
    auth: Auth = field(default_factory=Auth)
    secret_file: str | None = None  # hosted: the job's secret (TLS + auth of the hosted etcd); docs/security.md


@dataclass(frozen=True)
class Backoff:
    """Delay before restart k (k = 1, 2, ...).

    The first restart is immediate (a one-off crash recovers at once); restart k >= 2 waits
    min(max, initial * multiplier**(k-2)), scaled by a random factor in [1 - jitter, 1 + jitter].
    """

    initial: float = 1.0
    max: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.1


@dataclass(frozen=True)
class ClassBudget:
    """Restarts one failure class may use (docs/failure_classes.md).

    `max`: at most this many failures of the class are restarted, job-wide (None: no limit of its own).
    `charged`: its restarts also count against restart.max_restarts.
    """

    max: int | None = None
    charged: bool = True


@dataclass(frozen=True)
class Budgets:
    """restart.budgets: one ClassBudget per failure class (runner.outcomes.FailureClass), on top of max_restarts.

    Defaults: an OOM kill or an infrastructure failure is not restarted (the same memory, the same etcd would fail
    again); a lost or preempted node is restarted without spending max_restarts (the job did nothing wrong).
    """

    exception: ClassBudget = field(default_factory=ClassBudget)
    oom: ClassBudget = field(default_factory=lambda: ClassBudget(max=0))
    signal: ClassBudget = field(default_factory=ClassBudget)
    hang: ClassBudget = field(default_factory=ClassBudget)
    node_lost: ClassBudget = field(default_factory=lambda: ClassBudget(charged=False))
    preempted: ClassBudget = field(default_factory=lambda: ClassBudget(charged=False))
    infra: ClassBudget = field(default_factory=lambda: ClassBudget(max=0))

    def of(self, failure_class: FailureClass) -> ClassBudget:
        """The budget of `failure_class`."""
        budget: ClassBudget = getattr(self, failure_class.value)
        return budget


@dataclass(frozen=True)
class Restart:
    """Restart policy after a worker failure."""

    max_restarts: int = 3
    backoff: Backoff = field(default_factory=Backoff)
    non_retryable_exit_codes: tuple[int, ...] = ()
    scope: Scope = "group"
    standby: bool = True  # pre-warmed standby workers (runner/workers/standby.py)
    preload: tuple[str, ...] = ("torch",)  # what a standby imports ahead of time
    standby_max_memory_mb: int = 4096  # a standby above this once warm is stopped, standbys off
    budgets: Budgets = field(default_factory=Budgets)  # per failure class, on top of max_restarts
    crash_loop: int = 3  # the same exception on this many consecutive attempts stops the job (0 = off)


@dataclass(frozen=True)
class Shutdown:
    """How workers are stopped: this signal, then SIGKILL after grace_period seconds.

    signals_to_handle: the signals that stop the job when the agent receives them (like torchrun's
    --signals-to-handle); the received signal is forwarded to the workers.
    """

    signal: str = "SIGTERM"
    grace_period: float = 30.0
    signals_to_handle: tuple[str, ...] = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


@dataclass(frozen=True)
class Logs:
    """Where per-rank logs go and how the console looks."""

    dir: str = "runner-logs"  # base; each run writes <dir>/<job>/<run id>/
    tee: bool = True
    console_streams: str = "all"  # all|stdout|stderr|none, or per local rank: "0:all,1:stderr,other:none"
    console_local_ranks: tuple[int, ...] | None = None  # only these local ranks on the console; None = all

    def to_console(self, local_rank: int) -> tuple[bool, bool]:
        """(stdout, stderr) of `local_rank` copied to the console? (log files always get both)."""
        if not self.tee or (self.console_local_ranks is not None and local_rank not in self.console_local_ranks):
            return False, False
        streams = console_streams_of(self.console_streams, local_rank)
        return streams in ("all", "stdout"), streams in ("all", "stderr")
    prefix: str = "[{node}:{rank}] "  # fields: node, rank, local_rank, attempt
    format: LogFormat = "auto"


def console_streams_of(value: str, local_rank: int) -> str:
    """The streams (all, stdout, stderr, none) `logs.console_streams` gives `local_rank`: its own, other:, or all."""
    if ":" not in value:
        return value
    table = dict(item.split(":", 1) for item in value.split(","))
    return table.get(str(local_rank), table.get("other", "all"))


@dataclass(frozen=True)
class Watchdog:
    """File-timer watchdog (torch FileTimerClient compatible) and hang detection."""

    enabled: bool = False
    check_interval: float = 0.1
    capture_stacks: bool = True
    heartbeat_timeout: float | None = None
    progress_timeout: float | None = None  # a worker whose reported step stays the same this long is hung
    stall_timeout: float | None = 300.0  # no rank of a node used CPU, did I/O or a collective this long: hung (on
    # by default, with `enabled` false too: runner/watchdog/stall.py); None = off
    max_run_time: float | None = None
    flight_recorder: int = 2000  # entries of each worker's torch flight recorder (TORCH_FR_BUFFER_SIZE); 0 = off
    keep_out_culprit: bool = True  # a hang's culprit node sits out the next round when nodes.min allows


@dataclass(frozen=True)
class HealthPath:
    """A folder whose file system needs `min_free` bytes free (None: health.min_free); absolute once loaded."""

    path: str
    min_free: int | None = None


@dataclass(frozen=True)
class HealthCommand:
    """A shell command line checked before joining: exit 0 = healthy; its process group is killed at `timeout`."""

    run: str
    timeout: float = 30.0


@dataclass(frozen=True)
class Health:
    """Checks a node runs before it joins each rendezvous round (runner/health/, docs/health.md).

    Sizes are bytes (0 = not checked); `gpus` is the spec's `auto` resolved when the spec is loaded (0 = not
    checked). A node that fails stays out of the round and tries again every `retry_interval`; after
    `give_up_after` (None: never) its agent ends with exit 3.
    """

    min_free: int = 0  # in logs.dir and each path without its own min_free
    paths: tuple[HealthPath, ...] = ()
    min_free_memory: int = 0  # MemAvailable
    gpus: int = 0  # NVIDIA GPUs that must be visible and healthy
    commands: tuple[HealthCommand, ...] = ()
    timeout: float = 60.0  # one try of every check
    retry_interval: float = 10.0
    give_up_after: float | None = 60.0
    max_failures: int = 0  # the node ledger: this many own failures within failure_window keep a node out; 0 = off
    failure_window: float = 86400.0

    @property
    def configured(self) -> bool:
        """Whether any check is asked for (if not, a node joins without checking anything)."""
        return bool(self.min_free or self.min_free_memory or self.gpus or self.commands
                    or any(p.min_free for p in self.paths))


@dataclass(frozen=True)
class Metrics:
    """Optional Prometheus endpoint on the agent (needs the prometheus-client package)."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: int = 0  # 0 = any free port (logged as metrics_listening)


@dataclass(frozen=True)
class Slurm:
    """Settings for `runner template slurm`."""

    partition: str | None = None
    account: str | None = None
    time_limit: float | None = None  # seconds; None = the partition's default
    signal_lead: float = 120.0  # SIGTERM to the agents this long before the time limit
    requeue: bool = True
    cpus_per_node: int | None = None
    sbatch_args: tuple[str, ...] = ()
    etcd_command: str = "etcd"


@dataclass(frozen=True)
class Kubernetes:
    """Settings for `runner template kubernetes`."""

    image: str | None = None
    namespace: str = "default"
    workdir: str = "/workspace"
    cpu: str | None = None
    memory: str | None = None
    etcd_image: str = "quay.io/coreos/etcd:v3.5.17"
    service_account: str | None = None


@dataclass(frozen=True)
class Cluster:
    """How `runner template` places the job on a scheduler."""

    etcd: Literal["external", "start"] = "external"
    etcd_port: int = 2379
    gpus_per_node: int = 0
    slurm: Slurm = field(default_factory=Slurm)
    kubernetes: Kubernetes = field(default_factory=Kubernetes)


@dataclass(frozen=True)
class Lighthouse:
    """TorchFT's lighthouse, where replica groups agree on a quorum each step: hosted by the agent, or an address."""

    hosted: bool = True  # the agent runs `torchft_lighthouse` (runner[ft]) and restarts it if it dies
    address: str | None = None  # http://host:port of a lighthouse run elsewhere (hosted: false)
    port: int = 0  # hosted: the port to bind (0 = a free one)
    join_timeout: float = 1.0  # how long a quorum waits for heartbeating stragglers
    heartbeat_timeout: float = 5.0  # a group silent this long is left out of the quorum
    quorum_tick: float = 0.1  # how often a waiting quorum is re-checked


@dataclass(frozen=True)
class ReplicaGroups:
    """Fault-tolerant replica groups (TorchFT): N worlds that train together, each failing and restarting alone."""

    count: int = 2
    nproc_per_node: int = 1  # workers per group; each group is its own world (RANK/WORLD_SIZE within the group)
    nodes_per_group: int = 1  # etcd: each node runs one group's share; nodes = count x nodes_per_group
    min_active: int = 1  # groups that must take part in a step (the lighthouse's min_replicas)
    lighthouse: Lighthouse = field(default_factory=Lighthouse)


@dataclass(frozen=True)
class JobSpec:
    """A validated, fully defaulted job spec."""

    name: str
    entrypoint: Entrypoint
    version: int = 1
    env: tuple[tuple[str, str], ...] = ()
    cwd: str = "."  # absolute after loading (relative paths resolve against the spec file's folder)
    nodes: Nodes = field(default_factory=Nodes)
    nproc_per_node: int = 1  # auto/gpu/xpu/cpu are counted when the spec is loaded
    role: str = "default"  # ROLE_NAME
    virtual_local_rank: bool = False  # LOCAL_RANK=0, CUDA_VISIBLE_DEVICES = the rank's own GPU
    rendezvous: Rendezvous = field(default_factory=Rendezvous)
    restart: Restart = field(default_factory=Restart)
    shutdown: Shutdown = field(default_factory=Shutdown)
    logs: Logs = field(default_factory=Logs)
    watchdog: Watchdog = field(default_factory=Watchdog)
    health: Health = field(default_factory=Health)
    metrics: Metrics = field(default_factory=Metrics)
    cluster: Cluster = field(default_factory=Cluster)
    replica_groups: ReplicaGroups | None = None  # None: one group of nproc_per_node workers, as torchrun

    @property
    def workers_per_node(self) -> int:
        """Workers this node runs at once: every replica group's (one node), one group's share (etcd), or nproc."""
        groups = self.replica_groups
        if groups is None:
            return self.nproc_per_node
        return groups.nproc_per_node * (groups.count if self.rendezvous.backend == "local" else 1)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (tuples become lists, env becomes a mapping)."""
        data = asdict(self)
        data["env"] = dict(self.env)
        if data["replica_groups"] is None:  # absent, as the user wrote it (the schema has no null for it)
            del data["replica_groups"]
        plain: dict[str, Any] = json.loads(json.dumps(data))
        return plain

    def identity(self) -> str:
        """What tells this job from another of the same name, for state kept across runs (the node ledger).

        A digest of the name, the folder and what each worker runs (script, module or command; not its arguments,
        budgets or sizes, which a job's next run may change): `runner convert`'s `train` in two folders, or two specs
        named alike that run different scripts, are two jobs; a re-run with a new learning rate is the same one.
        """
        ep = self.entrypoint
        what = {"name": self.name, "cwd": self.cwd, "script": ep.script, "module": ep.module,
                "command": list(ep.command) if ep.command is not None else None}
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode("utf-8", "surrogatepass")).hexdigest()[:12]

    def digest(self) -> str:
        """Stable hash of the resolved spec: nodes of one job must agree on it."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]
