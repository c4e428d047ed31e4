"""runner/config/build.py: spec data -> JobSpec, as mutation testing found it untested (docs/testing.md).

Three kinds of test: a spec that writes every field (each one unlike its default) read back field by field, so a
key the builder misspells or drops shows; the defaults of what a spec leaves out; and each refusal the builder makes
itself, pinned whole (the field it is located at, its message, its fix). The refusals behind the value rules (an
infinite duration, a size past 64 bits) are asked of the Builder directly, as `salvage` does.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Mapping
from typing import Any

import pytest

from runner.config import build
from runner.config.build import UNHANDLEABLE, Builder
from runner.config.limits import MAX_PREFIX_WIDTH
from runner.config.loader import load_document
from runner.config.sizes import HINT as SIZE_HINT
from runner.config.spec import (
    TLS,
    Auth,
    Backoff,
    Budgets,
    ClassBudget,
    Entrypoint,
    HealthCommand,
    HealthPath,
    JobSpec,
    Kubernetes,
    Lighthouse,
    Nodes,
    Rendezvous,
    ReplicaGroups,
    Slurm,
)
from runner.config.yaml_source import parse_yaml
from runner.errors import SpecError

HEAD = "name: job\nentrypoint: train.py\n"
BASE = "/base"
HOME = os.path.expanduser("~")  # what `~/` in a spec path stands for
FIELDS = "{node}, {rank}, {local_rank}, {attempt}"

Refusal = tuple[str, str, str]  # path, message, fix


def loaded(text: str, **kwargs: Any) -> JobSpec:
    """`text` loaded as `job.yaml` in /base, with no environment."""
    return load_document(text, source="job.yaml", base_dir=BASE, environ={}, **kwargs)[0]


def refusals(text: str, **kwargs: Any) -> list[Refusal]:
    """(path, message, fix) of every problem loading `text` reports (fails the test if it loads)."""
    with pytest.raises(SpecError) as caught:
        load_document(text, source="job.yaml", base_dir=BASE, environ={}, **kwargs)
    return [(p.path, p.message, p.fix) for p in caught.value.problems]


def built(text: str, **kwargs: Any) -> tuple[JobSpec, list[Refusal]]:
    """The Builder alone on `text` (no value rules, no schema before it): its spec and its own problems."""
    doc, problems = parse_yaml(text)
    assert problems == []
    builder = Builder(doc, BASE, **kwargs)
    spec = builder.build()
    return spec, [(p.path, p.message, p.fix) for p in builder.problems]


# -- a spec with every field ------------------------------------------------------------------------------------------

EVERY_FIELD = """\
version: 1
name: every-field
entrypoint:
  module: pkg.train
  args: [--lr, "0.1"]
  python: venv/bin/python
env: {A: "x", N: 0x10, F: 1.0, B: yes, T: true, I: 7}
cwd: work
nodes: {min: 2, max: 6}
nproc_per_node: 3
role: trainer
virtual_local_rank: true
rendezvous:
  backend: etcd
  endpoints: [" 10.0.0.1:2379", "10.0.0.2:2380 "]
  prefix: /jobs/
  join_timeout: 11m
  last_call: 44s
  lease_ttl: 16s
  connect_timeout: 1m31s
  status_interval: 7s
  master_addr: 10.0.0.9
  master_port: 29501
  tls: {ca: certs/ca.pem, cert: certs/c.pem, key: ~/k.pem}
  auth: {user: bob, password_file: pw.txt}
restart:
  max_restarts: 7
  backoff: {initial: 250ms, max: 2m, multiplier: 1.5, jitter: 0.3}
  non_retryable_exit_codes: [4, 3, 4]
  scope: worker
  standby: false
  preload: [numpy, torch, numpy]
  standby_max_memory_mb: 512
  budgets: {oom: 2, hang: {max: 5, charged: false}, node_lost: {max: 1}, preempted: {charged: true}, infra: null}
  crash_loop: 9
shutdown:
  signal: 2
  grace_period: 12s
  signals_to_handle: [term, SIGUSR1, 1, SIGTERM]
logs:
  dir: out/logs
  tee: false
  console_streams: "00:stdout,1:none,other:stderr"
  console_local_ranks: [2, 0, 2]
  prefix: "<{rank:>3}|{local_rank}|{attempt}|{node}> "
  format: json
watchdog:
  enabled: true
  check_interval: 300ms
  capture_stacks: false
  heartbeat_timeout: 4m
  progress_timeout: 6m
  stall_timeout: 9m
  max_run_time: 3h
  flight_recorder: 77
  keep_out_culprit: false
health:
  min_free: 2GiB
  paths: [data, {path: ~/ckpt, min_free: 3MiB}, {path: /abs}]
  min_free_memory: 5MB
  gpus: 2
  commands: ["true", {run: "nvidia-smi -L", timeout: 7s}, {run: "x"}]
  timeout: 45s
  retry_interval: 3s
  give_up_after: 9m
  max_failures: 4
  failure_window: 2h
