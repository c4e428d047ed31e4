"""Schema-valid spec data -> frozen JobSpec: shorthands expanded, durations in seconds, paths absolute.

Conversions that can still fail (a signal name, a shell string, a log-prefix field) add problems;
cross-field rules live in `checks.py`.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import string
from typing import Any

from runner.config.devices import count as count_devices
from runner.config.devices import nvidia_gpus_used
from runner.config.durations import parse_duration
from runner.config.limits import MAX_PREFIX_WIDTH
from runner.config.problems import did_you_mean
from runner.config.sizes import HINT as SIZE_HINT
from runner.config.sizes import parse_size
from runner.config.spec import (
    TLS,
    Auth,
    Backoff,
    Budgets,
    ClassBudget,
    Cluster,
    Entrypoint,
    Health,
    HealthCommand,
    HealthPath,
    JobSpec,
    Kubernetes,
    Lighthouse,
    Logs,
    Metrics,
    Nodes,
    Rendezvous,
    ReplicaGroups,
    Restart,
    Shutdown,
    Slurm,
    Watchdog,
)
from runner.config.yaml_source import Document, Path, shown
from runner.errors import SpecProblem

PREFIX_FIELDS = ("node", "rank", "local_rank", "attempt")
_SAMPLE: dict[str, str | int] = {"node": "node-0", "rank": 0, "local_rank": 0, "attempt": 0}  # console's types
UNHANDLEABLE = {  # signals shutdown.signals_to_handle refuses (and `runner convert` notes), and why
    "SIGKILL": "no process can catch it",
    "SIGSTOP": "no process can catch it",
    "SIGUSR2": "it is the graceful-stop signal (runner stop --graceful)",
    "SIGCHLD": "the kernel sends it whenever a child exits",
}


class Builder:
    """Builds one JobSpec from `doc.data`, collecting problems instead of raising.

    One concern over 20 methods: one method per spec section or field kind (durations, sizes, paths), all adding to
    the one list of problems that a SpecError reports at once.
    """

    def __init__(self, doc: Document, base_dir: str, *, devices_here: bool = True) -> None:
        """`doc` is schema-valid; relative paths resolve against `base_dir` (absolute).

        `devices_here=False`: the spec is loaded on a machine other than the nodes' (`runner template` on a login
        node), so `nproc_per_node: gpu|xpu` is counted on each node when it runs, and no device here is no problem.
        """
        self.doc = doc
        self.base_dir = base_dir
        self.devices_here = devices_here
        self.problems: list[SpecProblem] = []

    def fail(self, path: Path, message: str, fix: str = "") -> None:
        """Record a problem at `path`."""
        self.problems.append(self.doc.problem(path, message, fix))

    def build(self) -> JobSpec:
        """The JobSpec (check `problems` before trusting it)."""
        data: dict[str, Any] = self.doc.data if isinstance(self.doc.data, dict) else {}  # parse_yaml refuses others
        cwd = self.path(data.get("cwd", ".")) or self.base_dir
        nproc_raw = data.get("nproc_per_node", 1)
        nproc = self.nproc_per_node(nproc_raw)
        cluster = self.cluster(data.get("cluster", {}))
        return JobSpec(
            name=data["name"],
            entrypoint=self.entrypoint(data["entrypoint"]),
            version=int(data.get("version", 1)),
            env=self.env(data.get("env", {})),
            cwd=cwd,
            nodes=self.nodes(data.get("nodes", 1)),
            nproc_per_node=nproc,
            role=data.get("role", "default"),
            virtual_local_rank=data.get("virtual_local_rank", False),
            rendezvous=self.rendezvous(data.get("rendezvous", {})),
            restart=self.restart(data.get("restart", {})),
            shutdown=self.shutdown(data.get("shutdown", {})),
            logs=self.logs(data.get("logs", {})),
            watchdog=self.watchdog(data.get("watchdog", {})),
            health=self.health(data.get("health", {}), cwd,
                               auto_gpus=nvidia_gpus_used(nproc_raw, nproc, cluster.gpus_per_node, os.environ)),
            metrics=self.metrics(data.get("metrics", {})),
            cluster=cluster,
            replica_groups=self.replica_groups(data.get("replica_groups")),
        )

    def path(self, value: str | None) -> str | None:
        """A user path made absolute against the spec file's folder (`~` expanded)."""
        if value is None:
            return None
        return os.path.normpath(os.path.join(self.base_dir, os.path.expanduser(value)))

    def duration(self, value: Any, path: Path) -> float:
        """Seconds; a problem (and 0.0) for what the schema could not rule out (inf, nan)."""
        try:
            return parse_duration(value)
        except ValueError as err:
            self.fail(path, str(err), "write a finite number of seconds or a string such as 30s")
            return 0.0

    def opt_duration(self, value: Any, path: Path) -> float | None:
        """A duration or None."""
        return None if value is None else self.duration(value, path)

    def size(self, value: Any, path: Path) -> int:
        """Bytes; a problem (and 0) for what the schema could not rule out (more than 64 bits hold)."""
        try:
            return parse_size(value)
        except ValueError as err:
            self.fail(path, str(err), SIZE_HINT)
            return 0

    def entrypoint(self, raw: str | dict[str, Any]) -> Entrypoint:
        """String shorthand = script; a command string is split like a shell would."""
        if isinstance(raw, str):
            return Entrypoint(script=raw)
        kinds = [kind for kind in ("script", "module", "command") if raw.get(kind) is not None]
        if len(kinds) != 1:
            found = f"found {' and '.join(kinds)}" if kinds else "found none"
            self.fail(("entrypoint",), f"needs exactly one of script, module, command ({found})",
                      "keep one: script: train.py, module: pkg.train or command: [prog, arg]")
        return Entrypoint(
            script=raw.get("script"),
            module=raw.get("module"),
            command=self.command(raw.get("command")),
            args=tuple(raw.get("args", ())),
            python=raw.get("python"),
        )

    def command(self, raw: str | list[str] | None) -> tuple[str, ...] | None:
        """List as is; a string split with shlex."""
        if raw is None or isinstance(raw, list):
            return None if raw is None else tuple(raw)
        try:
            argv = shlex.split(raw)
        except ValueError as err:
            self.fail(("entrypoint", "command"), f"cannot split the command line: {err}",
                      "balance the quotes, or write the command as a list of strings")
            return (raw,)
        if not argv:
            self.fail(("entrypoint", "command"), "the command is empty", "write the program to run")
        return tuple(argv)

    def env(self, raw: dict[str, Any]) -> tuple[tuple[str, str], ...]:
        """Values as strings; unquoted numbers/booleans keep the text written (`yes`, `0x10`, `1.0`)."""
        out = []
        for key, value in raw.items():
            text = value if isinstance(value, str) else self.doc.plain.get(("env", key))
            if text is None:
                text = str(value).lower() if isinstance(value, bool) else str(value)
            out.append((key, text))
        return tuple(out)

    def nodes(self, raw: int | str | dict[str, int]) -> Nodes:
        """4 -> 4..4; '1:4' -> 1..4; {min, max} as given."""
        if isinstance(raw, (int, float)):
            return Nodes(int(raw), int(raw))
        if isinstance(raw, str):
            low, _, high = raw.partition(":")
            try:
                return Nodes(int(low), int(high or low))
            except ValueError:  # more digits than int() takes
                self.fail(("nodes",), f"'{shown(raw)}' is not a usable number of nodes", "e.g. nodes: 1:4")
                return Nodes()
        return Nodes(int(raw["min"]), int(raw["max"]))

    def nproc_per_node(self, raw: int | str) -> int:
        """A number (JSON Schema counts 2.0 as an integer), or auto/gpu/xpu/cpu counted on this machine."""
        if not isinstance(raw, str):
            return int(raw)
        found = count_devices(raw, os.environ)
        if found < 1 and not self.devices_here:
            return 1  # counted on each node when it runs (this machine renders a template for them)
        if found < 1:
            device = "GPU" if raw == "gpu" else "Intel GPU (xpu)"
            self.fail(("nproc_per_node",), f"nproc_per_node: {raw} but no {device} is visible on this machine",
                      "run on a node with one (check CUDA_VISIBLE_DEVICES), or write auto or a number")
            return 1
        return found

    def rendezvous(self, raw: dict[str, Any]) -> Rendezvous:
        """Endpoints split and checked; durations in seconds; TLS and password-file paths absolute."""
        default = Rendezvous()
        tls, auth = raw.get("tls", {}), raw.get("auth", {})
        here: Path = ("rendezvous",)
        return Rendezvous(
            backend=raw.get("backend", default.backend),
            endpoints=self.endpoints(raw.get("endpoints", list(default.endpoints))),
            hosted=bool(raw.get("hosted", default.hosted)),
            hosted_members=int(raw.get("hosted_members", default.hosted_members)),
            prefix=raw.get("prefix", default.prefix).rstrip("/") or "/",
            join_timeout=self.duration(raw.get("join_timeout", default.join_timeout), (*here, "join_timeout")),
            last_call=self.duration(raw.get("last_call", default.last_call), (*here, "last_call")),
            lease_ttl=self.duration(raw.get("lease_ttl", default.lease_ttl), (*here, "lease_ttl")),
            connect_timeout=self.duration(raw.get("connect_timeout", default.connect_timeout),
                                          (*here, "connect_timeout")),
            status_interval=self.opt_duration(raw.get("status_interval", default.status_interval),
                                              (*here, "status_interval")),
            master_addr=raw.get("master_addr"),
            master_port=raw.get("master_port"),
            tls=TLS(ca=self.path(tls.get("ca")), cert=self.path(tls.get("cert")), key=self.path(tls.get("key"))),
            auth=Auth(user=auth.get("user"), password_env=auth.get("password_env"),
                      password_file=self.path(auth.get("password_file"))),
            secret_file=self.path(raw.get("secret_file")),
        )

    def endpoints(self, raw: str | list[str]) -> tuple[str, ...]:
        """'a:1, b:2' or [a:1, b:2] -> ('a:1', 'b:2'); ports must be 1..65535."""
        items = raw.split(",") if isinstance(raw, str) else raw
        out = tuple(item.strip() for item in items)
        for i, endpoint in enumerate(out):
            port = int(endpoint.rpartition(":")[2])
            if not 1 <= port <= 65535:
                where: Path = ("rendezvous", "endpoints") if isinstance(raw, str) else ("rendezvous", "endpoints", i)
                self.fail(where, f"port {port} of '{endpoint}' is out of range", "use a port from 1 to 65535")
        return out

    def restart(self, raw: dict[str, Any]) -> Restart:
        """Backoff durations in seconds; exit codes de-duplicated, order kept."""
        default, backoff = Restart(), raw.get("backoff", {})
        here: Path = ("restart", "backoff")
        return Restart(
            max_restarts=int(raw.get("max_restarts", default.max_restarts)),
            backoff=Backoff(
                initial=self.duration(backoff.get("initial", default.backoff.initial), (*here, "initial")),
                max=self.duration(backoff.get("max", default.backoff.max), (*here, "max")),
                multiplier=float(backoff.get("multiplier", default.backoff.multiplier)),
                jitter=float(backoff.get("jitter", default.backoff.jitter)),
            ),
            non_retryable_exit_codes=tuple(dict.fromkeys(int(c) for c in raw.get("non_retryable_exit_codes", ()))),
            scope=raw.get("scope", default.scope),
            standby=bool(raw.get("standby", default.standby)),
            preload=tuple(dict.fromkeys(raw.get("preload", default.preload))),
            standby_max_memory_mb=int(raw.get("standby_max_memory_mb", default.standby_max_memory_mb)),
            budgets=self.budgets(raw.get("budgets", {})),
            crash_loop=int(raw.get("crash_loop", default.crash_loop)),
        )

    @staticmethod
    def budgets(raw: dict[str, Any]) -> Budgets:
        """restart.budgets: N, null or {max, charged} per class; a class not written keeps its default."""
        default = Budgets()
        out: dict[str, ClassBudget] = {}
        for name, value in raw.items():
            base: ClassBudget = getattr(default, name)
            limit, charged = (value.get("max", base.max), value.get("charged", base.charged)) if isinstance(
                value, dict) else (value, base.charged)
            out[name] = ClassBudget(max=None if limit is None else int(limit), charged=bool(charged))
        return Budgets(**out)

    def shutdown(self, raw: dict[str, Any]) -> Shutdown:
        """Signal normalised to its SIGxxx name."""
        default = Shutdown()
        return Shutdown(
            signal=self.signal_name(raw.get("signal", default.signal)),
            grace_period=self.duration(raw.get("grace_period", default.grace_period), ("shutdown", "grace_period")),
            signals_to_handle=self.signals_to_handle(raw.get("signals_to_handle", default.signals_to_handle)),
        )

    def signals_to_handle(self, raw: list[str | int] | tuple[str, ...]) -> tuple[str, ...]:
        """Names normalised and deduplicated; refused: signals that cannot be caught or already mean something."""
        names: list[str] = []
        for i, item in enumerate(raw):
            where = ("shutdown", "signals_to_handle", i)
            name = self.signal_name(item, where)
            why = UNHANDLEABLE.get(name)
            if why is not None:
                self.fail(where, f"{name} cannot stop the job: {why}", "list stop signals such as SIGTERM, SIGINT")
            elif name not in names:
                names.append(name)
        return tuple(names)

    def signal_name(self, raw: str | int, where: Path = ("shutdown", "signal")) -> str:
        """'TERM', 'sigterm', 15 -> 'SIGTERM'; unknown -> problem."""
        names = sorted(s.name for s in signal.Signals)
        try:
            if isinstance(raw, (int, float)):
                return signal.Signals(int(raw)).name
            text = raw.strip().upper()
            return signal.Signals[text if text.startswith("SIG") else "SIG" + text].name
        except (KeyError, ValueError):
            if not isinstance(raw, str):
                hint = "use a signal name such as SIGTERM or SIGINT"
            else:
                word = raw.strip().upper()
                hint = did_you_mean(word if word.startswith("SIG") else "SIG" + word, names, "signals")
            self.fail(where, f"unknown signal {shown(repr(raw))}", hint)
            return "SIGTERM"

    def logs(self, raw: dict[str, Any]) -> Logs:
        """Prefix checked against the fields it may use."""
        default = Logs()
        prefix = raw.get("prefix", default.prefix)
        self.check_prefix(prefix)
        return Logs(
            dir=raw.get("dir", default.dir),
            tee=raw.get("tee", default.tee),
            console_streams=self.console_streams(raw.get("console_streams", default.console_streams)),
            console_local_ranks=None if raw.get("console_local_ranks") is None
            else tuple(dict.fromkeys(int(r) for r in raw["console_local_ranks"])),
            prefix=prefix,
            format=raw.get("format", default.format),
        )

    def console_streams(self, value: str) -> str:
        """Per-rank form normalised (`00:` is rank 0); a local rank listed twice is a problem."""
        if ":" not in value:
            return value
        seen: dict[str, str] = {}
        for item in value.split(","):
            rank, _, streams = item.partition(":")
            key = rank if rank == "other" else str(int(rank))
            if key in seen:
                self.fail(("logs", "console_streams"), f"local rank {key} is listed twice in {shown(value)!r}",
                          "list each local rank once, e.g. 0:all,1:stderr,other:none")
            seen[key] = streams
        return ",".join(f"{k}:{v}" for k, v in seen.items())

    def check_prefix(self, prefix: str) -> None:
        """The prefix must format as the console will format it.

        {node} is text; {rank}, {local_rank}, {attempt} are integers; each may have a conversion and a format
        spec no wider than MAX_PREFIX_WIDTH (a huge width would pad every console line).
        """
        where: Path = ("logs", "prefix")
        allowed = ", ".join("{" + f + "}" for f in PREFIX_FIELDS)
        try:
            fields = [(name, spec or "") for _, name, spec, _ in string.Formatter().parse(prefix) if name is not None]
        except ValueError as err:
            self.fail(where, f"invalid prefix {shown(prefix)!r}: {err}",
                      f"use fields {allowed}; write {{{{ for a literal {{")
            return
        before = len(self.problems)
        for name, spec in fields:
            if name not in PREFIX_FIELDS:
                hint = did_you_mean(name, PREFIX_FIELDS, "fields") if name else "name the field"
                self.fail(where, f"unknown field {{{shown(name)}}} in prefix {shown(prefix)!r}",
                          f"{hint} (fields: {allowed})")
            elif "{" in spec or any(int(n) > MAX_PREFIX_WIDTH for n in re.findall(r"[0-9]+", spec)):
                self.fail(where, f"format spec ':{shown(spec)}' of {{{name}}} is too wide or nested",
                          f"keep widths at most {MAX_PREFIX_WIDTH}, e.g. {{rank:>3}}")
        if len(self.problems) > before:
            return
        try:
            prefix.format(**_SAMPLE)
        except (ValueError, IndexError, KeyError, TypeError, AttributeError) as err:
            self.fail(where, f"invalid prefix {shown(prefix)!r}: {shown(str(err), 100)}",
                      f"{{node}} is text, the others are integers; use plain fields such as {allowed}")

    def replica_groups(self, raw: dict[str, Any] | None) -> ReplicaGroups | None:
        """None when the section is absent; durations in seconds."""
        if raw is None:
            return None
        default, light = ReplicaGroups(), raw.get("lighthouse", {})
        here: Path = ("replica_groups", "lighthouse")

        def seconds(name: str) -> float:
            return self.duration(light.get(name, getattr(default.lighthouse, name)), (*here, name))

        lighthouse = Lighthouse(
            hosted=bool(light.get("hosted", True)),
            address=light.get("address"),
            port=int(light.get("port", 0)),
            join_timeout=seconds("join_timeout"),
            heartbeat_timeout=seconds("heartbeat_timeout"),
            quorum_tick=seconds("quorum_tick"),
        )
        return ReplicaGroups(
            count=int(raw["count"]),
            nproc_per_node=int(raw.get("nproc_per_node", default.nproc_per_node)),
            nodes_per_group=int(raw.get("nodes_per_group", default.nodes_per_group)),
            min_active=int(raw.get("min_active", default.min_active)),
            lighthouse=lighthouse,
        )

    def watchdog(self, raw: dict[str, Any]) -> Watchdog:
        """Durations in seconds; null stays None (off).

        `enabled` unwritten follows heartbeat_timeout: a timeout asks for hang detection, which needs the watchdog
        (an explicit `enabled: false` beside it is refused in checks.py). max_run_time needs no watchdog.
        """
        default, here = Watchdog(), ("watchdog",)
        return Watchdog(
            enabled=raw.get("enabled", raw.get("heartbeat_timeout") is not None
                            or raw.get("progress_timeout") is not None),
            check_interval=self.duration(raw.get("check_interval", default.check_interval),
                                         (*here, "check_interval")),
            capture_stacks=raw.get("capture_stacks", default.capture_stacks),
            heartbeat_timeout=self.opt_duration(raw.get("heartbeat_timeout"), (*here, "heartbeat_timeout")),
            progress_timeout=self.opt_duration(raw.get("progress_timeout"), (*here, "progress_timeout")),
            stall_timeout=self.opt_duration(raw.get("stall_timeout", default.stall_timeout),
                                            (*here, "stall_timeout")),
            max_run_time=self.opt_duration(raw.get("max_run_time"), (*here, "max_run_time")),
            flight_recorder=int(raw.get("flight_recorder", default.flight_recorder)),
            keep_out_culprit=bool(raw.get("keep_out_culprit", default.keep_out_culprit)),
        )

    def health(self, raw: dict[str, Any], cwd: str, *, auto_gpus: int) -> Health:
        """Sizes in bytes, durations in seconds, paths absolute (against cwd), `gpus: auto` resolved to `auto_gpus`."""
        default, here = Health(), ("health",)
        paths = []
        for i, item in enumerate(raw.get("paths", ())):
            path, limit = (item, None) if isinstance(item, str) else (item["path"], item.get("min_free"))
            where: Path = (*here, "paths", i) if isinstance(item, str) else (*here, "paths", i, "min_free")
            paths.append(HealthPath(path=os.path.normpath(os.path.join(cwd, os.path.expanduser(path))),
                                    min_free=None if limit is None else self.size(limit, where)))
        commands = []
        for i, item in enumerate(raw.get("commands", ())):
            if isinstance(item, str):
                commands.append(HealthCommand(run=item))
            else:
                timeout = self.duration(item.get("timeout", HealthCommand.timeout), (*here, "commands", i, "timeout"))
                commands.append(HealthCommand(run=item["run"], timeout=timeout))
        gpus = raw.get("gpus", "auto")
        return Health(
            min_free=self.size(raw.get("min_free", default.min_free), (*here, "min_free")),
            paths=tuple(paths),
            min_free_memory=self.size(raw.get("min_free_memory", default.min_free_memory), (*here, "min_free_memory")),
            gpus=auto_gpus if gpus == "auto" else int(gpus),
            commands=tuple(commands),
            timeout=self.duration(raw.get("timeout", default.timeout), (*here, "timeout")),
            retry_interval=self.duration(raw.get("retry_interval", default.retry_interval), (*here, "retry_interval")),
            give_up_after=self.opt_duration(raw.get("give_up_after", default.give_up_after), (*here, "give_up_after")),
            max_failures=int(raw.get("max_failures", default.max_failures)),
            failure_window=self.duration(raw.get("failure_window", default.failure_window), (*here, "failure_window")),
        )

    def metrics(self, raw: dict[str, Any]) -> Metrics:
        """Prometheus endpoint settings."""
        return Metrics(**{**raw, "port": int(raw.get("port", 0))})

    def cluster(self, raw: dict[str, Any]) -> Cluster:
        """Scheduler settings; the Slurm durations in seconds."""
        slurm, here = dict(raw.get("slurm", {})), ("cluster", "slurm")
        if slurm.get("time_limit") is not None:
            slurm["time_limit"] = self.duration(slurm["time_limit"], (*here, "time_limit"))
        if "signal_lead" in slurm:
            slurm["signal_lead"] = self.duration(slurm["signal_lead"], (*here, "signal_lead"))
        slurm["sbatch_args"] = tuple(slurm.get("sbatch_args", ()))
        if slurm.get("cpus_per_node") is not None:
            slurm["cpus_per_node"] = int(slurm["cpus_per_node"])
        rest = {k: v for k, v in raw.items() if k not in ("slurm", "kubernetes")}
        rest |= {k: int(rest[k]) for k in ("etcd_port", "gpus_per_node") if k in rest}  # 2.0 is an integer too
        return Cluster(**rest, slurm=Slurm(**slurm), kubernetes=Kubernetes(**raw.get("kubernetes", {})))
