"""`${VAR}` / `${VAR:-default}` substitution in every string value of a parsed spec.

`$${` is a literal `${`. `${VAR:-default}` uses the default when VAR is unset or empty (as in a shell).
An unquoted value is re-read after substitution, so `nproc_per_node: ${NPROC:-2}` is the integer 2.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from runner.config.yaml_source import Document, Path, resolve_plain
from runner.errors import SpecProblem

_TOKEN = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{")


class UnresolvedError(Exception):
    """A ${...} that cannot be resolved; carries the message and fix."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.message, self.fix = message, fix


def substitute(text: str, environ: Mapping[str, str]) -> str:
    """Expand one string; raises UnresolvedError for an unset variable without default or a malformed `${`."""

    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "$${":  # noqa: S105 - a YAML escape, not a password
            return "${"
        name, default = match.group(1), match.group(2)
        if name is None:
            raise UnresolvedError(
                "malformed '${' (expected ${NAME} or ${NAME:-default})", "write $${ for a literal '${'"
            )
        value = environ.get(name)
        if value is None or (value == "" and default is not None):
            if default is None:
                raise UnresolvedError(
                    f"environment variable {name} is not set", f"set {name} or write ${{{name}:-default}}"
                )
            return default
        return value

    return _TOKEN.sub(replace, text)


def interpolate(doc: Document, environ: Mapping[str, str]) -> list[SpecProblem]:
    """Substitute in place through `doc.data`; returns one problem per string that could not be expanded."""
    problems: list[SpecProblem] = []
    doc.data = _walk(doc.data, (), doc, environ, problems)
    return problems


def _walk(value: Any, path: Path, doc: Document, environ: Mapping[str, str], problems: list[SpecProblem]) -> Any:
    if isinstance(value, dict):
        return {k: _walk(v, (*path, k), doc, environ, problems) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, (*path, i), doc, environ, problems) for i, v in enumerate(value)]
    if not isinstance(value, str) or "${" not in value:
        return value
    try:
        expanded = substitute(value, environ)
    except UnresolvedError as err:
        problems.append(doc.problem(path, err.message, err.fix))
        return value
    if path in doc.plain:
        doc.plain[path] = expanded
        return resolve_plain(expanded)
    return expanded
