"""Good job specs: shorthands, defaults, interpolation, paths, and the example specs."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from runner.config import JobSpec, load_spec, load_spec_text
from runner.config.spec import TLS, Auth, Entrypoint, Nodes, Rendezvous

FIXTURES = Path(__file__).parents[1] / "fixtures" / "specs"
EXAMPLES = sorted((Path(__file__).parents[2] / "examples" / "jobs").glob("*.yaml"))
HEAD = "name: job\nentrypoint: train.py\n"


def load(text: str, environ: dict[str, str] | None = None, base_dir: str = "/base") -> JobSpec:
    """Load `text` with a fixed base dir and an explicit environment."""
    return load_spec_text(text, source="job.yaml", base_dir=base_dir, environ=environ or {})


def test_minimal_spec_gets_every_dataclass_default() -> None:
    """name + entrypoint only: everything else equals the dataclass defaults; cwd is the spec's folder."""
    spec = load_spec(FIXTURES / "minimal.yaml")
    expected = JobSpec(name="minimal", entrypoint=Entrypoint(script="train.py"), cwd=str(FIXTURES.resolve()))
    assert spec == expected


def test_full_spec_sets_every_field() -> None:
    """full.yaml converts every shorthand: durations, nodes range, endpoint string, signal, paths."""
    spec = load_spec(FIXTURES / "full.yaml", environ={"DATA_DIR": "/mnt/data"})
    base = str(FIXTURES.resolve())
    assert spec.entrypoint == Entrypoint(script="train.py", args=("--epochs", "3", "--lr", "0.1"),
                                         python="/usr/bin/python3")
    assert dict(spec.env) == {"OMP_NUM_THREADS": "4", "DEBUG": "yes", "DATA_DIR": "/mnt/data", "HF_TOKEN": "abc123"}
    assert spec.cwd == os.path.join(base, "work")
    assert spec.nodes == Nodes(2, 4)
    assert spec.nproc_per_node == 8
    assert spec.rendezvous.endpoints == ("10.0.0.1:2379", "10.0.0.2:2379")
    assert (spec.rendezvous.join_timeout, spec.rendezvous.last_call, spec.rendezvous.connect_timeout) == (600, 45, 90)
    assert spec.rendezvous.tls == TLS(ca=f"{base}/certs/ca.pem", cert=f"{base}/certs/client.pem",
                                      key=f"{base}/certs/client-key.pem")
    assert spec.rendezvous.auth == Auth(user="runner", password_env="ETCD_PASSWORD")
    assert (spec.restart.backoff.initial, spec.restart.backoff.max) == (0.5, 60.0)
    assert spec.restart.non_retryable_exit_codes == (3, 4)
    assert spec.shutdown.signal == "SIGINT"
    assert (spec.watchdog.check_interval, spec.watchdog.heartbeat_timeout, spec.watchdog.max_run_time) == (
        0.2, 300.0, 7200.0)


def test_spec_is_frozen_and_uses_tuples() -> None:
    """The result is immutable: tuples everywhere, assignment refused."""
    spec = load("name: job\nentrypoint:\n  command: [a, b]\n  args: [c]\n")
    assert spec.entrypoint.command == ("a", "b") and spec.entrypoint.args == ("c",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nodes: 3", Nodes(3, 3)),
        ("nodes: 1:4", Nodes(1, 4)),  # unquoted: YAML 1.1 would read the sexagesimal 64
        ("nodes: '2:8'", Nodes(2, 8)),
        ("nodes: '5'", Nodes(5, 5)),
        ("nodes: {min: 2, max: 3}", Nodes(2, 3)),
    ],
)
def test_nodes_shorthands(text: str, expected: Nodes) -> None:
    """Integer, MIN:MAX string (quoted or not) and {min, max} all give the same Nodes."""
    spec = load(HEAD + text + "\nrendezvous: {backend: etcd}\n")
    assert spec.nodes == expected


@pytest.mark.parametrize(
    ("entrypoint", "expected"),
    [
        ("train.py", Entrypoint(script="train.py")),
        ("{module: pkg.train, args: [--x, '1']}", Entrypoint(module="pkg.train", args=("--x", "1"))),
        ("{command: \"torchrun --help 'a b'\"}", Entrypoint(command=("torchrun", "--help", "a b"))),
        ("{command: [echo, hi]}", Entrypoint(command=("echo", "hi"))),
    ],
)
def test_entrypoint_forms(entrypoint: str, expected: Entrypoint) -> None:
    """Script shorthand, module, command string (shlex) and command list."""
    assert load(f"name: job\nentrypoint: {entrypoint}\n").entrypoint == expected


def test_endpoints_list_and_comma_string() -> None:
    """A list and a comma-separated string give the same tuple; IPv6 in brackets is fine."""
    as_list = load(HEAD + "rendezvous:\n  backend: etcd\n  endpoints: ['a:1', '[::1]:2379']\n").rendezvous.endpoints
    as_text = load(HEAD + "rendezvous:\n  backend: etcd\n  endpoints: a:1 , [::1]:2379\n").rendezvous.endpoints
    assert as_list == as_text == ("a:1", "[::1]:2379")


