"""runner/config/checks.py: the cross-field refusals, as mutation testing found them untested (docs/testing.md).

Each refusal is pinned whole: the field it is located at, its message and its fix, as `validate` prints them; beside
it, the spec that just passes the same rule (the boundary) loads. A mutant that changed a word, a path or a bound
passed every other unit test.
"""

from __future__ import annotations

import dataclasses
import operator

import pytest

from runner.config import load_spec_text
from runner.config.checks import semantic_problems
from runner.config.limits import MAX_ARG_BYTES, MAX_WORLD_SIZE
from runner.config.loader import load_document
from runner.config.spec import JobSpec, Nodes
from runner.errors import SpecError

HEAD = "name: job\nentrypoint: train.py\n"
ETCD = "rendezvous: {backend: etcd}\n"

Refusal = tuple[str, str, str]  # path, message, fix


def refusals(text: str) -> list[Refusal]:
    """(path, message, fix) of every problem load_spec_text reports for `text` (fails the test if it loads)."""
    with pytest.raises(SpecError) as caught:
        load_spec_text(text, source="job.yaml", environ={})
    return [(p.path, p.message, p.fix) for p in caught.value.problems]


def loaded(text: str) -> JobSpec:
    return load_spec_text(text, source="job.yaml", environ={})


def accepts(body: str, field: str, value: object) -> None:
    """`HEAD + body` loads, and `field` (dotted) of the spec reads `value`."""
    assert operator.attrgetter(field)(loaded(HEAD + body)) == value


# -- nodes, entrypoint, restart --------------------------------------------------------------------------------------

LOCAL_FIX = "set rendezvous.backend: etcd (and rendezvous.endpoints), or nodes: 1"


@pytest.mark.parametrize(("body", "expected"), [
    pytest.param("nodes: 3:2\n", [
        ("nodes", "nodes.min (3) is greater than nodes.max (2)", "swap them: MIN:MAX"),
        ("nodes", "backend 'local' runs one node only, but nodes.max is 2", LOCAL_FIX)], id="min-over-max"),
    pytest.param("nodes: {min: 1, max: 2}\n", [
        ("nodes", "backend 'local' runs one node only, but nodes.max is 2", LOCAL_FIX)], id="local-two-nodes"),
    pytest.param("rendezvous: {backend: local}\nnodes: {min: 1, max: 2}\n", [
        ("rendezvous.backend", "backend 'local' runs one node only, but nodes.max is 2", LOCAL_FIX)],
        id="local-written-is-named-first"),
])
def test_nodes_refusals_name_the_field_and_the_fix(body: str, expected: list[Refusal]) -> None:
    """Nodes the backend cannot run: located at the backend when the user wrote it (it is the likelier mistake),
    else at nodes."""
    assert refusals(HEAD + body) == expected


@pytest.mark.parametrize(("body", "field", "value"), [
    ("nodes: 2:2\n" + ETCD, "nodes", Nodes(2, 2)),
    ("nodes: 1\nrendezvous: {backend: local}\n", "nodes", Nodes(1, 1)),
])
def test_nodes_at_the_bounds_load(body: str, field: str, value: object) -> None:
    accepts(body, field, value)


def test_a_spec_built_with_no_node_is_refused() -> None:
    """nodes.min 0 (the schema refuses it in a file; a spec built in code reaches the check): a job needs a node."""
    spec, doc = load_document(HEAD)
    found = semantic_problems(dataclasses.replace(spec, nodes=Nodes(min=0, max=1)), doc)
    assert [(p.path, p.message, p.fix) for p in found] == [
        ("nodes", "nodes.min must be >= 1, found 0", "a job needs at least one node")]


def test_python_beside_a_command_is_refused() -> None:
    """The interpreter applies to a script or module only: beside a command it is refused at entrypoint.python."""
    assert refusals("name: job\nentrypoint: {command: [./run.sh], python: python3.11}\n") == [
        ("entrypoint.python", "python applies to script and module only",
         "put the interpreter in command itself, or remove python")]
    spec = loaded("name: job\nentrypoint: {script: train.py, python: python3.11}\n")
    assert spec.entrypoint.python == "python3.11"


