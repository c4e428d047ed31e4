"""`${VAR}` / `${VAR:-default}` substitution in every string value of a parsed spec.

`$${` is a literal `${`. `${VAR:-default}` uses the default when VAR is unset or empty (as in a shell).
An unquoted value is re-read after substitution, so `nproc_per_node: ${NPROC:-2}` is the integer 2.
All substitutions of one document together may add at most MAX_EXPANDED_CHARS characters: a line of many
`${BIG}` cannot blow up memory.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from runner.config.limits import MAX_EXPANDED_CHARS
from runner.config.yaml_source import Document, Path, resolve_plain
from runner.errors import SpecProblem
from runner.json_types import JSON

_TOKEN = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{")


class UnresolvedError(Exception):
    """A ${...} that cannot be resolved; carries the message and fix."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.message, self.fix = message, fix


class Budget:
    """Characters that substitutions may still add (shared by every string of one document)."""

    def __init__(self, chars: int = MAX_EXPANDED_CHARS) -> None:
        self.chars = chars

    def spend(self, added: int) -> None:
        """Take `added` characters; UnresolvedError once the budget is spent."""
        self.chars -= added
        if self.chars < 0:
            raise UnresolvedError(f"${{...}} substitutions add more than {MAX_EXPANDED_CHARS} characters",
                                  "use fewer or shorter variables")


def substitute(text: str, environ: Mapping[str, str], budget: Budget | None = None) -> str:
    """Expand one string.

    Raises UnresolvedError for an unset variable without default, a malformed `${`, or substitutions past
    `budget`.
    """
    budget = budget or Budget()

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
            budget.spend(len(default))
            return default
        budget.spend(len(value))
        return value

    return _TOKEN.sub(replace, text)


def interpolate(doc: Document, environ: Mapping[str, str]) -> list[SpecProblem]:
    """Substitute in place through `doc.data`; returns one problem per string that could not be expanded."""
    problems: list[SpecProblem] = []
    doc.data = _Expander(doc, environ, problems).walk(doc.data, ())
    return problems


class _Expander:
    """One pass over the data (depth bounded by the parser), substituting in every string."""

    def __init__(self, doc: Document, environ: Mapping[str, str], problems: list[SpecProblem]) -> None:
        self.doc, self.environ, self.problems, self.budget = doc, environ, problems, Budget()

    def walk(self, value: JSON, path: Path) -> JSON:
        """`value` with every string expanded (new containers)."""
        if isinstance(value, dict):
            return {k: self.walk(v, (*path, k)) for k, v in value.items()}
        if isinstance(value, list):
            return [self.walk(v, (*path, i)) for i, v in enumerate(value)]
        if not isinstance(value, str) or "${" not in value:
            return value
        names = tuple(m.group(1) for m in _TOKEN.finditer(value) if m.group(1) is not None)
        if names:
            self.doc.variables[path] = names  # what the value depends on (preflight: a compute node may differ)
        try:
            expanded = substitute(value, self.environ, self.budget)
        except UnresolvedError as err:
            self.problems.append(self.doc.problem(path, err.message, err.fix))
            return value
        return self.reread(expanded, path) if path in self.doc.plain else expanded

    def reread(self, expanded: str, path: Path) -> JSON:
        """An unquoted value after substitution, read again as YAML would (`${N:-2}` -> 2)."""
        self.doc.plain[path] = expanded
        try:
            return resolve_plain(expanded)
        except ValueError as err:
            self.problems.append(self.doc.problem(path, f"after substitution: {err}", "quote the value"))
            return expanded
