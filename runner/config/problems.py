"""Small helpers that word problems for humans: value descriptions, type names, suggestions."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

_MAX_SUGGEST = 100  # longer words are no typo of a field name; difflib's cost grows with the length

_TYPE_NOUNS = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "array": "a list",
    "object": "a mapping",
    "null": "null",
}

_TYPE_FIXES = {
    "string": 'write text (quote it if it looks like a number: "8")',
    "integer": "write a whole number, e.g. 4",
    "number": "write a number, e.g. 2.5",
    "boolean": "write true or false",
    "array": "write a list, e.g. [a, b] or one '- item' per line",
    "object": "write a mapping: indented 'key: value' lines",
}


def type_noun(name: str) -> str:
    """JSON Schema type name -> 'an integer', 'a list', ..."""
    return _TYPE_NOUNS.get(name, name)


def type_fix(names: Iterable[str]) -> str:
    """A fix for a type error, for the first expected type that has one."""
    for name in names:
        if name in _TYPE_FIXES:
            return _TYPE_FIXES[name]
    return ""


def describe(value: object) -> str:  # noqa: PLR0911 - one return per kind of value
    """A found value in words: "the string 'abc'", 'the integer 3', 'a list', 'null'."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the number {value:g}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"the string '{shown}'"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def join_or(items: Iterable[str]) -> str:
    """['a', 'b', 'c'] -> 'a, b or c'."""
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " or " + items[-1]


def suggest(word: str, choices: Iterable[str]) -> str | None:
    """The closest choice to `word` (difflib, case-insensitive), or None when nothing is close."""
    choices = list(choices)
    if len(word) > _MAX_SUGGEST:
        return None
    lowered = {c.lower(): c for c in choices}
    found = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[found[0]] if found else None


def did_you_mean(word: str, choices: Iterable[str], what: str = "keys") -> str:
    """'did you mean 'x'?' or 'allowed {what}: a, b, c'."""
    choices = sorted(choices)
    best = suggest(word, choices)
    if best is not None:
        return f"did you mean '{best}'?"
    return f"allowed {what}: {', '.join(choices)}"
