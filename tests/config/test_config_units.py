"""Small pieces of the spec loader: durations, ${VAR} substitution, redaction, YAML positions."""

from __future__ import annotations

import pytest

from runner.config import redact
from runner.config.durations import format_duration, parse_duration
from runner.config.interpolate import UnresolvedError, substitute
from runner.config.yaml_source import dotted, parse_yaml


@pytest.mark.parametrize(("value", "seconds"), [(0, 0.0), (2, 2.0), (0.25, 0.25), ("90", 90.0), ("1h1m1s", 3661.0)])
def test_parse_duration(value: float | str, seconds: float) -> None:
    """Numbers are seconds; strings add up their parts."""
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), True, None, [1]])
def test_parse_duration_rejects_non_durations(value: object) -> None:
    """Negative, non-finite, boolean and non-scalar values are refused."""
    with pytest.raises(ValueError, match="duration"):
        parse_duration(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(("seconds", "text"), [(0.5, "500ms"), (30, "30s"), (90, "1m30s"), (3600, "1h"), (0, "0ms")])
def test_format_duration_round_trips(seconds: float, text: str) -> None:
    """format_duration gives a short string that parses back to the same seconds."""
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds


def test_substitute_forms() -> None:
    """Set, unset-with-default, empty-with-default, empty-without-default, escape, several per string."""
    env = {"A": "1", "E": ""}
    assert substitute("${A}", env) == "1"
    assert substitute("${B:-two}", env) == "two"
    assert substitute("${E:-dflt}", env) == "dflt"
    assert substitute("x${E}y", env) == "xy"
    assert substitute("$${A} and ${A}", env) == "${A} and 1"
    assert substitute("$A ${A}${A}", env) == "$A 11"
    assert substitute("${B:-}", env) == ""


def test_substitute_unset_and_malformed() -> None:
    """An unset variable without default, or a stray '${', raise with a fix."""
    with pytest.raises(UnresolvedError) as unset:
        substitute("${NOPE}", {})
    assert unset.value.fix == "set NOPE or write ${NOPE:-default}"
    with pytest.raises(UnresolvedError) as malformed:
        substitute("${1X}", {})
    assert "$${" in malformed.value.fix


@pytest.mark.parametrize(
    ("key", "shown"),
    [("HF_TOKEN", "***"), ("aws_secret_access_key", "***"), ("DB_PASSWORD", "***"), ("MYSQL_PASSWD", "***"),
     ("GCP_CREDENTIALS", "***"), ("AUTH_HEADER", "***"), ("API_KEY", "***"), ("OMP_NUM_THREADS", "v"),
     ("PATH", "v"), ("NCCL_DEBUG", "v")],
)
def test_redact(key: str, shown: str) -> None:
    """Secret-looking keys are masked, others shown as is."""
    assert redact(key, "v") == shown


def test_positions_of_keys_and_values() -> None:
    """Lines and columns are 1-based, for keys and for values, in nested mappings and lists."""
    doc, problems = parse_yaml("a: 1\nb:\n  c: [x, y]\n")
    assert problems == []
    assert doc.keys[("b", "c")] == (3, 3)
    assert doc.values[("b", "c", 1)] == (3, 10)
    assert doc.where(("b", "missing")) == (2, 1)  # the key "b:", not the first line inside it
    assert doc.where(("b", "c")) == (3, 3)  # a list points at its key too
    assert dotted(("b", "c", 1)) == "b.c[1]"


def test_yaml_11_surprises_are_defused() -> None:
    """Sexagesimal numbers and dates stay strings; keys are never booleans."""
    doc, _ = parse_yaml("nodes: 1:4\nwhen: 2024-01-01\non: x\n")
    assert doc.data == {"nodes": "1:4", "when": "2024-01-01", "on": "x"}