@pytest.mark.parametrize(("body", "expected"), [
    pytest.param("restart: {backoff: {initial: 5s, max: 4s}}\n", [
        ("restart.backoff.initial", "backoff.initial (5 s) is greater than backoff.max (4 s)",
         "lower initial or raise max")], id="initial-over-max"),
    pytest.param("restart: {crash_loop: 1}\n", [
        ("restart.crash_loop", "crash_loop: 1 would call any first exception a crash loop",
         "use 2 or more (0 = off); restart.budgets.exception: 0 stops at the first exception")], id="crash-loop-1"),
    pytest.param("restart: {non_retryable_exit_codes: [3, 0]}\n", [
        ("restart.non_retryable_exit_codes", "exit code 0 means success, it cannot be a failure", "remove 0")],
        id="exit-code-0"),
])
def test_restart_refusals_name_the_field_and_the_fix(body: str, expected: list[Refusal]) -> None:
    assert refusals(HEAD + body) == expected


@pytest.mark.parametrize(("body", "field", "value"), [
    ("restart: {backoff: {initial: 4s, max: 4s}}\n", "restart.backoff.initial", 4.0),
    ("restart: {crash_loop: 2}\n", "restart.crash_loop", 2),
    ("restart: {crash_loop: 0}\n", "restart.crash_loop", 0),
    ("restart: {non_retryable_exit_codes: [1, 2]}\n", "restart.non_retryable_exit_codes", (1, 2)),
])
def test_restart_values_at_the_bounds_load(body: str, field: str, value: object) -> None:
    accepts(body, field, value)


# -- rendezvous security and the hosted etcd -------------------------------------------------------------------------

NO_USER = ("rendezvous.auth", "a password is given but no user", "add auth.user")


@pytest.mark.parametrize(("rendezvous", "expected"), [
    pytest.param("tls: {cert: c.pem}", [
        ("rendezvous.tls", "tls.cert and tls.key go together (a client certificate needs its key)",
         "set both, or neither")], id="cert-without-key"),
    pytest.param("tls: {key: k.pem}", [
        ("rendezvous.tls", "tls.cert and tls.key go together (a client certificate needs its key)",
         "set both, or neither")], id="key-without-cert"),
    pytest.param("auth: {password_env: PW}", [NO_USER], id="password-env-without-user"),
    pytest.param("auth: {password_file: pw.txt}", [NO_USER], id="password-file-without-user"),
    pytest.param("auth: {user: u, password_env: PW, password_file: pw.txt}", [
        ("rendezvous.auth", "password_env and password_file are both set", "keep one of them")], id="two-passwords"),
])
def test_security_refusals_name_the_field_and_the_fix(rendezvous: str, expected: list[Refusal]) -> None:
    assert refusals(HEAD + f"rendezvous: {{backend: etcd, {rendezvous}}}\n") == expected


def test_a_user_with_one_password_loads() -> None:
    spec = loaded(HEAD + "rendezvous: {backend: etcd, auth: {user: u, password_env: PW}, tls: {cert: c, key: k}}\n")
    assert (spec.rendezvous.auth.user, spec.rendezvous.auth.password_env) == ("u", "PW")
    assert spec.rendezvous.tls.key is not None and spec.rendezvous.tls.key.endswith("k")


HOSTED = "rendezvous: {backend: etcd, hosted: true"  # + the rest of the mapping, then "}\n"
MEMBERS_FIX = ("write the hosting node's host:port first, then the hosts of the next members, e.g. "
               "['node0:29400', 'node1:29400', 'node2:29400']")
