"""The compiled schema check says "passes" exactly when jsonschema finds no error, so a valid spec skips jsonschema.

Compared with jsonschema's Draft202012Validator on generated schemas (every supported keyword, $defs and $ref,
values that print alike: 1, 1.0, true, "1") and on the job schema with generated edits of the example specs.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from runner.config.schema_check import load_schema, passes
from runner.config.schema_compiled import compile_schema, equal, is_plain
from runner.config.yaml_source import parse_yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "jobs").glob("*.yaml"))

# --- generated schemas -----------------------------------------------------------------------------------------

NAMES = ["a", "b", "c"]
PATTERNS = ["^a", "b$", "^[a-c]+$", "x|y", "", "^$", "\\d"]
ALIKE = [0, 1, 1.0, -1, 2.5, True, False, None, "1", "", "a", [], {}, [1], {"a": 1}, 1e300, float("inf")]
SCALARS = st.one_of(
    st.sampled_from(ALIKE),
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(-3, 3, allow_nan=False),
    st.text(alphabet="abcxy19", max_size=3),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from([*NAMES, "x", "ab"]), inner, max_size=3),
    max_leaves=8,
)
COUNTS = st.integers(0, 3)
LIMITS = st.one_of(st.integers(-2, 2), st.sampled_from([0.5, -1.5, 1.0, 2.0]))
TYPES = st.sampled_from(["string", "integer", "number", "boolean", "array", "object", "null"])
LEAF_KEYWORDS: dict[str, st.SearchStrategy[Any]] = {
    "type": TYPES | st.lists(TYPES, min_size=1, max_size=3),
    "enum": st.lists(VALUES, min_size=1, max_size=3),
    "const": VALUES,
    "minimum": LIMITS,
    "maximum": LIMITS,
    "exclusiveMinimum": LIMITS,
    "exclusiveMaximum": LIMITS,
    "minLength": COUNTS,
    "maxLength": COUNTS,
    "pattern": st.sampled_from(PATTERNS),
    "minItems": COUNTS,
    "maxItems": COUNTS,
    "minProperties": COUNTS,
    "maxProperties": COUNTS,
    "required": st.lists(st.sampled_from(NAMES), max_size=2, unique=True),
    "description": st.just("an annotation"),
    "x-fix": st.just("ignored by both"),
}


def nested(inner: st.SearchStrategy[Any], *, refs: bool) -> st.SearchStrategy[Any]:
    """One schema object whose keywords may hold the schemas `inner` draws."""
    optional = {
        **LEAF_KEYWORDS,
        "items": inner,
        "properties": st.dictionaries(st.sampled_from(NAMES), inner, max_size=2),
        "patternProperties": st.dictionaries(st.sampled_from(["", "^a", "b$"]), inner, max_size=2),  # "" is a quirk
        "additionalProperties": inner,
        "propertyNames": inner,
        "anyOf": st.lists(inner, min_size=1, max_size=3),
        "allOf": st.lists(inner, min_size=1, max_size=3),
        "oneOf": st.lists(inner, min_size=1, max_size=3),
        "not": inner,
    }
    if refs:
        optional["$ref"] = st.sampled_from(["#/$defs/d0", "#/$defs/d1"])
    keys = st.lists(st.sampled_from(sorted(optional)), max_size=4, unique=True)
    return keys.flatmap(lambda chosen: st.fixed_dictionaries({k: optional[k] for k in chosen}))


def schemas(*, refs: bool) -> st.SearchStrategy[Any]:
    """Schemas (booleans included), with `$ref`s to d0/d1 where `refs` (the definitions themselves have none)."""
    always = st.just(True)  # noqa: FBT003 (the schema `true`)
    return st.recursive(st.booleans() | nested(always, refs=refs), lambda inner: nested(inner, refs=refs), max_leaves=6)


ROOTS = st.tuples(schemas(refs=True), st.fixed_dictionaries({"d0": schemas(refs=False), "d1": schemas(refs=False)}))


@settings(max_examples=1200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ROOTS, st.lists(VALUES, min_size=1, max_size=5))
def test_the_compiled_check_agrees_with_jsonschema(root: tuple[Any, dict[str, Any]], instances: list[Any]) -> None:
    body, defs = root
    schema = {**body, "$defs": defs} if isinstance(body, dict) else body
    check = compile_schema(schema)
    assert check is not None
    validator = Draft202012Validator(schema)
    for instance in instances:
        assert check(instance) == validator.is_valid(instance), (schema, instance)


SMALL = st.booleans() | st.fixed_dictionaries({}, optional={"type": TYPES, "const": VALUES})
OBJECT_SCHEMAS = st.fixed_dictionaries(
    {},
    optional={
        "properties": st.dictionaries(st.sampled_from(NAMES), SMALL, max_size=2),
        "patternProperties": st.dictionaries(st.sampled_from(["", "^a", "b$"]), SMALL, max_size=2),
        "additionalProperties": SMALL,
        "propertyNames": st.fixed_dictionaries({}, optional={"pattern": st.sampled_from(PATTERNS), "maxLength": COUNTS}),
        "required": st.lists(st.sampled_from(NAMES), max_size=2, unique=True),
    },
)
OBJECTS = st.dictionaries(st.sampled_from([*NAMES, "x", "ab", "b", ""]), SCALARS, max_size=4)


@settings(max_examples=600, deadline=None)
@given(OBJECT_SCHEMAS, st.lists(OBJECTS, min_size=1, max_size=4))
def test_object_keywords_together_agree_with_jsonschema(schema: dict[str, Any], instances: list[Any]) -> None:
    """properties, patternProperties and additionalProperties decide together which keys are "additional"."""
    check = compile_schema(schema)
    assert check is not None
    validator = Draft202012Validator(schema)
    for instance in instances:
        assert check(instance) == validator.is_valid(instance), (schema, instance)


@given(VALUES, VALUES)
def test_equality_is_jsonschemas(one: Any, two: Any) -> None:
    assert equal(one, two) == Draft202012Validator({"const": one}).is_valid(two)


def test_values_that_print_alike_are_told_apart() -> None:
    check = compile_schema({"enum": [1]})
    assert check is not None
    assert [check(v) for v in (1, 1.0, True, "1", [1])] == [True, True, False, False, False]
    integer = compile_schema({"type": "integer"})
    assert integer is not None
    assert [integer(v) for v in (1, 1.0, 1.5, True, "1")] == [True, True, False, False, False]


@pytest.mark.parametrize(
    ("schema", "instance"),
    [
        ({"patternProperties": {"": True}, "additionalProperties": False}, {"x": 1}),  # "" joined is no pattern
        ({"patternProperties": {"^x": True, "": True}, "additionalProperties": False}, {"y": 1}),
        ({"properties": {"a": True}, "additionalProperties": {"type": "string"}}, {"a": 1, "b": "s"}),
        ({"type": "integer", "minimum": 1.5}, 2.0),
        ({"oneOf": [{"type": "number"}, {"type": "integer"}]}, 1),  # both: not exactly one
        ({"propertyNames": {"pattern": "^[a-z]+$"}}, {"ab": 1, "A": 2}),
    ],
)
def test_corner_cases_agree_with_jsonschema(schema: dict[str, Any], instance: Any) -> None:
    check = compile_schema(schema)
    assert check is not None
    assert check(instance) == Draft202012Validator(schema).is_valid(instance)


@pytest.mark.parametrize(
    "schema",
    [
        {"uniqueItems": True},  # a keyword it does not implement
        {"format": "date"},
        {"$id": "https://example.com/s"},
        {"$ref": "https://example.com/other"},  # not #/$defs/NAME
        {"$ref": "#/$defs/missing"},
        {"$ref": "#/$defs/a~1b", "$defs": {"a/b": {}}},  # a JSON-pointer escape
        {"type": "float"},
        {"pattern": "("},
        {"minLength": 1.0},
        {"minimum": True},
        {"anyOf": []},
        {"properties": {"a": {"prefixItems": [{}]}}},  # deep inside too
        "not a schema",
    ],
)
def test_what_it_does_not_know_is_left_to_jsonschema(schema: Any) -> None:
    assert compile_schema(schema) is None


def test_data_that_is_not_plain_json_is_left_to_jsonschema() -> None:
    check = compile_schema({})
    assert check is not None and check({"a": [1, 2.0, "x", None, True]})
    for value in ({1: "int key"}, (1, 2), {"a": b"bytes"}, {"a": {1, 2}}, [object()]):
        assert not is_plain(value) and not check(value)


# --- the job schema --------------------------------------------------------------------------------------------

JOB = Draft202012Validator(load_schema())


def example_data() -> list[Any]:
    return [parse_yaml(path.read_text())[0].data for path in EXAMPLES]


def test_the_job_schema_compiles() -> None:
    """If this fails, the schema gained a keyword schema_compiled does not know: every run now imports jsonschema
    (correct, ~60 ms slower). Add the keyword to runner/config/schema_compiled.py (and to the generated schemas
    above)."""
    assert compile_schema(load_schema()) is not None


def paths(data: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into `data` (the root included)."""
    found = [here]
    if isinstance(data, dict):
        for key, value in data.items():
            found += paths(value, (*here, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            found += paths(value, (*here, i))
    return found


def edited(data: Any, draw: Any) -> Any:
    """A copy of `data` with up to three random edits: a value replaced, a key removed or added."""
    data = copy.deepcopy(data)

    def value(strategy: Any) -> Any:  # a drawn value may be a shared constant: a copy, so no edit makes a cycle
        return copy.deepcopy(draw(strategy))

    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(paths(data)))
        parent = data
        for part in path[:-1]:
            parent = parent[part]
        kind = draw(st.sampled_from(["replace", "remove", "add"]))
        if not path:
            if kind == "add" and isinstance(data, dict):
                data[draw(st.sampled_from(["name", "nope", "restart", "env"]))] = value(VALUES)
            continue
        if kind == "replace":
            parent[path[-1]] = value(VALUES | st.text(max_size=70))
        elif kind == "remove" and isinstance(parent, dict):
            del parent[path[-1]]
        elif kind == "add" and isinstance(parent[path[-1]], dict):
            parent[path[-1]][draw(st.sampled_from(["script", "max_restarts", "dir", "x", "min", "max"]))] = value(VALUES)
    return data


@settings(max_examples=800, deadline=None)
@given(st.sampled_from(example_data()), st.data())
def test_on_the_job_schema_it_agrees_with_jsonschema(base: Any, data: Any) -> None:
    spec = edited(base, data.draw)
    assert passes(spec) == JOB.is_valid(spec), spec


def test_every_example_that_jsonschema_accepts_passes() -> None:
    for data in example_data():
        assert passes(data) == JOB.is_valid(data)
    assert any(passes(data) for data in example_data())


# --- in a fresh interpreter ------------------------------------------------------------------------------------

PROBE = ("import sys; from runner.config import load_spec; load_spec(sys.argv[1]); "
         "print('jsonschema' if 'jsonschema' in sys.modules else 'compiled')")


def fresh(argv: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    env["HOME"] = str(home)
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
                          check=False)


def test_a_valid_spec_is_loaded_without_jsonschema_and_nothing_is_written(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    result = fresh(["-c", PROBE, str(ROOT / "examples" / "jobs" / "hello.yaml")], home)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "compiled"
    assert list(home.rglob("*")) == []


def test_a_spec_that_prints_like_a_valid_one_is_refused_in_jsonschemas_words(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    (tmp_path / "hello.py").write_text("")  # validate refuses a missing script, as run does
    good.write_text("name: job\nentrypoint: hello.py\nrestart: {max_restarts: 2}\n")
    bad.write_text("name: job\nentrypoint: hello.py\nrestart: {max_restarts: '2'}\n")  # the same when printed
    assert fresh(["-m", "runner", "validate", str(good)], tmp_path).returncode == 0
    result = fresh(["-m", "runner", "validate", str(bad)], tmp_path)
    assert result.returncode == 2 and "expected an integer, found the string '2'" in result.stderr
