"""Bad job specs: one test per class of mistake, each checking the field path, the line and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.config import load_spec, load_spec_text
from runner.errors import EXIT_SPEC, SpecError, SpecProblem

HEAD = "name: job\nentrypoint: train.py\n"  # lines 1-2 of most specs below


def problems_of(text: str, environ: dict[str, str] | None = None) -> list[SpecProblem]:
    """The problems load_spec_text reports for `text` (fails the test if it loads)."""
    with pytest.raises(SpecError) as caught:
        load_spec_text(text, source="job.yaml", environ=environ or {})
    return caught.value.problems


def only_problem(text: str, environ: dict[str, str] | None = None) -> SpecProblem:
    """The single problem reported for `text`."""
    problems = problems_of(text, environ)
    assert len(problems) == 1, [p.render("job.yaml") for p in problems]
    return problems[0]


def test_unknown_top_level_key_suggests_the_closest() -> None:
    """A misspelt key is named, located on its own line, and the right spelling suggested."""
    problem = only_problem(HEAD + "nproc_per_nod: 2\n")
    assert (problem.path, problem.line, problem.column) == ("", 3, 1)
    assert problem.message == "unknown key 'nproc_per_nod'"
    assert problem.fix == "did you mean 'nproc_per_node'?"
    assert "unknown key 'nproc_per_nod' — did you mean 'nproc_per_node'?" in problem.render("job.yaml")


def test_unknown_nested_key_without_close_match_lists_allowed_keys() -> None:
    """Nothing close: the fix lists the keys that are allowed in that mapping."""
    problem = only_problem(HEAD + "restart:\n  max_restarts: 1\n  colour: red\n")
    assert (problem.path, problem.line, problem.column) == ("restart", 5, 3)
    assert problem.fix == ("allowed keys: backoff, budgets, crash_loop, max_restarts, non_retryable_exit_codes, "
                           "preload, scope, standby, standby_max_memory_mb")


def test_wrong_type_says_expected_and_found() -> None:
    """A string where an integer belongs: both types are named, the fix shows a number."""
    problem = only_problem(HEAD + "restart:\n  max_restarts: four\n")
    assert (problem.path, problem.line) == ("restart.max_restarts", 4)
    assert problem.message == "expected an integer, found the string 'four'"
    assert "whole number" in problem.fix


def test_bad_enum_lists_allowed_values_and_suggests() -> None:
    """An enum value close to an allowed one: allowed values listed, nearest suggested."""
    problem = only_problem(HEAD + "rendezvous:\n  backend: etc\n")
    assert (problem.path, problem.line, problem.column) == ("rendezvous.backend", 4, 12)
    assert "local, etcd" in problem.message
    assert problem.fix == "did you mean 'etcd'?"


def test_bad_duration_explains_the_accepted_forms() -> None:
    """'5 minutes' is not a duration: the fix shows the accepted spellings."""
    problem = only_problem(HEAD + "rendezvous:\n  join_timeout: 5 minutes\n")
    assert (problem.path, problem.line) == ("rendezvous.join_timeout", 4)
    assert "expected a duration" in problem.message
    assert "30s" in problem.fix and "1h30m" in problem.fix


def test_bad_optional_duration_is_explained_like_a_duration() -> None:
    """A nullable duration with a bad string reports the duration problem, not 'null expected'."""
    problem = only_problem(HEAD + "watchdog:\n  max_run_time: soon\n")
    assert (problem.path, problem.line) == ("watchdog.max_run_time", 4)
    assert "expected a duration" in problem.message
    assert "5m" in problem.fix


def test_infinite_duration_is_rejected() -> None:
    """YAML's .inf passes 'number >= 0' but is no usable duration."""
    problem = only_problem(HEAD + "watchdog:\n  max_run_time: .inf\n")
    assert (problem.path, problem.line) == ("watchdog.max_run_time", 4)
    assert "finite" in problem.message and "30s" in problem.fix


def test_negative_number_names_the_bound() -> None:
    """max_restarts: -1 breaks 'minimum 0'."""
    problem = only_problem(HEAD + "restart:\n  max_restarts: -1\n")
    assert (problem.path, problem.line) == ("restart.max_restarts", 4)
    assert problem.message == "must be >= 0, found the integer -1"
    assert problem.fix == "use a value >= 0"