UNREACHABLE_FIX = "write the hosting node's own address, e.g. 10.0.0.5:29400"
SECRET_WHY = "the hosted etcd's TLS and authentication come from the job's secret, but rendezvous.tls or auth is set"
SECRET_FIX = ("remove rendezvous.tls and rendezvous.auth (give rendezvous.secret_file), or start your own etcd "
              "(hosted: false)")


@pytest.mark.parametrize(("body", "expected"), [
    pytest.param("rendezvous: {backend: etcd, secret_file: job.secret}\n", [(
        "rendezvous.secret_file",
        "secret_file applies to a hosted rendezvous (hosted: true): an etcd you run has its own TLS and users",
        "remove it, and set rendezvous.tls and rendezvous.auth for your etcd; or set hosted: true")],
        id="secret-file-unhosted"),
    pytest.param("rendezvous: {backend: etcd, hosted_members: 1}\n", [(
        "rendezvous.hosted_members",
        "does nothing without hosted: true (an etcd you run has the members you gave it)",
        "remove rendezvous.hosted_members, or set rendezvous.hosted: true")], id="members-unhosted"),
    pytest.param("rendezvous: {hosted: true}\n", [
        ("rendezvous.hosted", "hosted applies to backend etcd", "set rendezvous.backend: etcd")], id="local-hosted"),
    pytest.param(HOSTED + ", hosted_members: 1, endpoints: [a:29400, b:29400]}\n", [(
        "rendezvous.endpoints", "a hosted rendezvous has at most rendezvous.hosted_members (1) endpoints, found 2",
        MEMBERS_FIX)], id="two-endpoints-one-member"),
    pytest.param(HOSTED + ", hosted_members: 3, endpoints: [a:1, b:1, c:1, d:1]}\n", [(
        "rendezvous.endpoints", "a hosted rendezvous has at most rendezvous.hosted_members (3) endpoints, found 4",
        MEMBERS_FIX)], id="four-endpoints-three-members"),
    pytest.param(HOSTED + ", endpoints: ['0.0.0.0:29400']}\n", [
        ("rendezvous.endpoints", "'0.0.0.0:29400' is no address the other nodes can reach", UNREACHABLE_FIX)],
        id="any-ipv4"),
    pytest.param(HOSTED + ", endpoints: ['[::]:29400']}\n", [
        ("rendezvous.endpoints", "'[::]:29400' is no address the other nodes can reach", UNREACHABLE_FIX)],
        id="any-ipv6"),
    pytest.param(HOSTED + ", hosted_members: 3, endpoints: [a:29400, b:29401]}\n", [(
        "rendezvous.endpoints",
        "the hosted etcd's members all serve on one port, but the endpoints name several: ('a:29400', 'b:29401')",
        "write the same port on every endpoint")], id="two-ports"),
    pytest.param(HOSTED + ", tls: {ca: ca.pem}}\n", [("rendezvous.hosted", SECRET_WHY, SECRET_FIX)], id="tls-ca"),
    pytest.param(HOSTED + ", tls: {cert: c.pem, key: k.pem}}\n", [("rendezvous.hosted", SECRET_WHY, SECRET_FIX)],
                 id="tls-cert"),
    pytest.param(HOSTED + ", auth: {user: u}}\n", [("rendezvous.hosted", SECRET_WHY, SECRET_FIX)], id="auth-user"),
])
def test_hosted_refusals_name_the_field_and_the_fix(body: str, expected: list[Refusal]) -> None:
    assert refusals(HEAD + body) == expected


@pytest.mark.parametrize(("rest", "endpoints"), [
    pytest.param(", secret_file: job.secret", ("127.0.0.1:2379",), id="secret-file"),
    pytest.param(", hosted_members: 3, endpoints: [a:29400, b:29400, c:29400]", ("a:29400", "b:29400", "c:29400"),
                 id="as-many-endpoints-as-members"),
    pytest.param(", endpoints: ['[::1]:29400']", ("[::1]:29400",), id="ipv6-loopback"),
    pytest.param(", endpoints: ['10.0.0.5:29400']", ("10.0.0.5:29400",), id="ipv4"),
    pytest.param(", endpoints: ['X:29400']", ("X:29400",), id="one-letter-host"),
])
def test_hosted_endpoints_the_other_nodes_can_reach_load(rest: str, endpoints: tuple[str, ...]) -> None:
    spec = loaded(HEAD + HOSTED + rest + "}\n")
    assert (spec.rendezvous.hosted, spec.rendezvous.endpoints) == (True, endpoints)


