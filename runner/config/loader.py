"""Load a job spec: file -> YAML -> ${VAR} -> value rules -> JSON Schema -> JobSpec -> cross-field checks.

$RUNNER_HOSTED_ENDPOINT, set by a cluster template, replaces a hosted rendezvous's endpoints after ${VAR}
(runner/config/hosted_endpoint.py).

Every problem found is reported at once in one SpecError (cross-field problems too, even when the schema also
fails: see salvage); nothing here raises anything else for any input. Each stage is bounded (runner/config/
limits.py), so any file is accepted or refused in well under a second and a few tens of MB.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from runner.config.build import Builder
from runner.config.checks import semantic_problems
from runner.config.hosted_endpoint import apply_hosted_endpoint
from runner.config.interpolate import interpolate
from runner.config.limits import MAX_PROBLEMS
from runner.config.salvage import salvage_problems
from runner.config.schema_check import schema_problems
from runner.config.source_file import read_spec_file
from runner.config.spec import JobSpec
from runner.config.values import value_problems
from runner.config.yaml_source import Document, parse_yaml
from runner.errors import SpecError, SpecProblem


def load_spec(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None, *,
              devices_here: bool = True) -> JobSpec:
    """Load and validate the spec file at `path`; relative paths in it resolve against its folder.

    `devices_here=False` (a template rendered on a login node): `nproc_per_node: gpu|xpu` needs no device here.
    """
    return load_spec_document(path, environ, devices_here=devices_here)[0]


def load_spec_document(
    path: str | os.PathLike[str], environ: Mapping[str, str] | None = None, *, devices_here: bool = True
) -> tuple[JobSpec, Document]:
    """load_spec, plus the parsed document (to locate later findings, e.g. preflight's, at a line)."""
    text = read_spec_file(path)
    base_dir = str(Path(os.fspath(path)).resolve().parent)
    return load_document(text, source=os.fspath(path), base_dir=base_dir, environ=environ, devices_here=devices_here)


def load_spec_text(
    text: str,
    source: str = "<string>",
    base_dir: str | os.PathLike[str] = ".",
    environ: Mapping[str, str] | None = None,
) -> JobSpec:
    """Load and validate spec text; `source` names it in problems, `base_dir` anchors relative paths."""
    return load_document(text, source, base_dir, environ)[0]


def load_document(
    text: str,
    source: str = "<string>",
    base_dir: str | os.PathLike[str] = ".",
    environ: Mapping[str, str] | None = None,
    *,
    devices_here: bool = True,
) -> tuple[JobSpec, Document]:
    """load_spec_text, plus the parsed document."""
    doc, problems = parse_yaml(text)
    if not isinstance(doc.data, dict):
        raise SpecError(source, problems)
    base = os.path.abspath(base_dir)
    env = os.environ if environ is None else environ
    problems += interpolate(doc, env)
    problems += apply_hosted_endpoint(doc, env)  # a cluster template's first node in place of a fixed host
    problems += value_problems(doc)
    problems += schema_problems(doc, skip=frozenset(p.path for p in problems))
    if problems:
        seen = {p.path for p in problems}
        problems += [p for p in salvage_problems(doc, doc.reported, base) if p.path not in seen]
        raise SpecError(source, _ordered(problems))
    builder = Builder(doc, base, devices_here=devices_here)
    spec = builder.build()
    seen = {p.path for p in builder.problems}  # a value that failed to convert is not checked again
    problems = builder.problems + [p for p in semantic_problems(spec, doc) if p.path not in seen]
    if problems:
        raise SpecError(source, _ordered(problems))
    return spec, doc


def _ordered(problems: list[SpecProblem]) -> list[SpecProblem]:
    """Top to bottom, as the user reads the file; duplicates dropped; at most MAX_PROBLEMS."""
    unique = sorted(dict.fromkeys(problems), key=lambda p: (p.line or 0, p.column or 0))
    if len(unique) <= MAX_PROBLEMS:
        return unique
    cut = SpecProblem("", f"stopped after {MAX_PROBLEMS} problems", "fix these and validate again")
    return [*unique[:MAX_PROBLEMS], cut]
