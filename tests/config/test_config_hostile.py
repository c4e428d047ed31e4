"""Hostile spec files: every one is accepted or refused (exit 2, file:line:column, field, fix), never a traceback,
a crash or a hang, and at a bounded cost (runner/config/limits.py)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import RUNNER

from runner.config import load_spec, load_spec_text
from runner.config.limits import MAX_DEPTH, MAX_FILE_BYTES, MAX_PROBLEMS, MAX_VALUES
from runner.config.source_file import decode
from runner.errors import SpecError, SpecProblem

HEAD = "name: job\nentrypoint: train.py\n"


def problems_of(text: str, environ: dict[str, str] | None = None) -> list[SpecProblem]:
    with pytest.raises(SpecError) as caught:
        load_spec_text(text, source="job.yaml", environ=environ or {})
    return caught.value.problems


def one(text: str, environ: dict[str, str] | None = None) -> SpecProblem:
    problems = problems_of(text, environ)
    assert len(problems) == 1, [p.render("job.yaml") for p in problems]
    return problems[0]


def validate(path: Path | str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The real CLI in a child process: a segfault or a hang would show here, not kill the test run."""
    return subprocess.run([*RUNNER, "validate", str(path)], capture_output=True, text=True,
                          timeout=timeout, check=False)


def assert_refused(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in result.stderr, result.stderr[-2000:]


# --- what is read --------------------------------------------------------------------------------------------


def test_a_directory_is_refused(tmp_path: Path) -> None:
    assert_refused(validate(tmp_path), "is a directory, not a regular file")


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "job.yaml"
    os.mkfifo(fifo)
    assert_refused(validate(fifo, timeout=30), "is a FIFO (named pipe), not a regular file")


def test_dev_zero_is_refused_without_reading_it() -> None:
    assert_refused(validate("/dev/zero", timeout=30), "is a character device")


def test_a_nul_byte_in_the_path_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="cannot open"):
        load_spec("job\0.yaml")


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(HEAD + "#" * MAX_FILE_BYTES + "\n")
    assert_refused(validate(spec), "larger than 1024 KiB")


