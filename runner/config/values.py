"""Checks on every value of a parsed, interpolated spec that no schema keyword can say.

- integers fit in 64 bits, numbers are finite (no .nan, .inf, 1e999);
- no string or key holds a NUL byte or a lone surrogate (the OS and UTF-8 cannot carry them);
- no string is longer than one execve argument may be (MAX_ARG_BYTES with its NUL).

`env` values are exempt from the number rules: a worker gets the text written (`SEED: 1e999` is "1e999").
"""

from __future__ import annotations

import math
import re

from runner.config.limits import MAX_ARG_BYTES, MAX_INT, MIN_INT
from runner.config.yaml_source import Document, Path, shown
from runner.errors import SpecProblem
from runner.json_types import JSON

_UNSAFE = re.compile("[\x00\ud800-\udfff]")
_MAX_CHARS = MAX_ARG_BYTES - 1  # a string of at most this many characters may still be too many bytes


def value_problems(doc: Document) -> list[SpecProblem]:
    """Every value that breaks a rule above, located in `doc`."""
    problems: list[SpecProblem] = []
    stack: list[tuple[Path, JSON]] = [((), doc.data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str) and _UNSAFE.search(key):
                    problems.append(doc.problem((*path, key), f"the key {_unsafe(key)}", "rename the key", key=True))
                stack.append(((*path, key), item))
        elif isinstance(value, list):
            stack.extend(((*path, i), item) for i, item in enumerate(value))
        else:
            found = _scalar_problem(value, in_env=path[:1] == ("env",))
            if found is not None:
                problems.append(doc.problem(path, *found))
    problems.reverse()  # the stack visited the document backwards
    return problems


def _scalar_problem(value: object, *, in_env: bool) -> tuple[str, str] | None:
    if isinstance(value, str):
        return _string_problem(value)
    if in_env or isinstance(value, bool):
        return None
    if isinstance(value, int) and not MIN_INT <= value <= MAX_INT:
        return f"the integer ({value.bit_length()} bits) does not fit in 64 bits", "use a smaller number"
    if isinstance(value, float) and not math.isfinite(value):
        return (f"must be a finite number, found {value}",
                "write a finite number such as 30 or 30s (.inf, .nan and 1e999 are refused)")
    return None


def _string_problem(value: str) -> tuple[str, str] | None:
    if _UNSAFE.search(value):
        return f"the value {_unsafe(value)}", "remove that character"
    if len(value) > _MAX_CHARS // 4 and len(value.encode("utf-8")) > _MAX_CHARS:
        size = len(value.encode("utf-8"))
        message = (f"the value is {size} bytes long; no argument, path or environment value may exceed "
                   f"{_MAX_CHARS} bytes (Linux MAX_ARG_STRLEN)")
        return message, "shorten it, or put the data in a file the job reads"
    return None


def _unsafe(text: str) -> str:
    char = _UNSAFE.search(text)
    assert char is not None
    what = "a NUL byte" if char.group() == "\x00" else f"a lone surrogate U+{ord(char.group()):04X}"
    return f"{shown(text.encode('unicode_escape').decode('ascii'))!r} contains {what} (at index {char.start()})"
