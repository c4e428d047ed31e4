"""Load a job spec: YAML -> ${VAR} interpolation -> JSON Schema -> JobSpec -> cross-field checks.

Every problem found is reported at once in one SpecError; nothing here raises anything else for bad input.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from runner.config.build import Builder
from runner.config.checks import semantic_problems
from runner.config.interpolate import interpolate
from runner.config.schema_check import schema_problems
from runner.config.spec import JobSpec
from runner.config.yaml_source import parse_yaml
from runner.errors import SpecError, SpecProblem


def load_spec(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> JobSpec:
    """Load and validate the spec file at `path`; relative paths in it resolve against its folder."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(str(path), [SpecProblem("", "file not found", "check the path")]) from None
    except UnicodeDecodeError as err:
        raise SpecError(str(path), [SpecProblem("", f"not UTF-8 text ({err.reason})", "save it as UTF-8")]) from None
    except OSError as err:
        raise SpecError(str(path), [SpecProblem("", f"cannot read: {err.strerror}", "check the path")]) from None
    return load_spec_text(text, source=str(path), base_dir=str(file.resolve().parent), environ=environ)


def load_spec_text(
    text: str,
    source: str = "<string>",
    base_dir: str | os.PathLike[str] = ".",
    environ: Mapping[str, str] | None = None,
) -> JobSpec:
    """Load and validate spec text; `source` names it in problems, `base_dir` anchors relative paths."""
    doc, problems = parse_yaml(text)
    if not isinstance(doc.data, dict):
        raise SpecError(source, problems)
    problems += interpolate(doc, os.environ if environ is None else environ)
    problems += schema_problems(doc, skip=frozenset(p.path for p in problems))
    if problems:
        raise SpecError(source, _ordered(problems))
    builder = Builder(doc, os.path.abspath(base_dir))
    spec = builder.build()
    seen = {p.path for p in builder.problems}  # a value that failed to convert is not checked again
    problems = builder.problems + [p for p in semantic_problems(spec, doc) if p.path not in seen]
    if problems:
        raise SpecError(source, _ordered(problems))
    return spec


def _ordered(problems: list[SpecProblem]) -> list[SpecProblem]:
    """Top to bottom, as the user reads the file; duplicates dropped."""
    unique = list(dict.fromkeys(problems))
    return sorted(unique, key=lambda p: (p.line or 0, p.column or 0))
