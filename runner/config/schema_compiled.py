"""A compiled yes/no check of a JSON Schema, so that a valid spec is accepted without importing jsonschema.

jsonschema costs ~60 ms to import, most of a `runner validate` and a fifth of the agent's start-up. Most specs are
valid, and for a valid spec that import buys nothing: there is no problem to word. `compile_schema` turns a schema
into one Python function that answers "would Draft202012Validator find no error here?"; schema_check asks it
first and runs jsonschema only when the answer is no, to find and word the problems.

The answer is exact, not a heuristic. Each keyword below does what jsonschema's own does (the same type rules:
true is no integer, 1.0 is one; the same equality for enum and const: 1 == 1.0, 1 != true; `re.search` for
pattern), and anything this module does not know is never guessed at:
- a schema using any other keyword (or `$id`, `$anchor`, a `$ref` that is not `#/$defs/NAME`, an unknown type
  name, a bad pattern) does not compile (`compile_schema` returns None) and every document goes to jsonschema;
- data that is not plain JSON (any value whose type is not exactly dict with text keys, list, str, int, float,
  bool or None) is answered no, which also sends it to jsonschema.
tests/config/test_config_schema_compiled.py checks the answer against jsonschema's on generated schemas and documents.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sized
from typing import TypeGuard

Check = Callable[[object], bool]
Keyword = Callable[["_Compiler", object, dict[str, object]], Check]

# Keywords that assert nothing (annotations), and the containers of subschemas reached only through $ref.
_IGNORED = frozenset(
    {"$schema", "$comment", "$defs", "title", "description", "default", "examples", "deprecated", "readOnly",
     "writeOnly"}
)
_PLAIN_SCALARS = (str, int, float, bool, type(None))
_DEFS = "#/$defs/"


class UnsupportedSchemaError(Exception):
    """The schema uses something this module does not implement: leave every document to jsonschema."""


def compile_schema(schema: object) -> Check | None:
    """A function answering whether jsonschema finds no error in a document, or None if `schema` is not supported."""
    try:
        check = _Compiler(schema).compile(schema)
    except UnsupportedSchemaError:
        return None
    return lambda data: is_plain(data) and check(data)


def is_plain(data: object) -> bool:
    """True if `data` holds only dicts with text keys, lists, text, numbers, booleans and None (those exact types)."""
    todo = [data]
    while todo:
        value = todo.pop()
        if type(value) is dict:
            if any(type(key) is not str for key in value):
                return False
            todo.extend(value.values())
        elif type(value) is list:
            todo.extend(value)
        elif type(value) not in _PLAIN_SCALARS:
            return False
    return True


def is_type(value: object, name: str) -> bool:
    """The draft 2020-12 type rules as jsonschema applies them, for plain data."""
    if name == "integer":
        return type(value) is int or (type(value) is float and value.is_integer())
    if name == "number":
        return type(value) in (int, float)
    return isinstance(value, _TYPES[name]) and (name != "boolean" or type(value) is bool)


_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str, "boolean": bool, "null": type(None), "array": list, "object": dict,
}
_TYPE_NAMES = frozenset({*_TYPES, "integer", "number"})


def equal(one: object, two: object) -> bool:
    """Equality as jsonschema has it (enum, const): 1 == 1.0, but true is neither 1 nor 1.0; in lists and dicts too."""
    if one is two:
        return True
    if isinstance(one, str) or isinstance(two, str):
        return bool(one == two)
    if isinstance(one, list) and isinstance(two, list):
        return len(one) == len(two) and all(equal(a, b) for a, b in zip(one, two, strict=True))
    if isinstance(one, dict) and isinstance(two, dict):
        return len(one) == len(two) and all(key in two and equal(value, two[key]) for key, value in one.items())
    if isinstance(one, bool) or isinstance(two, bool):
        return False  # `one is two` above took true == true
    return bool(one == two)


def _always(_: object) -> bool:
    return True


def _never(_: object) -> bool:
    return False


def _number(value: object) -> TypeGuard[int | float]:
    return type(value) in (int, float)


class _Compiler:
    """Compiles one schema; `$defs` entries are compiled once, on first reference (recursion allowed)."""

    def __init__(self, root: object) -> None:
        defs = root.get("$defs", {}) if isinstance(root, dict) else {}
        if not isinstance(defs, dict):
            raise UnsupportedSchemaError("$defs")
        self.defs: dict[str, object] = defs
        self.compiled: dict[str, Check] = {}

    def compile(self, schema: object) -> Check:
        """The check of one (sub)schema: every keyword's check must hold."""
        if schema is True:
            return _always
        if schema is False:
            return _never
        if not isinstance(schema, dict):
            raise UnsupportedSchemaError(repr(schema))
        checks: list[Check] = []
        for keyword, value in schema.items():
            if keyword in _IGNORED or keyword.startswith("x-"):
                continue
            build = _KEYWORDS.get(keyword)
            if build is None:
                raise UnsupportedSchemaError(keyword)
            checks.append(build(self, value, schema))
        if not checks:
            return _always
        if len(checks) == 1:
            return checks[0]
        every = tuple(checks)
        return lambda value: all(check(value) for check in every)

    def ref(self, ref: object) -> Check:
        """`#/$defs/NAME`, looked up when used so that a definition may refer to itself."""
        name = ref.removeprefix(_DEFS) if isinstance(ref, str) and ref.startswith(_DEFS) else None
        if name is None or any(c in name for c in "/~%") or name not in self.defs:
            raise UnsupportedSchemaError(f"$ref {ref!r}")
        if name not in self.compiled:
            self.compiled[name] = _never  # placeholder while compiling (a self-reference is looked up later)
            self.compiled[name] = self.compile(self.defs[name])
        table = self.compiled

        def deferred(value: object) -> bool:  # looked up at each call: the entry may still be the placeholder now
            return table[name](value)

        return deferred

    def many(self, schemas: object) -> list[Check]:
        """The checks of a non-empty list of subschemas (anyOf, allOf, oneOf)."""
        if not isinstance(schemas, list) or not schemas:
            raise UnsupportedSchemaError(repr(schemas))
        return [self.compile(sub) for sub in schemas]