def test_a_spec_of_exactly_the_size_limit_loads(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_bytes(HEAD.encode() + b"#" * (MAX_FILE_BYTES - len(HEAD) - 1) + b"\n")
    assert spec.stat().st_size == MAX_FILE_BYTES
    assert load_spec(spec).name == "job"


def test_invalid_utf8_names_line_and_column(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_bytes(HEAD.encode() + b"env:\n  A: caf\xe9\n")
    result = validate(spec)
    assert_refused(result, f"{spec}:4:9:", "not UTF-8 text: byte 0xe9", "save the file as UTF-8")


def test_a_utf8_bom_is_accepted_and_utf16_is_refused() -> None:
    assert decode("f", b"\xef\xbb\xbf" + HEAD.encode()) == HEAD
    with pytest.raises(SpecError, match="UTF-16 text"):
        decode("f", HEAD.encode("utf-16"))


# --- bounded expansion -----------------------------------------------------------------------------------------

LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)


def test_billion_laughs_is_refused_not_expanded(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(HEAD + "x-bomb:\n" + "".join("  " + line + "\n" for line in LAUGHS.splitlines()))
    assert_refused(validate(spec), f"more than {MAX_VALUES} values once aliases and merge keys are expanded")


def test_merge_key_bomb_is_refused() -> None:
    lines = ["m0: &m0 {k0: 0, k1: 1, k2: 2, k3: 3, k4: 4, k5: 5, k6: 6, k7: 7, k8: 8, k9: 9}"]
    lines += [f"m{i}: &m{i} {{<<: [{', '.join(f'*m{i - 1}' for _ in range(10))}], own{i}: {i}}}" for i in range(1, 8)]
    problem = one(HEAD + "\n".join(lines) + "\n")
    assert "values once aliases and merge keys are expanded" in problem.message


@pytest.mark.parametrize("opener", ["[", "{a: ", "- "])
def test_deep_nesting_is_refused_in_a_child_process_without_a_crash(tmp_path: Path, opener: str) -> None:
    """200,000 levels: exit 2, one located problem with its fix, no traceback, within validate()'s timeout.

    Whichever layer refuses it (our MAX_DEPTH, or libyaml's own nesting limit, which PyYAML 6.0.4 reaches first
    for flow collections), so the problem's wording is not checked here: see the test below for ours.
    """
    spec = tmp_path / "job.yaml"
    spec.write_text(HEAD + "x:\n  " + opener * 200_000 + "\n")
    result = validate(spec)
    assert_refused(result)
    lines = result.stderr.splitlines()
    assert lines[0] == f"runner: error: 1 problem(s) in {spec}:", result.stderr[-2000:]
    assert len(lines) == 2 and re.match(rf"  {re.escape(str(spec))}:\d+:\d+: .+ — ", lines[1]), result.stderr[-2000:]
    assert len(lines[1]) < 500, lines[1]


@pytest.mark.parametrize(("opener", "closer"), [("[", "]"), ("{a: ", "}"), ("- ", "")])
def test_one_level_past_max_depth_is_refused_by_our_limit(opener: str, closer: str) -> None:
    """MAX_DEPTH levels pass the depth check; one more is refused in our words, though PyYAML parses that text."""
    def nested(levels: int) -> str:  # the top-level mapping is the first level
        inner = levels - 1
        return HEAD + "x:\n  " + opener * inner + "1" + closer * inner + "\n"

    assert [p.message for p in problems_of(nested(MAX_DEPTH))] == ["unknown key 'x'"]  # deep enough, not too deep
    too_deep = nested(MAX_DEPTH + 1)
    assert yaml.safe_load(too_deep)["x"] is not None  # PyYAML accepts it: the refusal below is ours
    problem = one(too_deep)
    assert problem.message == f"nested deeper than {MAX_DEPTH} levels" and problem.line == 4, problem


def test_an_alias_inside_its_own_anchor_is_an_undefined_alias() -> None:
    problem = one(HEAD + "x: &a [*a]\n")
    assert "undefined alias 'a'" in problem.message and (problem.line, problem.column) == (3, 8)
    assert "define the anchor" in problem.fix


def test_aliases_nesting_deeper_than_the_text_are_refused() -> None:
    chain = "a0: &a0 [x]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, MAX_DEPTH + 5))
    assert "nested deeper than" in one(HEAD + chain).message


def test_interpolation_cannot_blow_up_memory() -> None:
    big = "x" * 100_000
    problem = one(HEAD + "logs:\n  prefix: '" + "${BIG}" * 100 + "'\n", environ={"BIG": big})
    assert "substitutions add more than" in problem.message and problem.path == "logs.prefix"


def test_problems_are_capped_and_say_so() -> None:
    problems = problems_of(HEAD + "".join(f"unknown_{i}: 1\n" for i in range(5 * MAX_PROBLEMS)))
    assert len(problems) == MAX_PROBLEMS + 1
    assert problems[-1].message == f"stopped after {MAX_PROBLEMS} problems"


# --- malformed values ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("nproc_per_node: !!int abc", "'abc' is not a valid !!int"),
        ("watchdog:\n  enabled: !!bool maybe", "'maybe' is not a valid !!bool"),
        ("cwd: !!binary aGVsbG8=", "unsupported YAML tag !!binary"),
        ("cwd: !custom x", "unsupported YAML tag !custom"),
        ("env: !!set {A}", "unsupported YAML tag !!set"),
        ("cwd: !!omap [a: b]", "unsupported YAML tag !!omap"),
        ("nproc_per_node: 123456789012345678901234567890123", "does not fit in 64 bits"),
        ("nproc_per_node: 99999999999999999999", "does not fit in 64 bits"),
        ("restart:\n  backoff:\n    multiplier: .nan", "must be a finite number, found nan"),
        ("restart:\n  backoff:\n    multiplier: 1.0e+999", "must be a finite number, found inf"),
        ('cwd: "a\\0b"', "contains a NUL byte"),
        ('env:\n  A: "x\\0"', "contains a NUL byte"),
        ("x: \x00", "a NUL character is not allowed in YAML"),
        ("x: \x1b[31m", "the control character U+001B is not allowed"),
        ("x: a\ufeffb", "byte order mark (U+FEFF) past the start"),
        ("? [a, b]\n: 1", "keys must be plain strings"),
        ("? {a: 1}\n: 1", "keys must be plain strings"),
        ("restart:\n  <<: 3", "'<<' needs a mapping"),
        ("restart:\n  <<: [[1]]", "'<<' needs a mapping"),
        ("cwd: a\ncwd: b", "duplicate key 'cwd' (first at line 3)"),
        ("---\n---", "expected a single document"),
        ("x: *nothing", "undefined alias 'nothing'"),
        ('cwd: "\\ud800"', "YAML syntax error"),
    ],
)
def test_malformed_input_is_one_located_problem(line: str, message: str) -> None:
    problems = problems_of(HEAD + line + "\n")
    assert any(message in p.message for p in problems), [p.render("job.yaml") for p in problems]
    assert all(p.line is not None and p.line >= 1 for p in problems), problems


def test_an_environment_value_that_is_not_utf8_is_refused() -> None:
    problem = one(HEAD + "env:\n  A: ${RAW}\n", environ={"RAW": "caf\udce9"})
    assert problem.path == "env.A" and "lone surrogate U+DCE9" in problem.message


def test_env_values_keep_their_text_even_when_huge_or_infinite() -> None:
    spec = load_spec_text(HEAD + "env:\n  BIG: 123456789012345678901234567890\n  INF: .inf\n", environ={})
    assert dict(spec.env) == {"BIG": "123456789012345678901234567890", "INF": ".inf"}


