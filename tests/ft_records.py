"""The `ft_train KIND k=v ...` lines examples/jobs/ft_train.py prints: its records, its committed steps; for the
TorchFT tests on one node and on several (their skip mark: tests/torchft_mark.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from conftest import wait_for

if TYPE_CHECKING:
    from conftest import Job

LINE = re.compile(r"^(?:\[[^\]]*\] )?ft_train (\w+) (.*)$")


def records(path: Path, kind: str) -> list[dict[str, str]]:
    """The script's `ft_train KIND k=v ...` lines (a log that does not exist yet has none)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        m = LINE.match(line)
        if m and m.group(1) == kind:
            out.append(dict(kv.split("=", 1) for kv in m.group(2).split() if "=" in kv))
    return out


def committed(path: Path) -> list[tuple[int, float, int]]:
    """(step, time, groups) of every committed step."""
    return [(int(r["step"]), float(r["time"]), int(r["groups"])) for r in records(path, "step") if r["commit"] == "1"]


def first_attempt_logs(job: Job) -> tuple[Path, Path, Path]:
    """A two-group job on one node, started: its run dir and each group's first rank-0 stdout log, once group 1's
    worker has one (the run dir is waited for first: the job's folder exists before it)."""
    run = job.wait_run_dir()
    wait_for(lambda: any((run / "group_1").glob("attempt_0/rank_0/stdout.log")), timeout=60,
             what="group 1's first worker")
    return run, *(run / f"group_{k}" / "attempt_0" / "rank_0" / "stdout.log" for k in (0, 1))