def test_nodes_min_greater_than_max() -> None:
    """'4:2' is a reversed range."""
    problem = only_problem(HEAD + "nodes: 4:2\nrendezvous:\n  backend: etcd\n")
    assert (problem.path, problem.line) == ("nodes", 3)
    assert "nodes.min (4) is greater than nodes.max (2)" in problem.message
    assert "MIN:MAX" in problem.fix


def test_nodes_of_wrong_shape_lists_the_shapes() -> None:
    """nodes: true fits none of the three forms; all three are named."""
    problem = only_problem(HEAD + "nodes: true\n")
    assert (problem.path, problem.line) == ("nodes", 3)
    assert "an integer >= 1" in problem.message and "'MIN:MAX'" in problem.message
    assert "found the boolean true" in problem.message
    assert "{min, max}" in problem.fix


def test_local_backend_cannot_span_nodes() -> None:
    """Two nodes need etcd; the fix says so."""
    problem = only_problem(HEAD + "nodes: 2\n")
    assert (problem.path, problem.line) == ("nodes", 3)
    assert "backend 'local'" in problem.message
    assert "rendezvous.backend: etcd" in problem.fix


def test_missing_name() -> None:
    """No name: a required key, reported at the top of the document with an example."""
    problem = only_problem("entrypoint: train.py\n")
    assert (problem.path, problem.line) == ("", 1)
    assert problem.message == "missing required key 'name'"
    assert "name: my-job" in problem.fix


def test_missing_entrypoint() -> None:
    """No entrypoint: the fix shows the shorthand."""
    problem = only_problem("name: job\n")
    assert (problem.path, problem.line) == ("", 1)
    assert problem.message == "missing required key 'entrypoint'"
    assert "entrypoint: train.py" in problem.fix


def test_two_entrypoint_kinds() -> None:
    """script and module together: exactly one is allowed."""
    problem = only_problem("name: job\nentrypoint:\n  script: a.py\n  module: pkg.a\n")
    assert (problem.path, problem.line) == ("entrypoint", 2)  # the 'entrypoint:' line
    assert "exactly one of script, module, command (found script and module)" in problem.message
    assert "keep one" in problem.fix


def test_entrypoint_without_any_kind() -> None:
    """Only args: nothing to run."""
    problem = only_problem("name: job\nentrypoint:\n  args: [x]\n")
    assert problem.path == "entrypoint" and problem.line == 2
    assert "found none" in problem.message


def test_unbalanced_quote_in_command_string() -> None:
    """A command string is split like a shell; an open quote is a problem, not a crash."""
    problem = only_problem("name: job\nentrypoint:\n  command: python 'x\n")
    assert (problem.path, problem.line) == ("entrypoint.command", 3)
    assert "as a list" in problem.fix


def test_python_with_command_is_rejected() -> None:
    """python only applies to script/module."""
    problem = only_problem("name: job\nentrypoint:\n  command: [prog]\n  python: python3\n")
    assert (problem.path, problem.line) == ("entrypoint.python", 4)
    assert "put the interpreter in command" in problem.fix


def test_duplicate_key() -> None:
    """The second 'name' is reported where it is, pointing at the first."""
    problem = only_problem(HEAD + "name: other\n")
    assert (problem.path, problem.line, problem.column) == ("name", 3, 1)
    assert problem.message == "duplicate key 'name' (first at line 1)"
    assert problem.fix == "remove one of them"


def test_yaml_syntax_error_is_one_located_problem() -> None:
    """An unclosed flow list: one problem with a line, no traceback."""
    problem = only_problem("name: job\nentrypoint: [a\nnodes: 1\n")
    assert problem.message.startswith("YAML syntax error")
    assert problem.line is not None and problem.line >= 2
    assert "indentation" in problem.fix


def test_tab_indentation_gets_a_tab_specific_fix() -> None:
    """Tabs are the classic YAML mistake: the fix says so."""
    problem = only_problem("name: job\nentrypoint:\n\tscript: a.py\n")
    assert problem.line == 3
    assert problem.fix == "indent with spaces, not tabs"