@pytest.mark.parametrize(("text", "name"), [("TERM", "SIGTERM"), ("sigint", "SIGINT"), ("9", "SIGKILL"),
                                             ("SIGUSR1", "SIGUSR1")])
def test_signal_is_normalised(text: str, name: str) -> None:
    """Names with or without SIG, any case, or numbers become the SIGxxx name."""
    assert load(HEAD + f"shutdown:\n  signal: {text}\n").shutdown.signal == name


def test_env_values_become_the_text_written() -> None:
    """Unquoted numbers and booleans keep their spelling; quoted strings are unchanged."""
    spec = load(HEAD + "env:\n  A: 1\n  B: 1.50\n  C: on\n  D: '007'\n  E: true\n")
    assert dict(spec.env) == {"A": "1", "B": "1.50", "C": "on", "D": "007", "E": "true"}


def test_interpolation_with_defaults_and_escapes() -> None:
    """${VAR}, ${VAR:-default} (also for empty VAR) and $${ for a literal."""
    environ = {"USER_NAME": "ada", "EMPTY": ""}
    spec = load(
        "name: job-${USER_NAME}\n"
        "entrypoint:\n  script: train.py\n  args: ['${OUT:-/tmp/out}', '${EMPTY:-x}', '$${HOME}', 'a${EMPTY}b']\n",
        environ,
    )
    assert spec.name == "job-ada"
    assert spec.entrypoint.args == ("/tmp/out", "x", "${HOME}", "ab")


def test_interpolated_plain_scalars_are_typed() -> None:
    """An unquoted ${NPROC:-2} becomes the integer 2; a quoted one stays a string and fails the schema."""
    assert load(HEAD + "nproc_per_node: ${NPROC:-2}\n").nproc_per_node == 2
    assert load(HEAD + "nproc_per_node: ${NPROC}\n", {"NPROC": "8"}).nproc_per_node == 8
    assert load(HEAD + "nodes: ${N}\nrendezvous: {backend: etcd}\n", {"N": "1:3"}).nodes == Nodes(1, 3)
    assert load(HEAD + "logs:\n  tee: ${TEE:-false}\n").logs.tee is False


def test_load_spec_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without an explicit environ, os.environ is used."""
    monkeypatch.setenv("RUNNER_TEST_JOB", "from-env")
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text("name: ${RUNNER_TEST_JOB}\nentrypoint: train.py\n")
    assert load_spec(spec_file).name == "from-env"


def test_relative_paths_resolve_against_the_spec_folder(tmp_path: Path) -> None:
    """cwd and TLS paths are relative to the spec file, not to where runner was started."""
    (tmp_path / "sub").mkdir()
    spec_file = tmp_path / "sub" / "job.yaml"
    spec_file.write_text(HEAD + "cwd: ../work\nrendezvous:\n  backend: etcd\n  tls: {ca: ca.pem}\n  auth: {user: u, password_file: pw}\n")
    spec = load_spec(spec_file)
    assert spec.cwd == str(tmp_path / "work")
    assert spec.rendezvous.tls.ca == str(tmp_path / "sub" / "ca.pem")
    assert spec.rendezvous.auth.password_file == str(tmp_path / "sub" / "pw")


def test_yaml_merge_keys_are_supported() -> None:
    """`<<:` merges work: explicit keys win, and in a list of merges the earlier mapping wins."""
    spec = load(HEAD + "restart:\n  <<: [{max_restarts: 7}, {max_restarts: 9, scope: worker}]\n  scope: group\n")
    assert (spec.restart.max_restarts, spec.restart.scope) == (7, "group")
    aliased = load(HEAD + "rendezvous:\n  backend: etcd\n  tls: &certs {ca: ca.pem}\n  auth:\n    user: u\n    password_file: pw\n")
    assert aliased.rendezvous.tls.ca == "/base/ca.pem"


def test_digest_is_stable_and_changes_with_the_spec() -> None:
    """Two loads of one text agree on the digest; a changed field changes it."""
    one, two = load(HEAD), load(HEAD)
    assert one.digest() == two.digest()
    assert load(HEAD + "nproc_per_node: 2\n").digest() != one.digest()


def test_default_rendezvous_matches_dataclass() -> None:
    """The local backend default keeps the dataclass endpoints and prefix."""
    assert load(HEAD).rendezvous == Rendezvous()


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_spec_loads(example: Path) -> None:
    """Every examples/jobs/*.yaml is a valid spec (runs with no examples too: then it is skipped)."""
    spec = load_spec(example)
    assert spec.name
    assert Path(spec.cwd).is_absolute()


def test_whole_floats_count_as_integers_and_become_ints() -> None:
    """JSON Schema accepts 2.0 as an integer; the JobSpec still holds ints."""
    spec = load(HEAD + "nproc_per_node: 2.0\nrestart:\n  max_restarts: 1.0\n  non_retryable_exit_codes: [3.0]\n")
    assert (spec.nproc_per_node, spec.restart.max_restarts, spec.restart.non_retryable_exit_codes) == (2, 1, (3,))
    assert all(isinstance(v, int) for v in (spec.nproc_per_node, spec.restart.max_restarts))
