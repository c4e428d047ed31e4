"""JSON-Schema validation of a parsed spec, every error turned into a located, worded SpecProblem.

A spec that passes is told apart by the schema compiled into one yes/no function (runner/config/schema_compiled.py,
exact); jsonschema (~60 ms to import) is imported only to find and word the problems of a spec that does not.
"""

from __future__ import annotations

import functools
import itertools
import json
from dataclasses import dataclass
from pathlib import Path as FilePath
from typing import TYPE_CHECKING, Any

from runner.config.limits import MAX_PROBLEMS
from runner.config.problems import describe, did_you_mean, join_or, type_fix, type_noun
from runner.config.schema_compiled import Check, compile_schema
from runner.config.yaml_source import Document, Path, dotted, shown
from runner.errors import SpecProblem

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator, ValidationError

# Package data, so an installed wheel has it too; schemas/job.schema.json is the same file for editors
# (tests/config/test_config_schema.py checks they are byte-identical).
SCHEMA_FILE = FilePath(__file__).resolve().parent.parent / "job.schema.json"

_FORBIDDEN = {
    ("rendezvous.auth", "password"): (
        "an inline password is not allowed (the spec is logged, hashed and shared between nodes)",
        "remove it and set password_env: VAR (a variable holding the password) or password_file: PATH",
    ),
}
_REQUIRED_FIXES = {
    "name": "add `name: my-job` (letters, digits, '_', '.', '-')",
    "entrypoint": "add `entrypoint: train.py` (or entrypoint: {module: pkg.train} / {command: [...]})",
}


@functools.cache
def load_schema_text() -> str:
    """The job schema's text (runner/job.schema.json), read once."""
    return SCHEMA_FILE.read_text(encoding="utf-8")


@functools.cache
def load_schema() -> dict[str, Any]:
    """The job schema, parsed once."""
    schema: dict[str, Any] = json.loads(load_schema_text())
    return schema


@functools.cache
def _compiled() -> Check | None:
    """The job schema as one yes/no function (None if it used a keyword schema_compiled does not know)."""
    return compile_schema(load_schema())


def passes(data: object) -> bool:
    """True if jsonschema would find no problem in `data`, without importing it; False: ask jsonschema."""
    check = _compiled()
    return check is not None and check(data)


@functools.cache
def _validator() -> Draft202012Validator:
    from jsonschema import Draft202012Validator

    return Draft202012Validator(load_schema())


def schema_problems(doc: Document, skip: frozenset[str] = frozenset()) -> list[SpecProblem]:
    """Every schema violation in `doc.data`, except at the dotted paths in `skip` (already reported).

    A document that passes the compiled schema has no problem at all (whatever `skip` holds), so jsonschema is
    only run on one that does not. At most MAX_PROBLEMS problems are collected.
    """
    if passes(doc.data):
        return []
    found: dict[SpecProblem, None] = {}  # ordered set: de-duplication stays linear
    for error in _validator().iter_errors(doc.data):
        for problem in _explain(_Error.of(error), doc):
            if problem.path not in skip:
                found[problem] = None
        if len(found) > MAX_PROBLEMS:  # one more than shown, so that the list says it was cut
            break
    return list(found)


def invalid_parts(data: dict[str, Any]) -> tuple[set[Path], set[str]] | None:
    """What to drop from `data` so that it passes the schema, for one round (for salvage, not for users).

    (paths to drop, required top-level keys missing), or None when data passes. A path inside a list stands
    for the whole list, so that the indexes of what remains do not move.
    """
    if passes(data):
        return None
    drop: set[Path] = set()
    missing: set[str] = set()
    for error in itertools.islice(_validator().iter_errors(data), MAX_PROBLEMS):
        path: Path = tuple(error.absolute_path)
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            known = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
            drop |= {(*path, key) for key in error.instance if key not in known}
        elif path:
            drop.add(path)
        elif error.validator == "required":
            missing |= {key for key in error.validator_value if key not in data}
    return None if not drop and not missing else (drop, missing)