def test_a_string_longer_than_one_exec_argument_is_refused() -> None:
    problem = one(HEAD.replace("train.py", "{script: train.py, args: ['" + "a" * 140_000 + "']}"))
    assert problem.path == "entrypoint.args[0]" and "MAX_ARG_STRLEN" in problem.message


def test_an_env_entry_longer_than_one_exec_string_is_refused() -> None:
    problem = one(HEAD + "env:\n  A: '" + "a" * 131_070 + "'\n")
    assert problem.path == "env.A" and "execve refuses" in problem.message


# --- "ok" means it will run ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        ("'{rank[0]}'", "unknown field {rank[0]}"),
        ("'{rank:s}'", "invalid prefix"),  # str.format's own reason follows: see the test below
        ("'{node:d}'", "invalid prefix"),
        ("'{rank:>999999}'", "too wide or nested"),
        ("'{rank:{node}}'", "too wide or nested"),
        ("'{rank.real}'", "unknown field {rank.real}"),
        ("'{}'", "unknown field {}"),
        ("'{rank!x}'", "invalid prefix"),
        ("'{rank'", "invalid prefix"),
        ("'}'", "invalid prefix"),
    ],
)
def test_a_prefix_the_console_could_not_format_is_refused(prefix: str, message: str) -> None:
    problem = one(HEAD + f"logs:\n  prefix: {prefix}\n")
    assert problem.path == "logs.prefix" and message in problem.message, problem


@pytest.mark.parametrize("prefix", ["{rank:s}", "{node:d}"])
def test_a_prefix_that_str_format_refuses_relays_pythons_reason(prefix: str) -> None:
    """The reason is the interpreter's own words, taken from it here rather than written into the test."""
    with pytest.raises(ValueError) as python:
        prefix.format(node="n", rank=0, local_rank=0, attempt=0)
    problem = one(HEAD + f"logs:\n  prefix: '{prefix}'\n")
    assert problem.path == "logs.prefix" and problem.message.startswith("invalid prefix"), problem
    assert str(python.value) in problem.message, problem


def test_a_prefix_with_the_consoles_types_loads() -> None:
    spec = load_spec_text(HEAD + "logs:\n  prefix: '[{node:>8}|{rank:03d}|{attempt!r}] '\n", environ={})
    assert spec.logs.prefix == "[{node:>8}|{rank:03d}|{attempt!r}] "


@pytest.mark.parametrize(
    ("text", "path", "message"),
    [
        ("nproc_per_node: 4194305", "nproc_per_node", "must be <= 4194304"),
        ("nodes: 2147483648", "nodes", "2147483647"),
        ("nodes: 1000\nnproc_per_node: 4000000\nrendezvous:\n  backend: etcd", "nproc_per_node", "in a C int"),
        ("rendezvous:\n  lease_ttl: 10000000000", "rendezvous.lease_ttl", "must be <= 9000000000"),
        ("rendezvous:\n  join_timeout: 99999999999h", "rendezvous.join_timeout", "longer than 9e+09 s"),
        ("restart:\n  non_retryable_exit_codes: [256]", "restart.non_retryable_exit_codes[0]", "must be <= 255"),
        ("shutdown:\n  signal: SIGNOPE", "shutdown.signal", "unknown signal 'SIGNOPE'"),
        ("shutdown:\n  signal: 99999", "shutdown.signal", "unknown signal 99999"),
        ("nodes: '" + "9" * 5000 + "'", "nodes", "not a usable number of nodes"),
    ],
)
def test_numbers_beyond_what_the_os_torch_or_etcd_take_are_refused(text: str, path: str, message: str) -> None:
    problems = problems_of(HEAD + text + "\n")
    assert any(p.path == path and message in p.message for p in problems), [p.render("job.yaml") for p in problems]


def test_cross_field_problems_are_reported_with_schema_problems() -> None:
    text = HEAD + ("nproc_per_node: four\nrestart:\n  backoff:\n    initial: 1m\n    max: 10s\n"
                   "    jitter: 7\nshutdown:\n  signal: NOPE\n")
    problems = problems_of(text)
    found = {(p.path, p.line) for p in problems}
    assert found == {("nproc_per_node", 3), ("restart.backoff.initial", 6), ("restart.backoff.jitter", 8),
                     ("shutdown.signal", 10)}, [p.render("job.yaml") for p in problems]


def test_a_default_standing_in_for_a_wrong_value_is_not_blamed() -> None:
    problems = problems_of(HEAD + "restart:\n  backoff:\n    initial: soon\n    max: 0.5\n")
    assert [p.path for p in problems] == ["restart.backoff.initial"]  # not "initial (1 s) > max (0.5 s)"


def test_missing_name_still_gets_cross_field_checks() -> None:
    problems = problems_of("entrypoint: {command: [a], python: b}\n")
    assert {p.path for p in problems} == {"", "entrypoint.python"}
