"""Cross-field rules the schema cannot say clearly, run on the built JobSpec."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterator
from typing import cast

from runner.config.limits import MAX_ARG_BYTES, MAX_WORLD_SIZE
from runner.config.spec import Health, JobSpec, Metrics, Rendezvous, ReplicaGroups, Watchdog
from runner.config.timeout_order import timeout_order
from runner.config.yaml_source import Document, Path
from runner.errors import SpecProblem
from runner.json_types import JSON

Found = tuple[Path | tuple[Path, ...], str, str]  # where (or candidates, first written wins), message, fix
Check = Callable[[JobSpec], Iterator[Found]]
DocCheck = Callable[[JobSpec, Document], Iterator[Found]]  # also reads the data: what the user wrote, not defaults


def _nodes(spec: JobSpec) -> Iterator[Found]:
    nodes = spec.nodes
    if nodes.min < 1:
        yield ("nodes",), f"nodes.min must be >= 1, found {nodes.min}", "a job needs at least one node"
    if nodes.min > nodes.max:
        yield ("nodes",), f"nodes.min ({nodes.min}) is greater than nodes.max ({nodes.max})", "swap them: MIN:MAX"
    if spec.rendezvous.backend == "local" and nodes.max > 1:
        yield ((("rendezvous", "backend"), ("nodes",)),
               f"backend 'local' runs one node only, but nodes.max is {nodes.max}",
               "set rendezvous.backend: etcd (and rendezvous.endpoints), or nodes: 1")


def _entrypoint(spec: JobSpec) -> Iterator[Found]:
    entry = spec.entrypoint
    if entry.command is not None and entry.python is not None:
        yield (("entrypoint", "python"), "python applies to script and module only",
               "put the interpreter in command itself, or remove python")


def _backoff(spec: JobSpec) -> Iterator[Found]:
    backoff = spec.restart.backoff
    if backoff.initial > backoff.max:
        yield (("restart", "backoff", "initial"),
               f"backoff.initial ({backoff.initial:g} s) is greater than backoff.max ({backoff.max:g} s)",
               "lower initial or raise max")
    if spec.restart.crash_loop == 1:
        yield (("restart", "crash_loop"), "crash_loop: 1 would call any first exception a crash loop",
               "use 2 or more (0 = off); restart.budgets.exception: 0 stops at the first exception")
    if 0 in spec.restart.non_retryable_exit_codes:
        yield (("restart", "non_retryable_exit_codes"), "exit code 0 means success, it cannot be a failure",
               "remove 0")


def _security(spec: JobSpec) -> Iterator[Found]:
    tls, auth = spec.rendezvous.tls, spec.rendezvous.auth
    if (tls.cert is None) != (tls.key is None):
        yield (("rendezvous", "tls"), "tls.cert and tls.key go together (a client certificate needs its key)",
               "set both, or neither")
    if auth.password_env is not None and auth.password_file is not None:
        yield (("rendezvous", "auth"), "password_env and password_file are both set", "keep one of them")
    if auth.user is None and (auth.password_env is not None or auth.password_file is not None):
        yield ("rendezvous", "auth"), "a password is given but no user", "add auth.user"


def unspecified(host: str) -> bool:
    """Whether `host` is no address at all: empty, or any spelling of "every interface" (0.0.0.0, 0, ::, [::0]...)."""
    if host in ("", "0"):  # "0": Linux reads it as 0.0.0.0
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:0.0.0.0 is 0.0.0.0
    return address.is_unspecified or (mapped is not None and mapped.is_unspecified)


def _hosted(spec: JobSpec) -> Iterator[Found]:
    rdzv = spec.rendezvous
    if rdzv.secret_file is not None and not rdzv.hosted:
        why = "secret_file applies to a hosted rendezvous (hosted: true): an etcd you run has its own TLS and users"
        fix = "remove it, and set rendezvous.tls and rendezvous.auth for your etcd; or set hosted: true"
        yield ("rendezvous", "secret_file"), why, fix
    if not rdzv.hosted:
        if rdzv.hosted_members != Rendezvous().hosted_members:
            why = "does nothing without hosted: true (an etcd you run has the members you gave it)"
            fix = "remove rendezvous.hosted_members, or set rendezvous.hosted: true"
            yield ("rendezvous", "hosted_members"), why, fix
        return
    here = ("rendezvous", "hosted")
    if rdzv.backend != "etcd":
        yield here, "hosted applies to backend etcd", "set rendezvous.backend: etcd"
    if len(rdzv.endpoints) > rdzv.hosted_members:
        why = (f"a hosted rendezvous has at most rendezvous.hosted_members ({rdzv.hosted_members}) endpoints, "
               f"found {len(rdzv.endpoints)}")
        fix = ("write the hosting node's host:port first, then the hosts of the next members, e.g. "
               "['node0:29400', 'node1:29400', 'node2:29400']")
        yield ("rendezvous", "endpoints"), why, fix
    for endpoint in rdzv.endpoints:
        if unspecified(endpoint.rpartition(":")[0].strip("[]")):
            yield (("rendezvous", "endpoints"), f"'{endpoint}' is no address the other nodes can reach",
                   "write the hosting node's own address, e.g. 10.0.0.5:29400")
    if len({e.rpartition(":")[2] for e in rdzv.endpoints}) > 1:
        why = f"the hosted etcd's members all serve on one port, but the endpoints name several: {rdzv.endpoints}"
        yield ("rendezvous", "endpoints"), why, "write the same port on every endpoint"
    if any((rdzv.tls.ca, rdzv.tls.cert, rdzv.tls.key)) or rdzv.auth.user is not None:
        why = "the hosted etcd's TLS and authentication come from the job's secret, but rendezvous.tls or auth is set"
        fix = ("remove rendezvous.tls and rendezvous.auth (give rendezvous.secret_file), or start your own etcd "
               "(hosted: false)")
        yield here, why, fix

def _positive(spec: JobSpec) -> Iterator[Found]:
    rdzv, watchdog = spec.rendezvous, spec.watchdog
    for path, value in (
        (("rendezvous", "join_timeout"), rdzv.join_timeout),
        (("rendezvous", "connect_timeout"), rdzv.connect_timeout),
        (("shutdown", "grace_period"), spec.shutdown.grace_period),
        (("watchdog", "check_interval"), watchdog.check_interval),
        (("watchdog", "heartbeat_timeout"), watchdog.heartbeat_timeout),
        (("watchdog", "progress_timeout"), watchdog.progress_timeout),
        (("watchdog", "stall_timeout"), watchdog.stall_timeout),
        (("watchdog", "max_run_time"), watchdog.max_run_time),
    ):
        if value is not None and value <= 0:
            yield path, f"must be greater than 0, found {value:g}", "use a positive duration such as 30s"
    if rdzv.status_interval is not None and rdzv.status_interval < 1:
        yield (("rendezvous", "status_interval"), f"must be at least 1 s, found {rdzv.status_interval:g}",
               "use 1s or more (one etcd put per node per interval), or null to publish on changes only")
    if rdzv.lease_ttl < 1:
        yield (("rendezvous", "lease_ttl"), f"must be at least 1 s, found {rdzv.lease_ttl:g}",
               "etcd leases count whole seconds; use 1s or more")


def _watchdog_off(spec: JobSpec, doc: Document) -> Iterator[Found]:
    """An explicit `enabled: false` beside a field that only the running watchdog reads: that field would do nothing.

    (heartbeat_timeout with `enabled` unwritten turns the watchdog on, see build.py; max_run_time needs no watchdog;
    stall_timeout neither, and while it is on capture_stacks and keep_out_culprit apply to the stalls it finds.)
    """
    watchdog, default = spec.watchdog, Watchdog()
    if watchdog.enabled or not _written(doc, ("watchdog", "enabled")):
        return
    unused = (
        ("heartbeat_timeout", watchdog.heartbeat_timeout is not None, "no worker would ever be found hung"),
        ("progress_timeout", watchdog.progress_timeout is not None, "no stalled step would ever be found"),
        ("check_interval", watchdog.check_interval != default.check_interval, "it paces the watchdog's file timer"),
        ("capture_stacks", watchdog.capture_stacks != default.capture_stacks and watchdog.stall_timeout is None,
         "it applies when the watchdog kills a hung worker"),
        ("keep_out_culprit", watchdog.keep_out_culprit != default.keep_out_culprit and watchdog.stall_timeout is None,
         "it applies to a hang the watchdog found"),
    )
    for key, changed, why in unused:
        if changed:
            yield (("watchdog", key), f"does nothing while watchdog.enabled is false ({why})",
                   f"remove watchdog.{key}, or set watchdog.enabled: true")


def _metrics_off(spec: JobSpec, doc: Document) -> Iterator[Found]:
    """metrics.host or metrics.port set while the endpoint is off (metrics.enabled false, its default): unused."""
    if spec.metrics.enabled:
        return
    for key in _set(doc, "metrics", spec.metrics, Metrics(), ("host", "port")):
        yield (("metrics", key), "does nothing while metrics.enabled is false (no endpoint is served)",
               f"set metrics.enabled: true to serve /metrics, or remove metrics.{key}")


# What only the etcd backend reads: written under backend local (one node, nobody to meet), each would do nothing.
ETCD_ONLY = ("endpoints", "prefix", "join_timeout", "last_call", "lease_ttl", "connect_timeout", "status_interval",
             "tls", "auth")


def _etcd_only(spec: JobSpec, doc: Document) -> Iterator[Found]:
    """A rendezvous field only etcd reads, set while the backend is local (hosted and secret_file: _hosted)."""
    if spec.rendezvous.backend != "local":
        return
    for key in _set(doc, "rendezvous", spec.rendezvous, Rendezvous(), ETCD_ONLY):
        yield (("rendezvous", key), "does nothing with backend local (one node, no rendezvous store to reach)",
               f"remove rendezvous.{key}, or set rendezvous.backend: etcd for a job of several nodes")


def _health(spec: JobSpec) -> Iterator[Found]:
    health, here = spec.health, ("health",)
    for key, value in (("timeout", health.timeout), ("retry_interval", health.retry_interval),
                       ("failure_window", health.failure_window)):
        if value <= 0:
            yield (*here, key), f"must be greater than 0, found {value:g}", "use a positive duration such as 10s"
    if not health.max_failures and health.failure_window != Health().failure_window:
        why = "does nothing while health.max_failures is 0 (the node ledger keeps no node out)"
        yield (*here, "failure_window"), why, "remove health.failure_window, or set health.max_failures"
    for i, command in enumerate(health.commands):
        where = (*here, "commands", i)
        if command.timeout <= 0:
            yield where, f"timeout must be greater than 0, found {command.timeout:g}", "use a duration such as 30s"
        elif command.timeout > health.timeout > 0:
            message = (f"its timeout ({command.timeout:g} s) is longer than health.timeout ({health.timeout:g} s), "
                       "which stops every check of a try")
            yield where, message, "lower the command's timeout or raise health.timeout"


def _health_unasked(spec: JobSpec, doc: Document) -> Iterator[Found]:
    """How the health checks run, set while none is asked for (nothing is checked by default): it would do nothing."""
    health = spec.health
    if health.configured:
        return
    for key in _set(doc, "health", health, Health(), ("timeout", "retry_interval", "give_up_after")):
        yield (("health", key), "does nothing while no health check is asked for (nothing is checked)",
               f"ask for a check (health.min_free, min_free_memory, gpus, commands), or remove health.{key}")
    if health.paths:
        yield (("health", "paths"), "no path has a min_free and health.min_free is 0: nothing is checked in them",
               "set health.min_free, or a min_free on each path")


def _os_limits(spec: JobSpec) -> Iterator[Found]:
    world = spec.nodes.max * spec.nproc_per_node
    if world > MAX_WORLD_SIZE:
        message = (f"nodes.max x nproc_per_node is {world} workers; torch.distributed counts ranks in a C int "
                   f"(at most {MAX_WORLD_SIZE})")
        yield ("nproc_per_node",), message, "lower nodes.max or nproc_per_node"
    for key, value in spec.env:
        size = len(key.encode()) + 1 + len(value.encode("utf-8", "surrogatepass"))
        if size >= MAX_ARG_BYTES:
            message = (f"{key}=... is {size} bytes; execve refuses an environment string of {MAX_ARG_BYTES} bytes "
                       "or more (Linux MAX_ARG_STRLEN)")
            yield ("env", key), message, "shorten the value or pass a file path"


def _replica_groups(spec: JobSpec) -> Iterator[Found]:
    groups = spec.replica_groups
    if groups is None:
        return
    if groups.min_active > groups.count:
        yield (("replica_groups", "min_active"),
               f"min_active ({groups.min_active}) is greater than count ({groups.count}): no step could ever be taken",
               f"set min_active to at most {groups.count}")
    yield from _replica_nodes(spec, groups)
    light = groups.lighthouse
    if light.hosted and light.address is not None:
        yield (("replica_groups", "lighthouse", "address"), "a hosted lighthouse has no address to give",
               "remove address, or set hosted: false to use the lighthouse at that address")
    if not light.hosted and light.address is None:
        yield (("replica_groups", "lighthouse"), "hosted: false needs the address of a running lighthouse",
               "set lighthouse.address: http://HOST:PORT, or hosted: true")



def _replica_nodes(spec: JobSpec, groups: ReplicaGroups) -> Iterator[Found]:
    """One node runs every group (backend local); with etcd each node runs one group's share (a fixed size)."""
    if spec.rendezvous.backend == "local":
        if groups.nodes_per_group > 1:
            yield (("replica_groups", "nodes_per_group"), "groups spanning several nodes need rendezvous.backend etcd",
                   "set rendezvous.backend: etcd (docs/replica_groups.md#several-nodes), or nodes_per_group: 1")
        return
    total = groups.count * groups.nodes_per_group
    if spec.nodes.min != total or spec.nodes.max != total:
        shown = str(spec.nodes.min) if spec.nodes.min == spec.nodes.max else f"{spec.nodes.min}:{spec.nodes.max}"
        yield ((("nodes",), ("replica_groups", "nodes_per_group")),
               (f"nodes is {shown}, but {groups.count} group(s) of {groups.nodes_per_group} node(s) need exactly "
               f"{total} (each node runs one group's share; a group's lost node is replaced, not shrunk)"),
               f"set nodes: {total}")
    if spec.rendezvous.hosted:
        yield ((("replica_groups",), ("rendezvous", "hosted")),
               ("replica groups on several nodes need an etcd that outlives any one node (the hosted one does not, "
                "whatever rendezvous.hosted_members says: the groups' seats do not grow its members)"),
               "run etcd outside the job and set rendezvous.hosted: false (docs/replica_groups.md#several-nodes)")