metrics: {enabled: true, host: 0.0.0.0, port: 9400}
cluster:
  etcd: start
  etcd_port: 2390
  gpus_per_node: 8
  slurm:
    partition: gpu
    account: acct
    time_limit: 2h
    signal_lead: 5m
    requeue: false
    cpus_per_node: 32
    sbatch_args: [--exclusive, --qos=high]
    etcd_command: /opt/etcd
  kubernetes:
    image: img:1
    namespace: ns
    workdir: /w
    cpu: "4"
    memory: 16Gi
    etcd_image: etcd:2
    service_account: sa
"""

HOSTED = """\
name: hosted
entrypoint: {command: "prog 'a b' c"}
nodes: 6
rendezvous:
  backend: etcd
  hosted: true
  hosted_members: 3
  endpoints: "n0:2379"
  prefix: "///"
  status_interval: null
  secret_file: sec/job.secret
watchdog: {progress_timeout: 1m, stall_timeout: null}
health: {give_up_after: null, min_free: 1000, paths: [{path: d, min_free: 10}]}
"""


def every_field() -> JobSpec:
    """EVERY_FIELD loaded (anew each time: a cached spec would hide a change to the builder)."""
    return loaded(EVERY_FIELD)


@pytest.mark.parametrize(("field", "value"), [
    ("name", "every-field"),
    ("version", 1),
    ("entrypoint", Entrypoint(module="pkg.train", args=("--lr", "0.1"), python="venv/bin/python")),
    ("env", (("A", "x"), ("N", "0x10"), ("F", "1.0"), ("B", "yes"), ("T", "true"), ("I", "7"))),
    ("cwd", "/base/work"),
    ("nodes", Nodes(2, 6)),
    ("nproc_per_node", 3),
    ("role", "trainer"),
    ("virtual_local_rank", True),
    ("rendezvous.backend", "etcd"),
    ("rendezvous.endpoints", ("10.0.0.1:2379", "10.0.0.2:2380")),
    ("rendezvous.hosted", False),
    ("rendezvous.prefix", "/jobs"),
    ("rendezvous.join_timeout", 660.0),
    ("rendezvous.last_call", 44.0),
    ("rendezvous.lease_ttl", 16.0),
    ("rendezvous.connect_timeout", 91.0),
    ("rendezvous.status_interval", 7.0),
    ("rendezvous.master_addr", "10.0.0.9"),
    ("rendezvous.master_port", 29501),
    ("rendezvous.tls", TLS(ca="/base/certs/ca.pem", cert="/base/certs/c.pem", key=f"{HOME}/k.pem")),
    ("rendezvous.auth", Auth(user="bob", password_file="/base/pw.txt")),
    ("rendezvous.secret_file", None),
    ("restart.max_restarts", 7),
    ("restart.backoff", Backoff(initial=0.25, max=120.0, multiplier=1.5, jitter=0.3)),
    ("restart.non_retryable_exit_codes", (4, 3)),
    ("restart.scope", "worker"),
    ("restart.standby", False),
    ("restart.preload", ("numpy", "torch")),
    ("restart.standby_max_memory_mb", 512),
    ("restart.budgets", Budgets(oom=ClassBudget(max=2), hang=ClassBudget(max=5, charged=False),
                                node_lost=ClassBudget(max=1, charged=False), preempted=ClassBudget(charged=True),
                                infra=ClassBudget(max=None))),
    ("restart.crash_loop", 9),
    ("shutdown.signal", "SIGINT"),
    ("shutdown.grace_period", 12.0),
    ("shutdown.signals_to_handle", ("SIGTERM", "SIGUSR1", "SIGHUP")),
    ("logs.dir", "out/logs"),
    ("logs.tee", False),
    ("logs.console_streams", "0:stdout,1:none,other:stderr"),
    ("logs.console_local_ranks", (2, 0)),
    ("logs.prefix", "<{rank:>3}|{local_rank}|{attempt}|{node}> "),
    ("logs.format", "json"),
    ("watchdog.enabled", True),
    ("watchdog.check_interval", 0.3),
    ("watchdog.capture_stacks", False),
    ("watchdog.heartbeat_timeout", 240.0),
    ("watchdog.progress_timeout", 360.0),
    ("watchdog.stall_timeout", 540.0),
    ("watchdog.max_run_time", 10800.0),
    ("watchdog.flight_recorder", 77),
    ("watchdog.keep_out_culprit", False),
    ("health.min_free", 2 * 1024**3),
    ("health.paths", (HealthPath("/base/work/data"), HealthPath(f"{HOME}/ckpt", 3 * 1024**2), HealthPath("/abs"))),
    ("health.min_free_memory", 5_000_000),
    ("health.gpus", 2),
    ("health.commands", (HealthCommand("true"), HealthCommand("nvidia-smi -L", 7.0), HealthCommand("x"))),
    ("health.timeout", 45.0),
    ("health.retry_interval", 3.0),
    ("health.give_up_after", 540.0),
    ("health.max_failures", 4),
    ("health.failure_window", 7200.0),
    ("metrics.enabled", True),
    ("metrics.host", "0.0.0.0"),
    ("metrics.port", 9400),
    ("cluster.etcd", "start"),
    ("cluster.etcd_port", 2390),
    ("cluster.gpus_per_node", 8),
    ("cluster.slurm", Slurm(partition="gpu", account="acct", time_limit=7200.0, signal_lead=300.0, requeue=False,
                            cpus_per_node=32, sbatch_args=("--exclusive", "--qos=high"), etcd_command="/opt/etcd")),
    ("cluster.kubernetes", Kubernetes(image="img:1", namespace="ns", workdir="/w", cpu="4", memory="16Gi",
                                      etcd_image="etcd:2", service_account="sa")),
    ("replica_groups", None),
])
def test_every_field_written_is_read_back(field: str, value: object) -> None:
    """Each field of a spec that writes them all (unlike their defaults) reads back converted: seconds, bytes,
    absolute paths (against the spec's folder, `~` expanded; health paths against cwd), SIG names, duplicates
    dropped."""
    assert operator.attrgetter(field)(every_field()) == value


@pytest.mark.parametrize(("field", "value"), [
    ("entrypoint", Entrypoint(command=("prog", "a b", "c"))),
    ("nodes", Nodes(6, 6)),
    ("cwd", BASE),
    ("rendezvous.hosted", True),
    ("rendezvous.hosted_members", 3),
    ("rendezvous.endpoints", ("n0:2379",)),
    ("rendezvous.prefix", "/"),
    ("rendezvous.status_interval", None),
    ("rendezvous.secret_file", "/base/sec/job.secret"),
    ("watchdog.enabled", True),
    ("watchdog.progress_timeout", 60.0),
    ("watchdog.heartbeat_timeout", None),
    ("watchdog.stall_timeout", None),
    ("health.give_up_after", None),
    ("health.paths", (HealthPath("/base/d", 10),)),
])
def test_a_hosted_job_reads_back(field: str, value: object) -> None:
    """A hosted rendezvous (members, secret file), a command string split as a shell would, nulls that turn a default
    off."""
    assert operator.attrgetter(field)(loaded(HOSTED)) == value


GROUPS = """\
name: groups
entrypoint: train.py
nodes: 6
rendezvous: {backend: etcd, endpoints: "n0:2379"}
replica_groups:
  count: 3
  nproc_per_node: 2
  nodes_per_group: 2
  min_active: 2
  lighthouse: {hosted: false, address: "http://lh:29510", join_timeout: 2s, heartbeat_timeout: 8s, quorum_tick: 50ms}
"""


def test_replica_groups_on_several_nodes_with_a_lighthouse_run_elsewhere_read_back() -> None:
    """Every field of replica_groups, the lighthouse's included (an etcd the job does not host: a hosted one is
    refused with groups on several nodes)."""
    assert loaded(GROUPS).replica_groups == ReplicaGroups(
        count=3, nproc_per_node=2, nodes_per_group=2, min_active=2, lighthouse=Lighthouse(
            hosted=False, address="http://lh:29510", join_timeout=2.0, heartbeat_timeout=8.0, quorum_tick=0.05))


def test_whole_floats_become_ints_where_the_spec_counts() -> None:
    """JSON Schema counts 2.0 as an integer: such fields come out as int, not float."""
    spec = loaded(HEAD + "nodes: 1.0\nnproc_per_node: 2.0\nrestart: {max_restarts: 4.0, standby_max_memory_mb: 64.0,"
                  " crash_loop: 5.0, non_retryable_exit_codes: [3.0]}\nwatchdog: {flight_recorder: 10.0}\n"
                  "health: {gpus: 1.0, max_failures: 2.0}\nmetrics: {enabled: true, port: 9000.0}\n"
                  "cluster: {etcd_port: 2400.0, gpus_per_node: 4.0, slurm: {cpus_per_node: 16.0}}\n"
                  "replica_groups: {count: 2.0, nproc_per_node: 3.0, nodes_per_group: 1.0, min_active: 1.0,"
                  " lighthouse: {port: 7000.0}}\n")
    values = [spec.nodes.min, spec.nproc_per_node, spec.restart.max_restarts, spec.restart.standby_max_memory_mb,
              spec.restart.crash_loop, *spec.restart.non_retryable_exit_codes, spec.watchdog.flight_recorder,
              spec.health.gpus, spec.health.max_failures, spec.metrics.port, spec.cluster.etcd_port,
              spec.cluster.gpus_per_node, spec.cluster.slurm.cpus_per_node, spec.replica_groups.count,
              spec.replica_groups.nproc_per_node, spec.replica_groups.lighthouse.port]
    assert values == [1, 2, 4, 64, 5, 3, 10, 1, 2, 9000, 2400, 4, 16, 2, 3, 7000]
    assert all(type(v) is int for v in values)
    assert spec.restart.backoff.multiplier == 2.0 and type(spec.restart.backoff.multiplier) is float


# -- defaults ---------------------------------------------------------------------------------------------------------

def test_an_empty_replica_groups_section_gets_every_default_but_count() -> None:
    """replica_groups with only count: the other fields and the whole lighthouse keep the dataclass defaults
    (the lighthouse is hosted unless told otherwise)."""
    assert loaded(HEAD + "replica_groups: {count: 4}\n").replica_groups == ReplicaGroups(count=4)
    assert ReplicaGroups().lighthouse == Lighthouse(hosted=True, address=None, port=0, join_timeout=1.0,
                                                    heartbeat_timeout=5.0, quorum_tick=0.1)


def test_a_hosted_lighthouse_keeps_its_port() -> None:
    """lighthouse.port is the port a hosted lighthouse binds; the unwritten durations keep their defaults."""
    groups = loaded(HEAD + "replica_groups: {count: 2, lighthouse: {port: 29510, quorum_tick: 1s}}\n").replica_groups
    assert groups is not None
    assert groups.lighthouse == Lighthouse(port=29510, quorum_tick=1.0)


def test_no_replica_groups_section_is_none() -> None:
    """Without the section, one group of nproc_per_node workers, as torchrun (None, not a default ReplicaGroups)."""
    assert loaded(HEAD).replica_groups is None


@pytest.mark.parametrize(("body", "enabled"), [
    ("", False),
    ("watchdog: {heartbeat_timeout: 1m}\n", True),
    ("watchdog: {progress_timeout: 1m}\n", True),
    ("watchdog: {max_run_time: 1h}\n", False),
    ("watchdog: {stall_timeout: 1m}\n", False),
    ("watchdog: {heartbeat_timeout: null, progress_timeout: null}\n", False),
])
def test_watchdog_enabled_unwritten_follows_the_hang_timeouts(body: str, enabled: bool) -> None:
    """`enabled` unwritten: on when a heartbeat or progress timeout asks for hang detection, else off."""
    assert loaded(HEAD + body).watchdog.enabled is enabled


def test_restart_budgets_not_written_keep_their_defaults() -> None:
    """A class given as a number sets its max and keeps its own `charged`; a class not written keeps its default
    (oom and infra 0, node_lost and preempted uncharged); a mapping overrides only what it writes."""
    spec = loaded(HEAD + "restart: {budgets: {node_lost: 4, oom: {charged: false}, infra: {max: null}}}\n")
    assert spec.restart.budgets == Budgets(
        exception=ClassBudget(), oom=ClassBudget(max=0, charged=False), signal=ClassBudget(), hang=ClassBudget(),
        node_lost=ClassBudget(max=4, charged=False), preempted=ClassBudget(charged=False),
        infra=ClassBudget(max=None, charged=True))


def test_restart_backoff_partly_written_keeps_the_rest() -> None:
    """backoff with only max: initial, multiplier and jitter keep their defaults."""
    assert loaded(HEAD + "restart: {backoff: {max: 5s}}\n").restart.backoff == Backoff(initial=1.0, max=5.0,
                                                                                      multiplier=2.0, jitter=0.1)


def test_a_string_entrypoint_is_a_script_and_cwd_defaults_to_the_spec_folder() -> None:
    """`entrypoint: x.py` is a script; no cwd: the spec's folder; the role is `default`."""
    spec = loaded(HEAD)
    assert (spec.entrypoint, spec.cwd, spec.role, spec.virtual_local_rank) == (
        Entrypoint(script="train.py"), BASE, "default", False)