@pytest.mark.parametrize("endpoint", ["[::0]:29400", "[0:0:0:0:0:0:0:0]:29400", "0:29400", "[::ffff:0.0.0.0]:29400"])
def test_every_spelling_of_every_interface_is_refused_as_a_hosted_endpoint(endpoint: str) -> None:
    """Not only 0.0.0.0 and [::]: any address that means "every interface" (before, [::0] and 0 loaded) is no
    address another node can reach."""
    assert refusals(HEAD + HOSTED + f", endpoints: ['{endpoint}']}}\n") == [
        ("rendezvous.endpoints", f"'{endpoint}' is no address the other nodes can reach", UNREACHABLE_FIX)]


def test_a_hosted_endpoint_built_with_no_host_is_refused() -> None:
    """An endpoint with an empty host (the schema refuses it in a file; a spec built in code reaches the check)."""
    spec, doc = load_document(HEAD + HOSTED + "}\n")
    built = dataclasses.replace(spec, rendezvous=dataclasses.replace(spec.rendezvous, endpoints=(":29400",)))
    assert [(p.path, p.message, p.fix) for p in semantic_problems(built, doc)] == [
        ("rendezvous.endpoints", "':29400' is no address the other nodes can reach", UNREACHABLE_FIX)]


def test_an_unhosted_etcd_with_the_default_members_loads() -> None:
    spec = loaded(HEAD + "rendezvous: {backend: etcd, hosted_members: 3}\n")
    assert (spec.rendezvous.hosted, spec.rendezvous.hosted_members) == (False, 3)


# -- positive durations ----------------------------------------------------------------------------------------------

POSITIVE_FIX = "use a positive duration such as 30s"


@pytest.mark.parametrize(("body", "path"), [
    ("rendezvous: {backend: etcd, join_timeout: 0}\n", "rendezvous.join_timeout"),
    ("rendezvous: {backend: etcd, connect_timeout: 0s}\n", "rendezvous.connect_timeout"),
    ("shutdown: {grace_period: 0}\n", "shutdown.grace_period"),
    ("watchdog: {enabled: true, check_interval: 0}\n", "watchdog.check_interval"),
    ("watchdog: {heartbeat_timeout: 0}\n", "watchdog.heartbeat_timeout"),
    ("watchdog: {enabled: true, progress_timeout: 0}\n", "watchdog.progress_timeout"),
    ("watchdog: {stall_timeout: 0}\n", "watchdog.stall_timeout"),
    ("watchdog: {max_run_time: 0}\n", "watchdog.max_run_time"),
])
def test_a_zero_duration_is_refused_at_its_field(body: str, path: str) -> None:
    assert refusals(HEAD + body) == [(path, "must be greater than 0, found 0", POSITIVE_FIX)]


@pytest.mark.parametrize(("body", "expected"), [
    pytest.param("rendezvous: {backend: etcd, status_interval: 0.5}\n", [(
        "rendezvous.status_interval", "must be at least 1 s, found 0.5",
        "use 1s or more (one etcd put per node per interval), or null to publish on changes only")],
        id="status-interval"),
    pytest.param("rendezvous: {backend: etcd, lease_ttl: 0.5}\n", [(
        "rendezvous.lease_ttl", "must be at least 1 s, found 0.5", "etcd leases count whole seconds; use 1s or more")],
        id="lease-ttl"),
])
def test_a_rendezvous_interval_under_a_second_is_refused(body: str, expected: list[Refusal]) -> None:
    assert refusals(HEAD + body) == expected