def _count(value: object) -> int:
    if type(value) is not int or value < 0:
        raise UnsupportedSchemaError(repr(value))
    return value


def _limit(value: object) -> int | float:
    if not _number(value):
        raise UnsupportedSchemaError(repr(value))
    limit: int | float = value
    return limit


def _pattern(value: object) -> re.Pattern[str]:
    if not isinstance(value, str):
        raise UnsupportedSchemaError(repr(value))
    try:
        return re.compile(value)
    except re.error as e:
        raise UnsupportedSchemaError(value) from e


def _type(_: _Compiler, value: object, __: dict[str, object]) -> Check:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) and n in _TYPE_NAMES for n in names):
        raise UnsupportedSchemaError(f"type {value!r}")
    return lambda instance: any(is_type(instance, name) for name in names)


def _enum(_: _Compiler, value: object, __: dict[str, object]) -> Check:
    if not isinstance(value, list):
        raise UnsupportedSchemaError(f"enum {value!r}")
    return lambda instance: any(equal(item, instance) for item in value)


def _const(_: _Compiler, value: object, __: dict[str, object]) -> Check:
    return lambda instance: equal(instance, value)


def _minimum(_: _Compiler, value: object, __: dict[str, object]) -> Check:
    limit = _limit(value)
    return lambda instance: not _number(instance) or not instance < limit


def _maximum(_: _Compiler, value: object, __: dict[str, object]) -> Check:
    limit = _limit(value)
    return lambda instance: not _number(instance) or not instance > limit


def _exclusive_minimum(_: _Compiler, value: object, __: dict[str, object]) -> Check:
    limit = _limit(value)
    return lambda instance: not _number(instance) or not instance <= limit


def _exclusive_maximum(_: _Compiler, value: object, __: dict[str, object]) -> Check:
    limit = _limit(value)
    return lambda instance: not _number(instance) or not instance >= limit


def _pattern_keyword(_: _Compiler, value: object, __: dict[str, object]) -> Check:
    search = _pattern(value).search
    return lambda instance: not isinstance(instance, str) or search(instance) is not None


def _items(compiler: _Compiler, value: object, __: dict[str, object]) -> Check:
    each = compiler.compile(value)  # prefixItems is not supported, so `items` applies to every item
    return lambda instance: not isinstance(instance, list) or all(each(item) for item in instance)