# -- entrypoint, nodes, env -------------------------------------------------------------------------------------------

ENTRY_FIX = "keep one: script: train.py, module: pkg.train or command: [prog, arg]"


@pytest.mark.parametrize(("entrypoint", "expected"), [
    ("{args: [x]}", [("entrypoint", "needs exactly one of script, module, command (found none)", ENTRY_FIX)]),
    ("{script: a, module: b}", [
        ("entrypoint", "needs exactly one of script, module, command (found script and module)", ENTRY_FIX)]),
    ("{command: '   '}", [("entrypoint.command", "the command is empty", "write the program to run")]),
    ("{command: 'a \"b'}", [("entrypoint.command", "cannot split the command line: No closing quotation",
                             "balance the quotes, or write the command as a list of strings")]),
])
def test_entrypoint_refusals(entrypoint: str, expected: list[Refusal]) -> None:
    """An entrypoint with none or two kinds, a blank command, a command with an open quote."""
    assert refusals(f"name: job\nentrypoint: {entrypoint}\n") == expected


def test_a_command_that_does_not_split_is_kept_whole() -> None:
    """The builder's own answer to an unsplittable command line: one argv item, the text as written."""
    spec, problems = built("name: job\nentrypoint: {command: 'a \"b'}\n")
    assert spec.entrypoint.command == ('a "b',)
    assert [path for path, _, _ in problems] == ["entrypoint.command"]