@pytest.mark.parametrize(("body", "field", "value"), [
    ("rendezvous: {backend: etcd, status_interval: 1}\n", "rendezvous.status_interval", 1.0),
    ("rendezvous: {backend: etcd, status_interval: null}\n", "rendezvous.status_interval", None),
    ("rendezvous: {backend: etcd, lease_ttl: 1}\n", "rendezvous.lease_ttl", 1.0),
    ("rendezvous: {backend: etcd, join_timeout: 0.001}\n", "rendezvous.join_timeout", 0.001),
    ("rendezvous: {backend: etcd, connect_timeout: 0.5}\n", "rendezvous.connect_timeout", 0.5),
    ("watchdog: {max_run_time: 0.5}\n", "watchdog.max_run_time", 0.5),
])
def test_durations_at_the_bounds_load(body: str, field: str, value: object) -> None:
    accepts(body, field, value)


# -- health ----------------------------------------------------------------------------------------------------------

HEALTH_FIX = "use a positive duration such as 10s"
COMMAND_FIX = "lower the command's timeout or raise health.timeout"


@pytest.mark.parametrize(("body", "expected"), [
    pytest.param("health: {gpus: 1, timeout: 0}\n", [
        ("health.timeout", "must be greater than 0, found 0", HEALTH_FIX)], id="timeout"),
    pytest.param("health: {gpus: 1, retry_interval: 0}\n", [
        ("health.retry_interval", "must be greater than 0, found 0", HEALTH_FIX)], id="retry-interval"),
    pytest.param("health: {gpus: 1, max_failures: 1, failure_window: 0}\n", [
        ("health.failure_window", "must be greater than 0, found 0", HEALTH_FIX)], id="failure-window"),
    pytest.param("health: {gpus: 1, failure_window: 1h}\n", [(
        "health.failure_window", "does nothing while health.max_failures is 0 (the node ledger keeps no node out)",
        "remove health.failure_window, or set health.max_failures")], id="window-without-ledger"),
    pytest.param("health: {commands: [{run: 'true', timeout: 0}]}\n", [
        ("health.commands[0]", "timeout must be greater than 0, found 0", "use a duration such as 30s")],
        id="command-timeout-zero"),
    pytest.param("health: {commands: [{run: 'true', timeout: 0.5}, {run: 'false', timeout: 61}]}\n", [(
        "health.commands[1]",
        "its timeout (61 s) is longer than health.timeout (60 s), which stops every check of a try", COMMAND_FIX)],
        id="second-command-over-the-try"),
    pytest.param("health: {timeout: 0.5, commands: [{run: 'true', timeout: 1}]}\n", [(
        "health.commands[0]",
        "its timeout (1 s) is longer than health.timeout (0.5 s), which stops every check of a try", COMMAND_FIX)],
        id="command-over-a-short-try"),
    pytest.param("health: {timeout: 0, commands: [{run: 'true', timeout: 5}]}\n", [
        ("health.timeout", "must be greater than 0, found 0", HEALTH_FIX)], id="zero-try-is-the-only-problem"),
])
def test_health_refusals_name_the_field_and_the_fix(body: str, expected: list[Refusal]) -> None:
    assert refusals(HEAD + body) == expected


@pytest.mark.parametrize(("body", "field", "value"), [
    ("health: {gpus: 1, timeout: 0.5, retry_interval: 0.5}\n", "health.retry_interval", 0.5),
    ("health: {gpus: 1, failure_window: 1d}\n", "health.failure_window", 86400.0),
    ("health: {gpus: 1, max_failures: 2, failure_window: 1h}\n", "health.failure_window", 3600.0),
])
def test_health_values_at_the_bounds_load(body: str, field: str, value: object) -> None:
    accepts(body, field, value)