def _size(kind: type[Sized], *, at_least: bool) -> Keyword:
    """A bound on len() of a `kind`: minLength / maxLength, minItems / maxItems, minProperties / maxProperties."""

    def keyword(_: _Compiler, value: object, __: dict[str, object]) -> Check:
        size = _count(value)
        if at_least:
            return lambda instance: not isinstance(instance, kind) or len(instance) >= size
        return lambda instance: not isinstance(instance, kind) or len(instance) <= size

    return keyword


def _required(_: _Compiler, value: object, __: dict[str, object]) -> Check:
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise UnsupportedSchemaError(f"required {value!r}")
    return lambda instance: not isinstance(instance, dict) or all(name in instance for name in value)


def _properties(compiler: _Compiler, value: object, __: dict[str, object]) -> Check:
    if not isinstance(value, dict):
        raise UnsupportedSchemaError(f"properties {value!r}")
    checks = {name: compiler.compile(sub) for name, sub in value.items()}

    def check(instance: object) -> bool:
        if not isinstance(instance, dict):
            return True
        return all(name not in instance or sub(instance[name]) for name, sub in checks.items())

    return check


def _pattern_properties(compiler: _Compiler, value: object, __: dict[str, object]) -> Check:
    if not isinstance(value, dict):
        raise UnsupportedSchemaError(f"patternProperties {value!r}")
    checks = [(_pattern(pattern).search, compiler.compile(sub)) for pattern, sub in value.items()]

    def check(instance: object) -> bool:
        if not isinstance(instance, dict):
            return True
        return all(sub(item) for search, sub in checks for key, item in instance.items() if search(key))

    return check


def _additional_properties(compiler: _Compiler, value: object, schema: dict[str, object]) -> Check:
    known = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    if not isinstance(known, dict) or not isinstance(patterns, dict):
        raise UnsupportedSchemaError("additionalProperties")
    # As jsonschema does: the patterns joined into one alternation, and none at all when that text is empty (so
    # `patternProperties: {"": ...}` matches every key, yet leaves every key to additionalProperties too).
    joined = "|".join(patterns)
    search = _pattern(joined).search if joined else None
    each = compiler.compile(value)

    def check(instance: object) -> bool:
        if not isinstance(instance, dict):
            return True
        return all(
            each(item)
            for key, item in instance.items()
            if key not in known and (search is None or search(key) is None)
        )

    return check


def _property_names(compiler: _Compiler, value: object, __: dict[str, object]) -> Check:
    each = compiler.compile(value)
    return lambda instance: not isinstance(instance, dict) or all(each(key) for key in instance)


def _any_of(compiler: _Compiler, value: object, __: dict[str, object]) -> Check:
    branches = compiler.many(value)
    return lambda instance: any(branch(instance) for branch in branches)


def _all_of(compiler: _Compiler, value: object, __: dict[str, object]) -> Check:
    branches = compiler.many(value)
    return lambda instance: all(branch(instance) for branch in branches)


def _one_of(compiler: _Compiler, value: object, __: dict[str, object]) -> Check:
    branches = compiler.many(value)
    return lambda instance: sum(1 for branch in branches if branch(instance)) == 1


def _not(compiler: _Compiler, value: object, __: dict[str, object]) -> Check:
    inner = compiler.compile(value)
    return lambda instance: not inner(instance)


def _ref(compiler: _Compiler, value: object, __: dict[str, object]) -> Check:
    return compiler.ref(value)


_KEYWORDS: dict[str, Keyword] = {
    "type": _type,
    "enum": _enum,
    "const": _const,
    "minimum": _minimum,
    "maximum": _maximum,
    "exclusiveMinimum": _exclusive_minimum,
    "exclusiveMaximum": _exclusive_maximum,
    "minLength": _size(str, at_least=True),
    "maxLength": _size(str, at_least=False),
    "pattern": _pattern_keyword,
    "minItems": _size(list, at_least=True),
    "maxItems": _size(list, at_least=False),
    "items": _items,
    "minProperties": _size(dict, at_least=True),
    "maxProperties": _size(dict, at_least=False),
    "required": _required,
    "properties": _properties,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "propertyNames": _property_names,
    "anyOf": _any_of,
    "allOf": _all_of,
    "oneOf": _one_of,
    "not": _not,
    "$ref": _ref,
}