CHECKS: tuple[Check, ...] = (
    _nodes, _entrypoint, _backoff, _security, _hosted, _positive, _health, _os_limits, _replica_groups,
)
DOC_CHECKS: tuple[DocCheck, ...] = (_watchdog_off, _etcd_only, _metrics_off, _health_unasked, timeout_order)


def semantic_problems(spec: JobSpec, doc: Document) -> list[SpecProblem]:
    """Every cross-field problem, located in `doc`."""
    found = [item for check in CHECKS for item in check(spec)]
    found += [item for doc_check in DOC_CHECKS for item in doc_check(spec, doc)]
    return [doc.problem(_pick(where, doc), message, fix) for where, message, fix in found]


def _set(doc: Document, section: str, value: object, default: object, keys: tuple[str, ...]) -> list[str]:
    """The `keys` of `section` written in the spec with a value other than their default.

    `value` is the built section, `default` the section's dataclass default: a default written out changes nothing
    and may stay.
    """
    return [key for key in keys
            if _written(doc, (section, key)) and getattr(value, key) != getattr(default, key)]


def _written(doc: Document, path: Path) -> bool:
    """Whether the data holds the mapping key at `path` (written, or brought by a merge key), not a default.

    The data, not doc.values: salvage checks a copy of the data with the wrong parts dropped (salvage.py).
    """
    value: JSON = doc.data
    for part in path:
        if not isinstance(value, dict) or part not in value:
            return False
        value = value[part]
    return True


def _pick(where: Path | tuple[Path, ...], doc: Document) -> Path:
    """A path, or the first of several candidates that the user wrote (else the first)."""
    if not where or not isinstance(where[0], tuple):
        return cast("Path", where)
    candidates: tuple[Path, ...] = where
    return next((path for path in candidates if path in doc.values), candidates[0])