def test_a_node_count_too_long_for_int_is_refused() -> None:
    """`nodes: N:M` whose N has more digits than int() takes: refused at nodes, the number cut short."""
    digits = "9" * 5000
    assert refusals(HEAD + f"nodes: '{digits}:2'\n") == [
        ("nodes", f"'{'9' * 37}...' is not a usable number of nodes", "e.g. nodes: 1:4")]


def test_env_values_keep_the_text_written_and_tagged_ones_read_as_yaml_would_write_them() -> None:
    """Unquoted scalars keep their text (aliases too); a tagged scalar has no plain text: a boolean reads lowercase,
    a number as Python writes it."""
    spec = loaded(HEAD + "env:\n  A: &x TRUE\n  B: *x\n  C: !!bool 'false'\n  D: !!bool 'True'\n  E: !!int '0x10'\n"
                  "  F: text\n")
    assert spec.env == (("A", "TRUE"), ("B", "TRUE"), ("C", "false"), ("D", "true"), ("E", "16"), ("F", "text"))


# -- nproc_per_node: devices counted here -----------------------------------------------------------------------------

class Devices:
    """count_devices stand-in: `found` devices of any kind; records what it was asked."""

    def __init__(self, found: int) -> None:
        self.found = found
        self.asked: list[tuple[str, Mapping[str, str]]] = []

    def __call__(self, kind: str, environ: Mapping[str, str]) -> int:
        self.asked.append((kind, environ))
        return self.found


