"""The run directory's names are spelled in runner/rundir only (as etcd's keys are in runner/rendezvous/etcd/keys.py).

Every string constant of runner/ outside runner/rundir, the literal parts of f-strings included, is scanned: one
that spells a path of a run dir (a file's name, `attempt_`, `rank_`, `group_`) fails. Prose, a constant with a
space in it (a message or a note that names `report.json` for its reader), is not a path and may name one.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "runner"
OWNER = ROOT / "rundir"

FILES = ("report.json", "status.json", "failure.json", "transitions.jsonl", "agent.jsonl", "spec.json", "stdout.log",
         "stderr.log", "error.json", "server.log", "stacks.txt", "runs.jsonl", "latest")
PREFIXES = ("attempt_", "rank_", "group_")  # a numbered folder: `attempt_{k}`, `rank_*`, `group_<k>`
NAME = re.compile(
    rf"(^|[/.\-]|\b)({'|'.join(map(re.escape, FILES))})$"  # a file name, alone or at the end of a path
    rf"|(^|/)({'|'.join(PREFIXES)})([0-9*<]|$|/)"  # a numbered folder, alone or in a path
)

# Files allowed a spelling for now, with the names (empty: runner/watchdog's timer FIFOs and stacks.txt went last).
PENDING: dict[str, set[str]] = {}


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of every docstring's constant (documentation, not a spelling)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def spellings(source: str) -> list[tuple[int, str]]:
    """(line, constant) of each string constant in `source` that spells a run dir's name."""
    tree = ast.parse(source)
    skip = docstrings(tree)
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
            and not any(c.isspace() for c in node.value) and NAME.search(node.value)]


def outside() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts and OWNER not in p.parents)


@pytest.mark.parametrize("path", outside(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_outside_rundir_spells_a_run_dir_name(path: Path) -> None:
    allowed = PENDING.get(str(path.relative_to(ROOT)), set())
    found = [(line, s) for line, s in spellings(path.read_text(encoding="utf-8")) if s not in allowed]
    assert not found, f"{path.relative_to(ROOT.parent)} spells the run dir's names (use runner.rundir.layout): {found}"


@pytest.mark.parametrize("source", [
    'p = run_dir / "report.json"',
    'p = run_dir / f"attempt_{k}" / "failure.json"',
    'p = f"{run_dir}/attempt_{attempt}/rank_{rank}"',
    'p = sorted(d.glob("group_*"))',
    'p = d.glob("attempt_*/failure.json")',
    'p = f"{name}-report.json"',
    'p = base / "latest"',
])
def test_the_scan_sees_each_way_of_spelling_a_path(source: str) -> None:
    assert spellings(source)


@pytest.mark.parametrize("source", [
    'm = "runner: warning: report.json could not be written"',  # prose
    'k = "group_rank"',  # a key that merely starts like a folder
    'k = "group_workers"',
    'e = "group_dir_unwritable"',
    'def f():\n    """Writes <run dir>/report.json."""',
])
def test_the_scan_leaves_prose_and_lookalikes_alone(source: str) -> None:
    assert not spellings(source)


def test_the_layout_module_spells_them() -> None:
    """The owner is scanned the same way and does spell them: the scan is not blind."""
    found = {s for _, s in spellings((OWNER / "layout.py").read_text(encoding="utf-8"))}
    assert {"report.json", "status.json", "failure.json", "attempt_", "rank_", "group_"} <= found
