"""Process titles (runner/system/title.py): during a real run, `ps` (/proc/<pid>/cmdline) shows the agent, the fork
server, each standby and each warm worker by what it is, no process of the job carries padding in its argv, and each
keeps the short name (comm) exec gave it: one with a space (setproctitle's default) hides the process and all below it
from tools that split /proc/<pid>/stat at whitespace, Slurm's proctrack/linuxproc among them (scancel missed the job)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for

WORK = """\
import os, pathlib, time
out = pathlib.Path(os.environ["OUT"])
(out / f"rank{os.environ['RANK']}.pid").write_text(str(os.getpid()))
while not (out / "release").exists():
    time.sleep(0.05)
"""
SPEC = """\
version: 1
name: titles
entrypoint: {{script: {work}}}
nproc_per_node: 2
restart: {{max_restarts: 1, preload: [json]}}
logs: {{dir: "${{LOGS}}"}}
"""


def cmdline(pid: int) -> str:
    """What ps shows: /proc/<pid>/cmdline, its NULs as spaces ('' once the process is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def comm(pid: int) -> str:
    """The short name /proc/<pid>/stat shows between its parentheses ('' once the process is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return ""
    return stat[stat.index("(") + 1:stat.rindex(")")]


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, theirs, ...), read from /proc."""
    found: list[int] = []
    todo = [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*/children"):
            try:
                kids = [int(k) for k in task.read_text().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


@pytest.mark.integration
def test_ps_names_the_agent_the_fork_server_the_standbys_and_the_workers(job: Any, tmp_path: Path) -> None:
    work = tmp_path / "work.py"
    work.write_text(WORK)
    j = job(SPEC.format(work=work))
    proc = j.start()
    try:
        titles: dict[int, str] = {}
        names: dict[int, str] = {}

        def seen_all() -> bool:
            kids = descendants(proc.pid)
            titles.update({pid: cmdline(pid) for pid in kids})
            names.update({pid: comm(pid) for pid in [proc.pid, *kids]})
            shown = set(titles.values())
            return (all((j.out / f"rank{r}.pid").exists() for r in (0, 1))
                    and any(t.startswith("runner: standby of job titles") for t in shown))

        wait_for(seen_all, timeout=90, what="both workers running and a standby waiting for the next attempt")
        agent = cmdline(proc.pid)
        assert agent.startswith("runner: agent job titles"), agent
        for rank in (0, 1):
            pid = int((j.out / f"rank{rank}.pid").read_text())
            assert cmdline(pid) == f"runner: worker rank {rank} of job titles (attempt 0) work.py"
        assert any(t.startswith("runner: fork server of job titles") for t in titles.values()), titles
        for pid, title in {proc.pid: agent, **titles}.items():
            assert "-" * 32 not in title and "~" * 32 not in title, (pid, title)  # no padding in any argv
            assert len(title) < 1024, (pid, title)
        titled = {pid: names[pid] for pid, title in {proc.pid: agent, **titles}.items()
                  if title.startswith("runner: ") and names.get(pid)}
        assert len(titled) >= 4, titled  # the agent, the fork server, a standby and the workers were seen
        # comm as exec gave it (the agent's script or python), never the title's start with its spaces
        assert all(not name.startswith("runner:") and " " not in name for name in titled.values()), titled
    finally:
        (j.out / "release").touch()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