@pytest.fixture
def devices(monkeypatch: pytest.MonkeyPatch) -> Devices:
    """No device of any kind on this machine (tests set `found`)."""
    fake = Devices(0)
    monkeypatch.setattr(build, "count_devices", fake)
    return fake


@pytest.mark.parametrize("found", [1, 2, 8])
def test_nproc_per_node_counts_the_devices_of_its_kind_in_this_environment(devices: Devices, found: int) -> None:
    """`nproc_per_node: gpu` is the number of GPUs this process sees (os.environ: CUDA_VISIBLE_DEVICES)."""
    devices.found = found
    assert loaded(HEAD + "nproc_per_node: gpu\n").nproc_per_node == found
    assert devices.asked == [("gpu", os.environ)]
    assert devices.asked[0][1] is os.environ


NO_DEVICE_FIX = "run on a node with one (check CUDA_VISIBLE_DEVICES), or write auto or a number"


@pytest.mark.parametrize(("kind", "device"), [("gpu", "GPU"), ("xpu", "Intel GPU (xpu)")])
def test_nproc_per_node_of_a_device_not_here_is_refused(devices: Devices, kind: str, device: str) -> None:
    """No such device visible on this machine: refused, naming the device."""
    assert refusals(HEAD + f"nproc_per_node: {kind}\n") == [
        ("nproc_per_node", f"nproc_per_node: {kind} but no {device} is visible on this machine", NO_DEVICE_FIX)]


def test_nproc_per_node_of_a_device_not_here_builds_one_worker(devices: Devices) -> None:
    """The builder's stand-in for a refused device count is 1."""
    spec, problems = built(HEAD + "nproc_per_node: gpu\n")
    assert spec.nproc_per_node == 1 and len(problems) == 1


@pytest.mark.parametrize("found", [0, 1, 4])
def test_nproc_per_node_on_another_machine_counts_when_it_runs(devices: Devices, found: int) -> None:
    """devices_here=False (a template rendered on a login node): no device here is no problem, and the count is
    the one here when there is one (1 when there is none)."""
    devices.found = found
    spec = loaded(HEAD + "nproc_per_node: gpu\n", devices_here=False)
    assert spec.nproc_per_node == max(found, 1)


def test_a_builder_counts_devices_here_unless_told(devices: Devices) -> None:
    """Builder(doc, base) alone (as salvage builds it) refuses a GPU count with no GPU here."""
    _, problems = built(HEAD + "nproc_per_node: gpu\n")
    assert problems == [
        ("nproc_per_node", "nproc_per_node: gpu but no GPU is visible on this machine", NO_DEVICE_FIX)]
    _, elsewhere = built(HEAD + "nproc_per_node: gpu\n", devices_here=False)
    assert elsewhere == []


def test_a_missing_device_is_reported_beside_other_problems(devices: Devices) -> None:
    """A spec with a schema problem too still reports the missing GPU (salvage builds the rest)."""
    found = refusals(HEAD + "nproc_per_node: gpu\nrole: 3\n")
    assert ("nproc_per_node", "nproc_per_node: gpu but no GPU is visible on this machine", NO_DEVICE_FIX) in found
    assert [path for path, _, _ in found] == ["nproc_per_node", "role"]


def test_health_gpus_auto_is_what_the_spec_uses_on_this_node(monkeypatch: pytest.MonkeyPatch,
                                                             devices: Devices) -> None:
    """`health.gpus: auto` is nvidia_gpus_used of the nproc_per_node written, its count, cluster.gpus_per_node and
    this process's environment."""
    asked = []

    def used(nproc_raw: object, nproc: int, gpus_per_node: int, environ: Mapping[str, str]) -> int:
        asked.append((nproc_raw, nproc, gpus_per_node, environ))
        return 5

    monkeypatch.setattr(build, "nvidia_gpus_used", used)
    devices.found = 3
    spec = loaded(HEAD + "nproc_per_node: auto\ncluster: {gpus_per_node: 6}\n")
    assert spec.health.gpus == 5
    assert asked == [("auto", 3, 6, os.environ)] and asked[0][3] is os.environ
    assert loaded(HEAD + "health: {gpus: 0}\n").health.gpus == 0  # written: not resolved


# -- rendezvous endpoints ---------------------------------------------------------------------------------------------

PORT_FIX = "use a port from 1 to 65535"