@pytest.mark.parametrize(("timeout", "seconds"), [("60s", 60.0), ("0.5", 0.5)])
def test_a_command_timeout_up_to_the_try_loads(timeout: str, seconds: float) -> None:
    """A command may take as long as health.timeout (60 s by default), and any positive time under it."""
    spec = loaded(HEAD + f"health: {{commands: [{{run: 'true', timeout: {timeout}}}]}}\n")
    assert spec.health.commands[0].timeout == seconds


UNASKED_FIX = "ask for a check (health.min_free, min_free_memory, gpus, commands), or remove health.{}"


@pytest.mark.parametrize(("body", "expected"), [
    *[pytest.param(f"health: {{{key}: 5s}}\n", [(
        f"health.{key}", "does nothing while no health check is asked for (nothing is checked)",
        UNASKED_FIX.format(key))], id=key) for key in ("timeout", "retry_interval", "give_up_after")],
    pytest.param("health: {paths: [{path: /data}]}\n", [(
        "health.paths", "no path has a min_free and health.min_free is 0: nothing is checked in them",
        "set health.min_free, or a min_free on each path")], id="paths"),
])
def test_how_checks_run_with_none_asked_for_is_refused(body: str, expected: list[Refusal]) -> None:
    assert refusals(HEAD + body) == expected


# -- switches left off: watchdog, metrics, the local backend ---------------------------------------------------------


@pytest.mark.parametrize(("field", "value", "why"), [
    ("heartbeat_timeout", "5s", "no worker would ever be found hung"),
    ("progress_timeout", "5s", "no stalled step would ever be found"),
    ("check_interval", "1s", "it paces the watchdog's file timer"),
    ("capture_stacks", "false", "it applies when the watchdog kills a hung worker"),
    ("keep_out_culprit", "false", "it applies to a hang the watchdog found"),
])
def test_a_watchdog_field_beside_enabled_false_is_refused(field: str, value: str, why: str) -> None:
    """With the stall watchdog off too (stall_timeout: null), nothing reads these fields."""
    assert refusals(HEAD + f"watchdog: {{enabled: false, stall_timeout: null, {field}: {value}}}\n") == [(
        f"watchdog.{field}", f"does nothing while watchdog.enabled is false ({why})",
        f"remove watchdog.{field}, or set watchdog.enabled: true")]


@pytest.mark.parametrize("field", ["capture_stacks", "keep_out_culprit"])
def test_what_the_stall_watchdog_reads_loads_beside_enabled_false(field: str) -> None:
    """The stall watchdog (on by default) applies capture_stacks and keep_out_culprit to the stalls it finds."""
    spec = loaded(HEAD + f"watchdog: {{enabled: false, {field}: false}}\n")
    assert getattr(spec.watchdog, field) is False and spec.watchdog.stall_timeout == 300.0


@pytest.mark.parametrize(("field", "value"), [("host", "0.0.0.0"), ("port", "9100")])
def test_a_metrics_field_with_metrics_off_is_refused(field: str, value: str) -> None:
    assert refusals(HEAD + f"metrics: {{{field}: {value}}}\n") == [(
        f"metrics.{field}", "does nothing while metrics.enabled is false (no endpoint is served)",
        f"set metrics.enabled: true to serve /metrics, or remove metrics.{field}")]


@pytest.mark.parametrize(("field", "value"), [("prefix", "/team"), ("lease_ttl", "5s")])
def test_an_etcd_field_with_the_local_backend_is_refused(field: str, value: str) -> None:
    assert refusals(HEAD + f"rendezvous: {{{field}: {value}}}\n") == [(
        f"rendezvous.{field}", "does nothing with backend local (one node, no rendezvous store to reach)",
        f"remove rendezvous.{field}, or set rendezvous.backend: etcd for a job of several nodes")]


# -- OS limits -------------------------------------------------------------------------------------------------------

ENV_WHY = "{}=... is {} bytes; execve refuses an environment string of 131072 bytes or more (Linux MAX_ARG_STRLEN)"


