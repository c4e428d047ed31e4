"""The score of a bench/mutation.sh run, per module and in total, from mutmut's own records (mutants/**/*.py.meta).

Killed: a selected test failed (or timed out) with the mutant in place. Survived: every selected test passed.
Equivalent: a survivor listed in bench/mutation/equivalent.txt (one mutant name a line, `#` comments; each one's
reason is in docs/testing.md). The score is killed / (mutants - equivalent). Mutants of code that is not pure
(NOT_PURE below: the etcd I/O of round.py's RoundWaiter, exercised by the integration tests only) are counted apart.

    python bench/mutation/score.py WORKDIR [--survivors] [--over OLDWORK]...

`--over OLDWORK`: WORKDIR re-ran only some mutants (an earlier run's survivors, against new tests, on the same
source): each mutant WORKDIR did not check keeps its verdict from OLDWORK. Re-run every mutant of a module whose
source changed since OLDWORK (its mutants' names may have moved).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

KILLED = {1: "killed", 3: "killed", 36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout",
          37: "killed"}
SURVIVED = {0: "survived"}
NOT_PURE = ("ǁRoundWaiterǁ",)
EQUIVALENT_FILE = Path(__file__).with_name("equivalent.txt")


def equivalent() -> set[str]:
    """The mutant names listed as equivalent."""
    lines = EQUIVALENT_FILE.read_text(encoding="utf-8").splitlines() if EQUIVALENT_FILE.exists() else []
    return {line.split("#", 1)[0].strip() for line in lines} - {""}


def status(code: int | None) -> str:
    if code in KILLED:
        return "killed"
    if code in SURVIVED:
        return "survived"
    return {None: "not checked", 5: "no tests", 33: "no tests", 34: "skipped"}.get(code, "suspicious")


def codes_of(work: Path) -> dict[str, dict[str, int | None]]:
    """Per module (its path), each mutant's exit code as mutmut recorded it (None: not checked)."""
    return {str(meta.relative_to(work / "mutants"))[: -len(".meta")]: json.loads(meta.read_text())["exit_code_by_key"]
            for meta in sorted((work / "mutants").rglob("*.py.meta"))}


def merged(new: dict[str, dict[str, int | None]], old: dict[str, dict[str, int | None]]) -> dict[str, dict[str, int | None]]:
    """`new`'s codes, where a mutant it did not check keeps `old`'s."""
    out = {}
    for module, codes in new.items():
        before = old.get(module, {})
        out[module] = {name: code if code is not None else before.get(name) for name, code in codes.items()}
    return out


def tally(by_module: dict[str, dict[str, int | None]]) -> tuple[list[tuple[str, Counter[str]]], list[str], Counter[str]]:
    """Verdicts counted per module, the survivors by name, and the verdicts of the mutants counted apart."""
    same = equivalent()
    rows: list[tuple[str, Counter[str]]] = []
    survivors: list[str] = []
    apart: Counter[str] = Counter()
    for module, codes in by_module.items():
        counts: Counter[str] = Counter()
        for name, code in codes.items():
            verdict = status(code)
            if any(mark in name for mark in NOT_PURE):
                apart[verdict] += 1
                continue
            if verdict == "survived" and name in same:
                verdict = "equivalent"
            elif verdict != "killed":
                survivors.append(f"{verdict}: {name}")
            counts[verdict] += 1
        if counts:
            rows.append((module, counts))
    return rows, survivors, apart


def main(argv: list[str]) -> int:
    by_module = codes_of(Path(argv[1]))
    for k, arg in enumerate(argv):  # each --over in turn: a mutant none checked yet keeps the next one's verdict
        if arg == "--over":
            by_module = merged(by_module, codes_of(Path(argv[k + 1])))
    rows, survivors, apart = tally(by_module)
    total: Counter[str] = Counter()
    print(f"{'module':44} {'mutants':>7} {'killed':>6} {'equiv':>5} {'left':>5} {'score':>7}")
    for module, counts in [*rows, ("total", sum((c for _, c in rows), total))]:
        n = sum(counts.values())
        counted = n - counts["equivalent"]
        left = counted - counts["killed"]
        score = 100.0 * counts["killed"] / counted if counted else 100.0
        print(f"{module:44} {n:7} {counts['killed']:6} {counts['equivalent']:5} {left:5} {score:6.1f}%")
    if apart:
        print(f"not pure, not counted (RoundWaiter): {dict(apart)}")
    if "--survivors" in argv:
        print("\n".join(survivors))
    return 0

if __name__ == "__main__":
    sys.exit(main(sys.argv))