@dataclass(frozen=True)
class _Error:
    """The parts of a jsonschema ValidationError that problems are worded from, plainly typed."""

    kind: str  # the failing keyword: "type", "enum", "anyOf", ...
    path: Path  # into the instance
    instance: object
    value: Any  # the keyword's value in the schema
    schema: dict[str, Any]  # the subschema holding the keyword
    context: tuple[_Error, ...]  # for anyOf/oneOf: the branches' errors
    branch: int  # inside anyOf/oneOf: the branch index (else -1)
    message: str
    on_key: bool  # raised by propertyNames: `instance` is a key of the mapping at `path`

    @classmethod
    def of(cls, error: ValidationError) -> _Error:
        """Copy what we need out of a jsonschema.ValidationError."""
        schema_path = list(error.relative_schema_path)
        return cls(
            kind=str(error.validator),
            path=tuple(error.absolute_path),
            instance=error.instance,
            value=error.validator_value,
            schema=error.schema if isinstance(error.schema, dict) else {},
            context=tuple(cls.of(sub) for sub in error.context or ()),
            branch=schema_path[0] if schema_path and isinstance(schema_path[0], int) else -1,
            message=str(error.message),
            on_key="propertyNames" in schema_path,
        )


def _explain(error: _Error, doc: Document) -> list[SpecProblem]:
    if error.on_key:
        return [_pattern_key(error, doc, error.path)]
    handler = _HANDLERS.get(error.kind, _generic)
    return handler(error, doc, error.path)


def _alternatives(error: _Error, doc: Document, path: Path) -> list[SpecProblem]:
    """anyOf/oneOf: explain the branches whose type fits the value; else list what would have fitted."""
    branches: list[dict[str, Any]] = error.value
    fitting = {i for i, branch in enumerate(branches) if _accepts_type(branch, error.instance)}
    inner = [sub for sub in error.context if sub.branch in fitting]
    if inner:
        return [problem for sub in inner for problem in _explain(sub, doc)]
    titles = [_title(branch) for branch in branches]
    fix = error.schema.get("x-fix") or _fix_of_refs(branches) or error.schema.get("description", "")
    return [doc.problem(path, f"expected {join_or(titles)}, found {describe(error.instance)}", fix)]


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref", "")
    if ref.startswith("#/$defs/"):
        target: dict[str, Any] = load_schema()["$defs"][ref.removeprefix("#/$defs/")]
        return target
    return schema


def _accepts_type(schema: dict[str, Any], instance: object) -> bool:
    schema = _resolve(schema)
    if "anyOf" in schema or "oneOf" in schema:
        branches = schema.get("anyOf") or schema.get("oneOf") or []
        return any(_accepts_type(branch, instance) for branch in branches)
    types = schema.get("type")
    if types is None and ("enum" in schema or "const" in schema):  # typed by its values: enum [auto, gpu] is text
        values = schema.get("enum", [schema.get("const")])
        return any(_json_type(value) == _json_type(instance) for value in values)
    if types is None:
        return True
    return any(_is_type(instance, t) for t in ([types] if isinstance(types, str) else types))


def _json_type(value: object) -> str:
    """The JSON type of a value ('number' for ints and floats alike)."""
    return next(name for name in ("boolean", "number", "string", "array", "object", "null") if _is_type(value, name))


def _is_type(instance: object, name: str) -> bool:
    if isinstance(instance, bool):
        return name == "boolean"
    checks: dict[str, type | tuple[type, ...]] = {
        "string": str, "integer": int, "number": (int, float), "boolean": bool,
        "array": list, "object": dict, "null": type(None),
    }
    return isinstance(instance, checks[name])


def _title(schema: dict[str, Any]) -> str:
    resolved = _resolve(schema)
    if "title" in resolved:
        return str(resolved["title"])
    types = resolved.get("type", "value")
    return join_or(type_noun(t) for t in ([types] if isinstance(types, str) else types))


def _fix_of_refs(branches: list[dict[str, Any]]) -> str:
    for branch in branches:
        resolved = _resolve(branch)
        for sub in resolved.get("anyOf", []):
            if "x-fix" in sub:
                return str(sub["x-fix"])
    return ""