@pytest.mark.parametrize(("body", "expected"), [
    pytest.param(ETCD + "nodes: 1:2147483648\n", [(
        "nproc_per_node",
        ("nodes.max x nproc_per_node is 2147483648 workers; torch.distributed counts ranks in a C int "
         "(at most 2147483647)"), "lower nodes.max or nproc_per_node")], id="one-past-a-c-int"),
    pytest.param(ETCD + "nodes: 1:1048576\nnproc_per_node: 4096\n", [(
        "nproc_per_node",
        ("nodes.max x nproc_per_node is 4294967296 workers; torch.distributed counts ranks in a C int "
         "(at most 2147483647)"), "lower nodes.max or nproc_per_node")], id="nodes-times-workers"),
    pytest.param("env: {K: " + "v" * (MAX_ARG_BYTES - 2) + "}\n", [
        ("env.K", ENV_WHY.format("K", MAX_ARG_BYTES), "shorten the value or pass a file path")], id="env-at-the-limit"),
    pytest.param("env: {KEY: " + "é" * 65535 + "}\n", [
        ("env.KEY", ENV_WHY.format("KEY", MAX_ARG_BYTES + 2), "shorten the value or pass a file path")],
        id="env-counted-in-utf8-bytes"),
])
def test_os_limit_refusals_name_the_field_and_the_size(body: str, expected: list[Refusal]) -> None:
    assert refusals(HEAD + body) == expected


def test_a_world_of_a_c_int_loads() -> None:
    assert loaded(HEAD + ETCD + "nodes: 1:2147483647\n").nodes.max == MAX_WORLD_SIZE
    assert loaded(HEAD + ETCD + "nodes: 1:1048575\nnproc_per_node: 2048\n").nproc_per_node == 2048


def test_an_env_string_one_byte_short_of_the_limit_loads() -> None:
    value = "v" * (MAX_ARG_BYTES - 3)  # K=value and its NUL: MAX_ARG_BYTES - 1 bytes
    assert loaded(HEAD + f"env: {{K: {value}}}\n").env == (("K", value),)


# -- replica groups --------------------------------------------------------------------------------------------------

LOCAL_GROUPS_FIX = "set rendezvous.backend: etcd (docs/replica_groups.md#several-nodes), or nodes_per_group: 1"
SHARE = "(each node runs one group's share; a group's lost node is replaced, not shrunk)"


@pytest.mark.parametrize(("body", "expected"), [
    pytest.param("replica_groups: {count: 2, min_active: 3}\n", [(
        "replica_groups.min_active", "min_active (3) is greater than count (2): no step could ever be taken",
        "set min_active to at most 2")], id="min-active-over-count"),
    pytest.param("replica_groups: {count: 2, lighthouse: {address: 'http://h:29510'}}\n", [(
        "replica_groups.lighthouse.address", "a hosted lighthouse has no address to give",
        "remove address, or set hosted: false to use the lighthouse at that address")], id="hosted-with-address"),
    pytest.param("replica_groups: {count: 2, lighthouse: {hosted: false}}\n", [(
        "replica_groups.lighthouse", "hosted: false needs the address of a running lighthouse",
        "set lighthouse.address: http://HOST:PORT, or hosted: true")], id="unhosted-without-address"),
    pytest.param("replica_groups: {count: 2, nodes_per_group: 2}\n", [(
        "replica_groups.nodes_per_group", "groups spanning several nodes need rendezvous.backend etcd",
        LOCAL_GROUPS_FIX)], id="local-several-nodes"),
    pytest.param(ETCD + "nodes: 3\nreplica_groups: {count: 2, nodes_per_group: 2}\n", [(
        "nodes", f"nodes is 3, but 2 group(s) of 2 node(s) need exactly 4 {SHARE}", "set nodes: 4")],
        id="too-few-nodes"),
    pytest.param(ETCD + "nodes: 4:5\nreplica_groups: {count: 2, nodes_per_group: 2}\n", [(
        "nodes", f"nodes is 4:5, but 2 group(s) of 2 node(s) need exactly 4 {SHARE}", "set nodes: 4")],
        id="max-over"),
    pytest.param(ETCD + "nodes: 3:4\nreplica_groups: {count: 2, nodes_per_group: 2}\n", [(
        "nodes", f"nodes is 3:4, but 2 group(s) of 2 node(s) need exactly 4 {SHARE}", "set nodes: 4")],
        id="min-under"),
    pytest.param(ETCD + "replica_groups: {count: 2}\n", [(
        "nodes", f"nodes is 1, but 2 group(s) of 1 node(s) need exactly 2 {SHARE}", "set nodes: 2")],
        id="nodes-left-out-is-named"),
    pytest.param(ETCD + "replica_groups: {count: 3, nodes_per_group: 2}\n", [(
        "replica_groups.nodes_per_group", f"nodes is 1, but 3 group(s) of 2 node(s) need exactly 6 {SHARE}",
        "set nodes: 6")], id="nodes-per-group-written-is-named"),
])
def test_replica_group_refusals_name_the_field_and_the_fix(body: str, expected: list[Refusal]) -> None:
    assert refusals(HEAD + body) == expected


