"""Cross-field checks on a spec that has other problems too, so that one run of `validate` reports them all.

The parts of the data that are already reported as wrong are dropped (their defaults take their place), and so
is whatever the schema still refuses, round by round, until the rest passes the schema; the rest is built and
checked. A problem found there is kept only when it is not about a dropped part (a default standing in for a
wrong value says nothing about the value the user wrote).
"""

from __future__ import annotations

from runner.config.build import Builder
from runner.config.checks import semantic_problems
from runner.config.schema_check import invalid_parts
from runner.config.yaml_source import Document, Path, dotted
from runner.errors import SpecProblem
from runner.json_types import JSON, JSONObject

_ROUNDS = 4  # each round validates the whole document again; real specs need one or two, else we give up
_PLACEHOLDERS = {"name": "job", "entrypoint": "train.py"}  # required keys: anything valid will do


def salvage_problems(doc: Document, wrong: set[Path], base_dir: str) -> list[SpecProblem]:
    """Problems of the built spec once the `wrong` paths (and whatever else fails the schema) are dropped."""
    data, dropped = _passing_part(doc.data, {path for path in wrong if path})
    if data is None:
        return []
    part = Document(data=data, values=doc.values, keys=doc.keys, plain=doc.plain, containers=doc.containers)
    builder = Builder(part, base_dir)
    found = builder.problems + semantic_problems(builder.build(), part)
    gone = [dotted(path) for path in dropped]
    return [problem for problem in found if not any(_related(problem.path, name) for name in gone)]


def _passing_part(data: JSON, drop: set[Path]) -> tuple[JSONObject | None, set[Path]]:
    """`data` less `drop` and less what fails the schema after that; (None, ...) when nothing sensible is left."""
    dropped: set[Path] = set()
    for _ in range(_ROUNDS):
        drop = {_whole_list(data, path) for path in drop}
        dropped |= drop
        data = _without(data, drop)
        if not isinstance(data, dict):
            return None, dropped
        parts = invalid_parts(data)
        if parts is None:
            return data, dropped
        drop, missing = parts
        for key in missing:
            if key not in _PLACEHOLDERS:
                return None, dropped
            data = {**data, key: _PLACEHOLDERS[key]}
            dropped.add((key,))
    return None, dropped


def _whole_list(data: JSON, path: Path) -> Path:
    """`path`, or the path of the list that holds it (dropping one item would renumber the others)."""
    value = data
    for end, part in enumerate(path):
        if isinstance(value, list):
            return path[:end]
        if not isinstance(value, dict) or part not in value:
            return path
        value = value[part]
    return path


def _without(data: JSON, drop: set[Path]) -> JSON:
    """A copy of `data` without the values at `drop` (only the containers on the way are copied)."""
    if () in drop:
        return None
    if not drop or not isinstance(data, dict):
        return data
    by_key: dict[str | int, set[Path]] = {}
    for path in drop:
        by_key.setdefault(path[0], set()).add(path[1:])
    out = dict(data)
    for key, rest in by_key.items():
        if key in out:
            kept = _without(out[key], rest)
            if kept is None:
                del out[key]
            else:
                out[key] = kept
    return out


def _related(path: str, dropped: str) -> bool:
    """One of the two is the other or inside it."""
    return _inside(path, dropped) or _inside(dropped, path)


def _inside(path: str, parent: str) -> bool:
    return parent in (path, "") or path.startswith((parent + ".", parent + "["))