@pytest.mark.parametrize(("endpoints", "expected"), [
    ("'a:65535,b:1'", []),
    ("[a:65535, b:1]", []),
    ("'a:1,b:65536'", [("rendezvous.endpoints", "port 65536 of 'b:65536' is out of range", PORT_FIX)]),
    ("'a:0'", [("rendezvous.endpoints", "port 0 of 'a:0' is out of range", PORT_FIX)]),
    ("[a:1, b:65536, c:0]", [("rendezvous.endpoints[1]", "port 65536 of 'b:65536' is out of range", PORT_FIX),
                             ("rendezvous.endpoints[2]", "port 0 of 'c:0' is out of range", PORT_FIX)]),
])
def test_endpoint_ports_from_1_to_65535(endpoints: str, expected: list[Refusal]) -> None:
    """Ports 1 and 65535 pass; 0 and 65536 are refused at the list item (or the string that holds them)."""
    text = f"name: job\nentrypoint: train.py\nnodes: 2\nrendezvous: {{backend: etcd, endpoints: {endpoints}}}\n"
    if expected:
        assert refusals(text) == expected
    else:
        assert loaded(text).rendezvous.endpoints == ("a:65535", "b:1")


@pytest.mark.parametrize(("prefix", "stored"), [
    ("/jobs/", "/jobs"), ("/jobX//", "/jobX"), ("///", "/"), ("/a/b", "/a/b"),
])
def test_the_rendezvous_prefix_loses_its_trailing_slashes(prefix: str, stored: str) -> None:
    """Trailing slashes go (only slashes); all slashes leave the root."""
    assert loaded(HEAD + f"rendezvous: {{backend: etcd, prefix: '{prefix}'}}\n").rendezvous.prefix == stored


def test_the_default_rendezvous_is_the_dataclass_default() -> None:
    """No rendezvous section, or an empty one: every field as Rendezvous() has it."""
    assert loaded(HEAD).rendezvous == Rendezvous() == loaded(HEAD + "rendezvous: {}\n").rendezvous


# -- shutdown signals -------------------------------------------------------------------------------------------------

STOP_FIX = "list stop signals such as SIGTERM, SIGINT"


@pytest.mark.parametrize(("signal", "expected"), [
    ("999", ("unknown signal 999", "use a signal name such as SIGTERM or SIGINT")),
    ("sigtrm", ("unknown signal 'sigtrm'", "did you mean 'SIGTERM'?")),
    ("TRM", ("unknown signal 'TRM'", "did you mean 'SIGTERM'?")),
    ("' usr3 '", ("unknown signal ' usr3 '", "did you mean 'SIGUSR2'?")),
    ("sigab", ("unknown signal 'sigab'", "did you mean 'SIGABRT'?")),  # SIG written: not added again
    ("ch", ("unknown signal 'ch'", "did you mean 'SIGCHLD'?")),
    ("zzzzzzzz", ("unknown signal 'zzzzzzzz'", "allowed signals: " + ", ".join(
        sorted(s.name for s in __import__("signal").Signals)))),
])
def test_an_unknown_stop_signal_is_refused_with_a_suggestion(signal: str, expected: tuple[str, str]) -> None:
    """An unknown name is matched against the SIG names (upper-cased, SIG added); an unknown number gets advice."""
    assert refusals(HEAD + f"shutdown: {{signal: {signal}}}\n") == [("shutdown.signal", *expected)]


def test_an_unknown_signal_builds_as_sigterm() -> None:
    """The builder's stand-in for an unknown signal is SIGTERM."""
    spec, problems = built(HEAD + "shutdown: {signal: bogus, signals_to_handle: [bogus]}\n")
    assert spec.shutdown.signal == "SIGTERM"
    assert spec.shutdown.signals_to_handle == ("SIGTERM",)
    assert [path for path, _, _ in problems] == ["shutdown.signal", "shutdown.signals_to_handle[0]"]


@pytest.mark.parametrize("name", sorted(UNHANDLEABLE))
def test_a_signal_that_cannot_stop_the_job_is_refused_with_why(name: str) -> None:
    """SIGKILL, SIGSTOP, SIGUSR2, SIGCHLD in signals_to_handle: refused at their item, saying why."""
    assert refusals(HEAD + f"shutdown: {{signals_to_handle: [TERM, {name[3:].lower()}]}}\n") == [
        ("shutdown.signals_to_handle[1]", f"{name} cannot stop the job: {UNHANDLEABLE[name]}", STOP_FIX)]


def test_unhandleable_signals_say_why() -> None:
    """The reasons `runner convert` repeats."""
    assert UNHANDLEABLE == {
        "SIGKILL": "no process can catch it",
        "SIGSTOP": "no process can catch it",
        "SIGUSR2": "it is the graceful-stop signal (runner stop --graceful)",
        "SIGCHLD": "the kernel sends it whenever a child exits",
    }


def test_signals_to_handle_refusals_are_located_at_their_item() -> None:
    """An unknown name and an uncatchable number in the list: each at its own index."""
    assert refusals(HEAD + "shutdown: {signals_to_handle: [INT, trem, 9]}\n") == [
        ("shutdown.signals_to_handle[1]", "unknown signal 'trem'", "did you mean 'SIGTERM'?"),
        ("shutdown.signals_to_handle[2]", "SIGKILL cannot stop the job: no process can catch it", STOP_FIX),
    ]