@pytest.mark.parametrize(("body", "field", "value"), [
    ("replica_groups: {count: 2, min_active: 2}\n", "replica_groups.min_active", 2),
    ("replica_groups: {count: 2, lighthouse: {hosted: false, address: 'http://h:29510'}}\n",
     "replica_groups.lighthouse.address", "http://h:29510"),
    ("replica_groups: {count: 2, nodes_per_group: 1}\n", "replica_groups.nodes_per_group", 1),
    (ETCD + "nodes: 4\nreplica_groups: {count: 2, nodes_per_group: 2}\n", "nodes", Nodes(4, 4)),
    (ETCD + "nodes: 2\nreplica_groups: {count: 2}\n", "nodes", Nodes(2, 2)),
])
def test_replica_groups_at_the_bounds_load(body: str, field: str, value: object) -> None:
    accepts(body, field, value)


HOSTED_GROUPS = "rendezvous: {{backend: etcd, hosted: true{}}}\nnodes: {}\nreplica_groups: {{count: {}}}\n"


@pytest.mark.parametrize(("members", "nodes"), [
    pytest.param("", 2, id="one-member"),
    pytest.param(", hosted_members: 3", 3, id="three-members"),
])
def test_replica_groups_on_several_nodes_refuse_the_hosted_etcd(members: str, nodes: int) -> None:
    """Groups over several nodes need an etcd that outlives any one node: the hosted one is refused, whatever its
    members, and the fix is an etcd of one's own."""
    [(path, message, fix)] = refusals(HEAD + HOSTED_GROUPS.format(members, nodes, nodes))
    assert path == "replica_groups"
    assert message == ("replica groups on several nodes need an etcd that outlives any one node (the hosted one does "
                       "not, whatever rendezvous.hosted_members says: the groups' seats do not grow its members)")
    assert fix == "run etcd outside the job and set rendezvous.hosted: false (docs/replica_groups.md#several-nodes)"


def test_a_refusal_is_located_at_the_first_of_its_fields_the_document_holds() -> None:
    """A spec whose replica groups its document does not hold (one assembled by a caller): the hosted-etcd refusal
    falls to the next field it names, rendezvous.hosted, which the document holds."""
    spec, _ = load_document(HEAD + ETCD + "nodes: 2\nreplica_groups: {count: 2}\n")
    _, doc = load_document(HEAD + "rendezvous: {backend: etcd, hosted: true}\n")
    hosted = dataclasses.replace(spec, rendezvous=dataclasses.replace(spec.rendezvous, hosted=True))
    assert [p.path for p in semantic_problems(hosted, doc)] == ["rendezvous.hosted"]