def test_unset_environment_variable() -> None:
    """${VAR} with VAR unset and no default: the field, the line and both fixes."""
    problem = only_problem("name: ${JOB_NAME}\nentrypoint: train.py\n", environ={})
    assert (problem.path, problem.line, problem.column) == ("name", 1, 7)
    assert problem.message == "environment variable JOB_NAME is not set"
    assert problem.fix == "set JOB_NAME or write ${JOB_NAME:-default}"


def test_malformed_interpolation() -> None:
    """A '${' that opens nothing valid is reported with the escape to use."""
    problem = only_problem("name: job\nentrypoint: train.py\nenv:\n  A: cost ${ 3\n")
    assert (problem.path, problem.line) == ("env.A", 4)
    assert "$${" in problem.fix


def test_inline_password_is_rejected_with_the_alternatives() -> None:
    """auth.password would put a secret in a logged, shared spec."""
    problem = only_problem(HEAD + "rendezvous:\n  auth:\n    user: u\n    password: hunter2\n")
    assert (problem.path, problem.line, problem.column) == ("rendezvous.auth", 6, 5)
    assert "inline password" in problem.message
    assert "password_env" in problem.fix and "password_file" in problem.fix


def test_unknown_signal_name_suggests_the_closest() -> None:
    """TREM is a typo of TERM."""
    problem = only_problem(HEAD + "shutdown:\n  signal: TREM\n")
    assert (problem.path, problem.line) == ("shutdown.signal", 4)
    assert problem.message == "unknown signal 'TREM'"
    assert problem.fix == "did you mean 'SIGTERM'?"


def test_unknown_signal_number() -> None:
    """999 is no signal."""
    problem = only_problem(HEAD + "shutdown:\n  signal: 999\n")
    assert (problem.path, problem.line) == ("shutdown.signal", 4)
    assert "SIGTERM" in problem.fix


def test_unknown_log_prefix_field() -> None:
    """{nod} is not a prefix field; the known fields are listed."""
    problem = only_problem(HEAD + "logs:\n  prefix: '[{nod}] '\n")
    assert (problem.path, problem.line) == ("logs.prefix", 4)
    assert "unknown field {nod}" in problem.message
    assert "did you mean 'node'?" in problem.fix and "{local_rank}" in problem.fix


def test_unbalanced_log_prefix() -> None:
    """'[{rank' cannot be formatted."""
    problem = only_problem(HEAD + "logs:\n  prefix: '[{rank'\n")
    assert (problem.path, problem.line) == ("logs.prefix", 4)
    assert "{{" in problem.fix


def test_top_level_list() -> None:
    """A list at the top: the document must be a mapping."""
    problem = only_problem("- name: job\n- entrypoint: train.py\n")
    assert (problem.path, problem.line) == ("", 1)
    assert "must be a mapping" in problem.message and "found a list" in problem.message
    assert "name: my-job" in problem.fix


def test_empty_file(tmp_path: Path) -> None:
    """A file with only a comment is empty; reported through load_spec with the file name."""
    spec = tmp_path / "job.yaml"
    spec.write_text("# nothing yet\n")
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    (problem,) = caught.value.problems
    assert caught.value.source == str(spec)
    assert (problem.path, problem.line) == ("", 1)
    assert problem.message == "the file is empty"
    assert "entrypoint: train.py" in problem.fix
    assert caught.value.exit_code == EXIT_SPEC


def test_missing_file(tmp_path: Path) -> None:
    """A path that does not exist is a SpecError, not FileNotFoundError."""
    with pytest.raises(SpecError) as caught:
        load_spec(tmp_path / "nope.yaml")
    assert caught.value.problems[0].message == "file not found"


def test_bad_name_pattern() -> None:
    """A name with a space cannot be used in etcd keys or file names."""
    problem = only_problem("name: my job\nentrypoint: train.py\n")
    assert (problem.path, problem.line, problem.column) == ("name", 1, 7)
    assert "found the string 'my job'" in problem.message
    assert "my-job" in problem.fix


def test_bad_env_key_and_null_value() -> None:
    """Env keys must be variable names; a null value must be quoted text."""
    problems = problems_of(HEAD + "env:\n  BAD-KEY: 1\n  EMPTY:\n")
    assert [(p.path, p.line) for p in problems] == [("env", 4), ("env.EMPTY", 5)]
    assert "not an environment variable name" in problems[0].message
    assert problems[1].message == "expected a string, a number or true or false, found null"


