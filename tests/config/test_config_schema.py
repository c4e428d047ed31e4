"""schemas/job.schema.json: well-formed, documented, and a faithful mirror of runner/config/spec.py."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from runner.config import load_spec_text
from runner.config.durations import parse_duration
from runner.config.schema_check import load_schema
from runner.config.spec import (
    TLS,
    Auth,
    Backoff,
    Entrypoint,
    Health,
    JobSpec,
    Lighthouse,
    Logs,
    Nodes,
    Rendezvous,
    ReplicaGroups,
    Restart,
    Shutdown,
    Watchdog,
)

SCHEMA_FILE = Path(__file__).parents[2] / "schemas" / "job.schema.json"
SCHEMA: dict[str, Any] = json.loads(SCHEMA_FILE.read_text())


def objects(schema: Any, where: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every subschema that declares properties, with a JSON-pointer-ish location."""
    if isinstance(schema, dict):
        if "properties" in schema:
            yield where, schema
        for key, value in schema.items():
            yield from objects(value, f"{where}/{key}")
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            yield from objects(value, f"{where}/{i}")


def object_branch(schema: dict[str, Any]) -> dict[str, Any]:
    """The mapping form of a property (itself, or its anyOf branch that has properties)."""
    if "properties" in schema:
        return schema
    return next(b for b in schema["anyOf"] if "properties" in b)


def test_schema_is_valid_draft_2020_12() -> None:
    """The file is a valid 2020-12 schema and is what the loader uses."""
    Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert load_schema() == SCHEMA


def test_every_object_is_closed_and_every_property_documented_and_defaulted() -> None:
    """additionalProperties false on every object; description on every property; default unless required."""
    missing: list[str] = []
    for where, obj in objects(SCHEMA):
        if obj.get("additionalProperties") is not False:
            missing.append(f"{where}: additionalProperties is not false")
        required = set(obj.get("required", ()))
        for name, prop in obj["properties"].items():
            if "description" not in prop:
                missing.append(f"{where}/{name}: no description")
            if "default" not in prop and name not in required:
                missing.append(f"{where}/{name}: no default")
    assert missing == []
    assert len(list(objects(SCHEMA))) >= 11


def test_version_is_const_one() -> None:
    """version: const 1, default 1."""
    assert SCHEMA["properties"]["version"] == {"const": 1, "description": "Spec format version.", "default": 1}


MIRROR = [
    ((), JobSpec),
    (("entrypoint",), Entrypoint),
    (("nodes",), Nodes),
    (("rendezvous",), Rendezvous),
    (("rendezvous", "tls"), TLS),
    (("rendezvous", "auth"), Auth),
    (("restart",), Restart),
    (("restart", "backoff"), Backoff),
    (("shutdown",), Shutdown),
    (("logs",), Logs),
    (("watchdog",), Watchdog),
    (("health",), Health),
    (("replica_groups",), ReplicaGroups),
    (("replica_groups", "lighthouse"), Lighthouse),
]


def schema_at(path: tuple[str, ...]) -> dict[str, Any]:
    """The object schema for a dotted location."""
    schema = SCHEMA
    for part in path:
        schema = object_branch(schema["properties"][part])
    return schema


def as_json(value: Any) -> Any:
    """A dataclass default in the form the schema writes it."""
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    return json.loads(json.dumps(value))


@pytest.mark.parametrize(("path", "cls"), MIRROR, ids=[c.__name__ for _, c in MIRROR])
def test_schema_fields_mirror_the_dataclass(path: tuple[str, ...], cls: type) -> None:
    """Same field names, and each schema default equals the dataclass default (JSON form)."""
    schema = schema_at(path)
    props, required = schema["properties"], set(schema.get("required", ()))
    fields = {f.name: f for f in dataclasses.fields(cls)}
    assert set(props) == set(fields)
    for name, field in fields.items():
        if name in required:  # no default in the schema: the user must write it
            assert "default" not in props[name]
            continue
        if field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            pytest.fail(f"{cls.__name__}.{name} has no default but is optional in the schema")
        if (cls, name) == (JobSpec, "nodes"):
            assert props[name]["default"] == 1 and default == Nodes(1, 1)
        elif (cls, name) == (JobSpec, "env"):
            assert props[name]["default"] == {} and default == ()
        elif (cls, name) == (Health, "gpus"):  # auto is resolved when the spec is loaded: 0 for a spec without GPUs
            assert props[name]["default"] == "auto" and default == 0
        elif (cls, name) == (JobSpec, "health"):
            assert props[name]["default"] == {**as_json(default), "gpus": "auto"}
        else:
            assert props[name]["default"] == as_json(default), name


def test_spec_written_from_schema_defaults_loads_to_dataclass_defaults() -> None:
    """Writing out every schema default as YAML loads to exactly the dataclass-default JobSpec."""
    data = {name: prop["default"] for name, prop in SCHEMA["properties"].items() if "default" in prop}
    data |= {"name": "job", "entrypoint": "train.py"}
    spec = load_spec_text(yaml.safe_dump(data), base_dir="/base", environ={})
    assert spec == JobSpec(name="job", entrypoint=Entrypoint(script="train.py"), cwd="/base")


DURATION = SCHEMA["$defs"]["duration"]["anyOf"][1]["pattern"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("30s", 30), ("5m", 300), ("1h", 3600), ("1h30m", 5400), ("2d", 172800), ("1.5s", 1.5),
     ("45", 45), ("1m 30s", 90), (".5s", 0.5)],
)
def test_duration_pattern_and_parser_agree_on_good_values(text: str, seconds: float) -> None:
    """What the schema pattern accepts, the parser converts."""
    assert re.search(DURATION, text)
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5 minutes", "m", "1x", "-3s", "1h30", "ms5", "1.2.3s"])
def test_duration_pattern_and_parser_agree_on_bad_values(text: str) -> None:
    """What the schema pattern rejects, the parser rejects too."""
    assert not re.search(DURATION, text)
    with pytest.raises(ValueError, match="not a"):
        parse_duration(text)


def test_the_schema_has_one_source_shipped_in_the_package() -> None:
    """runner/job.schema.json is the file (package data, so a wheel has it); schemas/job.schema.json links to it."""
    package_copy = Path(__file__).parents[2] / "runner" / "job.schema.json"
    assert package_copy.is_file() and not package_copy.is_symlink()
    assert SCHEMA_FILE.is_symlink() and SCHEMA_FILE.resolve() == package_copy.resolve()