def _unknown_keys(error: _Error, doc: Document, path: Path) -> list[SpecProblem]:
    allowed = list(error.schema.get("properties", {}))
    problems = []
    for key in error.instance if isinstance(error.instance, dict) else ():  # additionalProperties: a mapping
        if key in allowed:
            continue
        message, fix = _FORBIDDEN.get((dotted(path), key), (f"unknown key '{shown(key)}'", did_you_mean(key, allowed)))
        line, column = doc.where((*path, key), key=True)
        problems.append(SpecProblem(dotted(path), message, fix, line, column))
        if len(problems) > MAX_PROBLEMS:
            break
    return problems


def _required(error: _Error, doc: Document, path: Path) -> list[SpecProblem]:
    problems, instance = [], error.instance if isinstance(error.instance, dict) else {}  # required: a mapping
    for key in error.value:
        if key not in instance:
            where = dotted((*path, key))
            fix = _REQUIRED_FIXES.get(where, f"add '{key}:' ({error.schema['properties'][key]['description']})")
            problems.append(doc.problem(path, f"missing required key '{key}'", fix))
    return problems


def _type(error: _Error, doc: Document, path: Path) -> list[SpecProblem]:
    expected = [error.value] if isinstance(error.value, str) else list(error.value)
    message = f"expected {join_or(type_noun(t) for t in expected)}, found {describe(error.instance)}"
    return [doc.problem(path, message, type_fix(expected))]


def _enum(error: _Error, doc: Document, path: Path) -> list[SpecProblem]:
    allowed = [str(v) for v in error.value]
    message = f"{describe(error.instance)} is not one of: {', '.join(allowed)}"
    fix = did_you_mean(error.instance, allowed, "values") if isinstance(error.instance, str) else (
        f"allowed values: {', '.join(allowed)}")
    return [doc.problem(path, message, fix)]


def _const(error: _Error, doc: Document, path: Path) -> list[SpecProblem]:
    value = json.dumps(error.value)
    return [doc.problem(path, f"must be {value}, found {describe(error.instance)}", f"write {value}")]


def _bound(error: _Error, doc: Document, path: Path) -> list[SpecProblem]:
    op = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}[error.kind]
    limit = error.value
    message = f"must be {op} {limit}, found {describe(error.instance)}"
    return [doc.problem(path, message, f"use a value {op} {limit}")]


def _not_empty(error: _Error, doc: Document, path: Path) -> list[SpecProblem]:
    return [doc.problem(path, "must not be empty", "give at least one item" if error.kind == "minItems" else "")]


def _pattern(error: _Error, doc: Document, path: Path) -> list[SpecProblem]:
    hint = error.schema.get("x-hint", f"text matching {error.value}")
    message = f"expected {hint}, found {describe(error.instance)}"
    return [doc.problem(path, message, error.schema.get("x-fix", ""))]


def _pattern_key(error: _Error, doc: Document, path: Path) -> SpecProblem:
    hint = error.schema.get("x-hint", f"a key matching {error.schema.get('pattern')}")
    line, column = doc.where((*path, str(error.instance)), key=True)  # propertyNames: `instance` is a key
    message = f"key '{shown(str(error.instance))}' is not {hint}"
    return SpecProblem(dotted(path), message, error.schema.get("x-fix", ""), line, column)


def _generic(error: _Error, doc: Document, path: Path) -> list[SpecProblem]:
    return [doc.problem(path, shown(error.message, 200), "")]


_HANDLERS = {
    "anyOf": _alternatives,
    "oneOf": _alternatives,
    "additionalProperties": _unknown_keys,
    "required": _required,
    "type": _type,
    "enum": _enum,
    "const": _const,
    "minimum": _bound,
    "maximum": _bound,
    "exclusiveMinimum": _bound,
    "exclusiveMaximum": _bound,
    "minItems": _not_empty,
    "minLength": _not_empty,
    "pattern": _pattern,
}