def test_endpoint_without_port_and_port_out_of_range() -> None:
    """Endpoints are host:port; the port must fit in 16 bits."""
    problem = only_problem(HEAD + "rendezvous:\n  endpoints: [localhost]\n")
    assert (problem.path, problem.line) == ("rendezvous.endpoints[0]", 4)
    assert "host:port" in problem.message
    problem = only_problem(HEAD + "rendezvous:\n  endpoints: 'a:1, b:99999'\n")
    assert (problem.path, problem.line) == ("rendezvous.endpoints", 4)
    assert "1 to 65535" in problem.fix


def test_wrong_version() -> None:
    """Only version 1 exists."""
    problem = only_problem("version: 2\n" + HEAD)
    assert (problem.path, problem.line) == ("version", 1)
    assert problem.fix == "write 1"


def test_tls_and_auth_pairing_rules() -> None:
    """cert without key, two password sources, a password without user: three problems."""
    problems = problems_of(HEAD + "rendezvous:\n  backend: etcd\n  tls: {cert: c.pem}\n  auth: {password_env: P, password_file: f}\n")
    assert [(p.path, p.line) for p in problems] == [
        ("rendezvous.tls", 5), ("rendezvous.auth", 6), ("rendezvous.auth", 6)]
    assert {p.fix for p in problems} == {"set both, or neither", "keep one of them", "add auth.user"}


def test_backoff_initial_above_max_and_zero_grace() -> None:
    """Two semantic problems in one spec are both reported."""
    problems = problems_of(HEAD + "restart:\n  backoff: {initial: 1m, max: 10s}\nshutdown:\n  grace_period: 0\n")
    assert [(p.path, p.line) for p in problems] == [("restart.backoff.initial", 4), ("shutdown.grace_period", 6)]
    assert "greater than backoff.max" in problems[0].message
    assert "must be greater than 0" in problems[1].message


def test_several_errors_are_reported_at_once_in_file_order() -> None:
    """Five unrelated mistakes: five problems, sorted by line, all in the error text."""
    text = (
        "name: bad name\n"
        "entrypoint: train.py\n"
        "nproc_per_node: 0\n"
        "restart: {scope: all}\n"
        "logs: {tee: maybe}\n"
        "watchdg: {}\n"
    )
    with pytest.raises(SpecError) as caught:
        load_spec_text(text, source="job.yaml", environ={})
    problems = caught.value.problems
    assert [p.line for p in problems] == [1, 3, 4, 5, 6]
    assert [p.path for p in problems] == ["name", "nproc_per_node", "restart.scope", "logs.tee", ""]
    assert str(caught.value).startswith("5 problem(s) in job.yaml:")
    assert "job.yaml:6:1: unknown key 'watchdg' — did you mean 'watchdog'?" in str(caught.value)


def test_unset_variable_is_not_reported_twice() -> None:
    """The unexpanded '${X}' would also fail the name pattern; only the interpolation problem shows."""
    problems = problems_of("name: ${X}\nentrypoint: train.py\n", environ={})
    assert [p.message for p in problems] == ["environment variable X is not set"]


def test_unsupported_yaml_tag() -> None:
    """Python object tags are refused (safe loading), with a location."""
    problem = only_problem("name: !!python/object:os.system job\nentrypoint: train.py\n")
    assert (problem.path, problem.line) == ("name", 1)
    assert "unsupported YAML tag" in problem.message


def test_interpolation_inside_flow_mapping_gets_a_quoting_fix() -> None:
    """`{tee: ${X}}` is a YAML syntax error; the fix says to quote the value."""
    problem = only_problem(HEAD + "logs: {tee: ${TEE}}\n")
    assert problem.line == 3
    assert "quote a value that uses ${...}" in problem.fix


JUNK = ["", "[]", "{}", "-1", "0", "1.5", "true", "null", "'x'", "[1, {a: 2}]", "{a: [b]}", ".inf", "'${X:-1}'", "1:2"]