def test_signals_to_handle_refused_items_are_left_out() -> None:
    """The builder keeps the catchable signals, each once, in order."""
    spec, _ = built(HEAD + "shutdown: {signals_to_handle: [HUP, KILL, 1, INT, SIGUSR2]}\n")
    assert spec.shutdown.signals_to_handle == ("SIGHUP", "SIGINT")


# -- logs -------------------------------------------------------------------------------------------------------------

STREAMS_FIX = "list each local rank once, e.g. 0:all,1:stderr,other:none"


@pytest.mark.parametrize(("streams", "expected"), [
    ("0:all,00:none", [("logs.console_streams", "local rank 0 is listed twice in '0:all,00:none'", STREAMS_FIX)]),
    ("other:none,1:all,other:all",
     [("logs.console_streams", "local rank other is listed twice in 'other:none,1:all,other:all'", STREAMS_FIX)]),
])
def test_a_local_rank_listed_twice_in_console_streams_is_refused(streams: str, expected: list[Refusal]) -> None:
    """`00:` is rank 0: listing it twice, or `other` twice, is refused."""
    assert refusals(HEAD + f"logs: {{console_streams: '{streams}'}}\n") == expected


@pytest.mark.parametrize(("streams", "normal"), [
    ("stderr", "stderr"),
    ("01:stderr,other:none", "1:stderr,other:none"),
    ("other:stdout,007:all", "other:stdout,7:all"),
])
def test_console_streams_per_rank_are_normalised(streams: str, normal: str) -> None:
    """Leading zeros dropped, order kept; a plain value as is."""
    assert loaded(HEAD + f"logs: {{console_streams: '{streams}'}}\n").logs.console_streams == normal


def test_a_repeated_rank_keeps_its_last_streams() -> None:
    """The builder's normal form of a refused value: the rank once, with its last streams."""
    spec, problems = built(HEAD + "logs: {console_streams: '0:all,1:none,00:stderr'}\n")
    assert spec.logs.console_streams == "0:stderr,1:none"
    assert len(problems) == 1


PREFIX_FIX = f"{{node}} is text, the others are integers; use plain fields such as {FIELDS}"
WIDE_FIX = f"keep widths at most {MAX_PREFIX_WIDTH}, e.g. {{rank:>3}}"


@pytest.mark.parametrize(("prefix", "expected"), [
    ("{", [("invalid prefix '{': Single '{' encountered in format string",
            f"use fields {FIELDS}; write {{{{ for a literal {{")]),
    ("{host} {}", [("unknown field {host} in prefix '{host} {}'",
                    f"allowed fields: attempt, local_rank, node, rank (fields: {FIELDS})"),
                   ("unknown field {} in prefix '{host} {}'", f"name the field (fields: {FIELDS})")]),
    ("{rnak}", [("unknown field {rnak} in prefix '{rnak}'", f"did you mean 'rank'? (fields: {FIELDS})")]),
    ("{rank:{node}}", [("format spec ':{node}' of {rank} is too wide or nested", WIDE_FIX)]),
    (f"{{rank:>{MAX_PREFIX_WIDTH + 1}}}", [(f"format spec ':>{MAX_PREFIX_WIDTH + 1}' of {{rank}} is too wide or nested",
                                            WIDE_FIX)]),
    (f"{{node:.{MAX_PREFIX_WIDTH + 1}}}", [(f"format spec ':.{MAX_PREFIX_WIDTH + 1}' of {{node}} is too wide or nested",
                                            WIDE_FIX)]),
    ("{rank!z}", [("invalid prefix '{rank!z}': Unknown conversion specifier z", PREFIX_FIX)]),
    ("{node:d}", [("invalid prefix '{node:d}': Unknown format code 'd' for object of type 'str'", PREFIX_FIX)]),
    ("{rank:" + "x" * 80 + "}", [(
        "invalid prefix '{rank:" + "x" * 31 + "...': Invalid format specifier '" + "x" * 71 + "...", PREFIX_FIX)]),
])
def test_a_prefix_the_console_cannot_format_is_refused(prefix: str, expected: list[tuple[str, str]]) -> None:
    """logs.prefix: bad syntax, unknown or unnamed fields, nested or too wide specs, formats that fail on the
    console's own values; a field problem is reported alone (the prefix is not also formatted)."""
    assert refusals(HEAD + f"logs: {{prefix: '{prefix}'}}\n") == [("logs.prefix", *item) for item in expected]


@pytest.mark.parametrize("prefix", [
    f"{{rank:>{MAX_PREFIX_WIDTH}}}", f"{{node:.{MAX_PREFIX_WIDTH}}}", "{local_rank:03d}|{attempt!s}", "{{literal}}",
    "",
])
def test_a_prefix_within_the_limits_loads(prefix: str) -> None:
    """Widths up to MAX_PREFIX_WIDTH, conversions, escaped braces, an empty prefix."""
    assert loaded(HEAD + f"logs: {{prefix: '{prefix}'}}\n").logs.prefix == prefix


def test_the_default_logs_section_is_the_dataclass_default() -> None:
    """No logs section: dir, tee, streams, ranks, prefix, format as documented."""
    logs = loaded(HEAD).logs
    assert (logs.dir, logs.tee, logs.console_streams, logs.console_local_ranks, logs.prefix, logs.format) == (
        "runner-logs", True, "all", None, "[{node}:{rank}] ", "auto")