def test_no_junk_value_anywhere_causes_a_traceback() -> None:
    """Every value line of full.yaml replaced by each junk value: the loader loads or raises SpecError, nothing else."""
    lines = (Path(__file__).parents[1] / "fixtures" / "specs" / "full.yaml").read_text().splitlines()
    tried = 0
    for index, line in enumerate(lines):
        key, colon, _ = line.partition(":")
        if not colon or key.lstrip().startswith("#"):
            continue
        for junk in JUNK:
            mutated = [*lines[:index], f"{key}: {junk}", *lines[index + 1:]]
            try:
                load_spec_text("\n".join(mutated), source="job.yaml", environ={})
            except SpecError as err:
                assert err.problems, mutated
                assert all(p.message for p in err.problems)
            tried += 1
    assert tried > 500


ETCD_ONLY_VALUES = {
    "endpoints": "['10.0.0.5:2379']", "prefix": "/team", "join_timeout": "5m", "last_call": "5s", "lease_ttl": "30s",
    "connect_timeout": "5s", "status_interval": "10s", "tls": "{ca: ca.pem}", "auth": "{user: u, password_env: P}",
}


@pytest.mark.parametrize("key", sorted(ETCD_ONLY_VALUES))
def test_a_field_only_etcd_reads_is_refused_with_the_local_backend(key: str) -> None:
    """`rendezvous.<key>` set while the backend is local (written, or the default backend left out: a torchrun user's
    `endpoints` without `backend: etcd`) would do nothing: refused, naming it; with etcd, or at its default, fine."""
    from runner.config.checks import ETCD_ONLY

    assert set(ETCD_ONLY) == set(ETCD_ONLY_VALUES)
    line = f"  {key}: {ETCD_ONLY_VALUES[key]}\n"
    for backend in ("", "  backend: local\n"):
        problem = only_problem(HEAD + "rendezvous:\n" + backend + line)
        assert problem.path == f"rendezvous.{key}" and "does nothing with backend local" in problem.message
        assert "rendezvous.backend: etcd" in problem.fix
    assert load_spec_text(HEAD + "rendezvous:\n  backend: etcd\n" + line, environ={"P": "pw"}).rendezvous.backend == "etcd"
    from runner.config.spec import Rendezvous

    default = getattr(Rendezvous(), key)
    if isinstance(default, (int, float)):
        spec = load_spec_text(HEAD + f"rendezvous:\n  {key}: {default}\n", environ={})  # a default written out
        assert getattr(spec.rendezvous, key) == default  # changes nothing: it may stay


@pytest.mark.parametrize(("text", "path", "fix"), [
    ("metrics: {port: 9100}\n", "metrics.port", "set metrics.enabled: true"),
    ("metrics: {host: 0.0.0.0}\n", "metrics.host", "set metrics.enabled: true"),
    ("health: {retry_interval: 5s}\n", "health.retry_interval", "ask for a check"),
    ("health: {timeout: 5m}\n", "health.timeout", "ask for a check"),
    ("health: {give_up_after: 1h}\n", "health.give_up_after", "ask for a check"),
    ("health: {paths: [/data]}\n", "health.paths", "set health.min_free"),
])
def test_a_field_its_switch_leaves_unused_is_refused(text: str, path: str, fix: str) -> None:
    """A field that only a feature left off reads (metrics without enabled, how health checks run with none asked
    for) would do nothing: refused, naming it and the switch; with the feature on, it loads."""
    problem = only_problem(HEAD + text)
    assert problem.path == path and ("does nothing" in problem.message or "nothing is checked" in problem.message)
    assert fix in problem.fix
    switch = "  enabled: true\n" if path.startswith("metrics") else "  min_free: 1GiB\n"
    section, _, body = text.partition(": ")
    inner = body.strip().strip("{}")
    loaded = load_spec_text(HEAD + f"{section}:\n{switch}  {inner}\n", environ={})
    assert loaded.name == "job"


def test_status_interval_is_at_least_a_second_or_null() -> None:
    """Under 1 s is refused (one etcd put per node per interval); null turns the refresh off."""
    problem = only_problem(HEAD + "rendezvous:\n  backend: etcd\n  status_interval: 0.2s\n")
    assert problem.path == "rendezvous.status_interval" and "at least 1 s" in problem.message
    spec = load_spec_text(HEAD + "rendezvous:\n  backend: etcd\n  status_interval: null\n", environ={})
    assert spec.rendezvous.status_interval is None