# -- the builder's own refusals behind the value rules ----------------------------------------------------------------

DURATION_FIX = "write a finite number of seconds or a string such as 30s"


@pytest.mark.parametrize(("body", "path", "field"), [
    ("rendezvous: {join_timeout: .inf}", "rendezvous.join_timeout", "rendezvous.join_timeout"),
    ("rendezvous: {last_call: .inf}", "rendezvous.last_call", "rendezvous.last_call"),
    ("rendezvous: {lease_ttl: .inf}", "rendezvous.lease_ttl", "rendezvous.lease_ttl"),
    ("rendezvous: {connect_timeout: .inf}", "rendezvous.connect_timeout", "rendezvous.connect_timeout"),
    ("rendezvous: {status_interval: .inf}", "rendezvous.status_interval", "rendezvous.status_interval"),
    ("restart: {backoff: {initial: .inf}}", "restart.backoff.initial", "restart.backoff.initial"),
    ("restart: {backoff: {max: .inf}}", "restart.backoff.max", "restart.backoff.max"),
    ("shutdown: {grace_period: .inf}", "shutdown.grace_period", "shutdown.grace_period"),
    ("watchdog: {check_interval: .inf}", "watchdog.check_interval", "watchdog.check_interval"),
    ("watchdog: {heartbeat_timeout: .inf}", "watchdog.heartbeat_timeout", "watchdog.heartbeat_timeout"),
    ("watchdog: {progress_timeout: .inf}", "watchdog.progress_timeout", "watchdog.progress_timeout"),
    ("watchdog: {stall_timeout: .inf}", "watchdog.stall_timeout", "watchdog.stall_timeout"),
    ("watchdog: {max_run_time: .inf}", "watchdog.max_run_time", "watchdog.max_run_time"),
    ("health: {timeout: .inf}", "health.timeout", "health.timeout"),
    ("health: {retry_interval: .inf}", "health.retry_interval", "health.retry_interval"),
    ("health: {give_up_after: .inf}", "health.give_up_after", "health.give_up_after"),
    ("health: {failure_window: .inf}", "health.failure_window", "health.failure_window"),
    ("health: {commands: [a, {run: b, timeout: .inf}]}", "health.commands[1].timeout", "health.commands"),
    ("replica_groups: {count: 2, lighthouse: {join_timeout: .inf}}", "replica_groups.lighthouse.join_timeout",
     "replica_groups.lighthouse.join_timeout"),
    ("replica_groups: {count: 2, lighthouse: {heartbeat_timeout: .inf}}", "replica_groups.lighthouse.heartbeat_timeout",
     "replica_groups.lighthouse.heartbeat_timeout"),
    ("replica_groups: {count: 2, lighthouse: {quorum_tick: .inf}}", "replica_groups.lighthouse.quorum_tick",
     "replica_groups.lighthouse.quorum_tick"),
    ("cluster: {slurm: {time_limit: .inf}}", "cluster.slurm.time_limit", "cluster.slurm.time_limit"),
    ("cluster: {slurm: {signal_lead: .inf}}", "cluster.slurm.signal_lead", "cluster.slurm.signal_lead"),
])
def test_a_duration_that_does_not_convert_is_refused_at_its_field(body: str, path: str, field: str) -> None:
    """An infinite duration (the value rules refuse it first; the builder too): a problem at that field, with the
    converter's words and the fix; the field builds as 0 seconds."""
    spec, problems = built(HEAD + body + "\n")
    assert problems == [(path, "inf is not a finite duration >= 0", DURATION_FIX)]
    value = operator.attrgetter(field)(spec)
    assert (value[-1].timeout if isinstance(value, tuple) else value) == 0.0


TOO_BIG = 2**70


@pytest.mark.parametrize(("body", "path"), [
    (f"health: {{min_free: {TOO_BIG}}}", "health.min_free"),
    (f"health: {{min_free_memory: {TOO_BIG}}}", "health.min_free_memory"),
    (f"health: {{paths: [a, {{path: b, min_free: {TOO_BIG}}}]}}", "health.paths[1].min_free"),
])
def test_a_size_that_does_not_convert_is_refused_at_its_field(body: str, path: str) -> None:
    """A size past 64 bits: a problem at that field, with the converter's words and the size hint; 0 bytes."""
    spec, problems = built(HEAD + body + "\n")
    assert problems == [(path, f"{TOO_BIG} is larger than 9223372036854775807 bytes (8 EiB)", SIZE_HINT)]
    sizes = (spec.health.min_free, spec.health.min_free_memory, *(p.min_free for p in spec.health.paths))
    assert 0 in sizes and all(size in (0, None) for size in sizes)


def test_a_fail_without_a_fix_has_none() -> None:
    """Builder.fail: the fix is empty unless given."""
    doc, _ = parse_yaml(HEAD)
    builder = Builder(doc, BASE)
    builder.fail(("name",), "a message")
    assert [(p.path, p.message, p.fix, p.line) for p in builder.problems] == [("name", "a message", "", 1)]
