"""The docs say what the code does: README's usage block names only real subcommands and flags (and every
subcommand), and docs/architecture.md's state diagram has exactly the edges of runner.core.machine.TRANSITIONS.

Formats the docs must keep (so these checks can be strict):
- README.md: the first fenced block after `## Usage`. Each line is `runner SUBCOMMAND ARGS...   description`
  (the description after two or more spaces; `runner job.yaml ...` stands for `runner run job.yaml ...`). Every
  `-x`/`--flag` shown must be an option of that subcommand; lowercase words joined by `|` (`slurm|kubernetes`)
  must be choices of one of its positionals; UPPERCASE words, `job.yaml` and `...` are placeholders; nothing
  after a bare `--` is checked. Every registered subcommand has at least one line.
- docs/architecture.md: the first fenced block is the diagram, one edge per line: `SRC --trigger--> DST`, where
  SRC may be several states joined by `|`, or `*` for every state but SHUTDOWN. Blank lines are allowed, nothing
  else. The set of (source, trigger, destination) it draws equals the machine's.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from cli_words import check_words, subparsers

from runner.cli.commands import COMMANDS, DEFAULT, names
from runner.core.group_state import GroupState
from runner.core.machine import TRANSITIONS

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
EDGE = re.compile(r"^\s*(\*|[A-Z]+(?:\|[A-Z]+)*)\s+--([a-z_]+)-->\s+([A-Z]+)\s*$")


def usage_block() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "\n## Usage\n" in readme, "README.md has no '## Usage' section"
    block = FENCE.search(readme.split("\n## Usage\n", 1)[1])
    assert block, "no fenced block under '## Usage'"
    return [ln for ln in block.group(1).splitlines() if ln.strip()]


def check_line(line: str, parsers: dict[str, argparse.ArgumentParser]) -> tuple[str, list[str]]:
    """(subcommand, problems) of one usage line."""
    command_part = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
    words = command_part.split()
    if not words or words[0] != "runner":
        return "", [f"does not start with `runner`: {line!r}"]
    if len(words) > 1 and words[1] in parsers:
        sub, rest = words[1], words[2:]
    elif len(words) > 1 and re.fullmatch(r"\[?job\.yaml\]?", words[1]):
        sub, rest = DEFAULT.name, words[1:]
    elif len(words) > 1 and words[1] in ("--version", "-h", "--help"):
        return "", []
    else:
        return "", [f"unknown subcommand in {line!r}"]
    return sub, check_words(sub, rest, parsers[sub], line.strip())


def test_readme_usage_shows_real_subcommands_and_flags_only() -> None:
    parsers = subparsers()
    problems: list[str] = []
    shown = set()
    for line in usage_block():
        sub, found = check_line(line, parsers)
        shown.add(sub)
        problems += found
    problems += [f"subcommand `{name}` is missing from README's usage block" for name in names() if name not in shown]
    assert not problems, "\n".join(problems)


def test_the_usage_check_itself_catches_mistakes() -> None:
    parsers = subparsers()
    assert check_line("runner plan job.yaml [--json]      resolved spec", parsers) == ("plan", [])
    assert check_line("runner job.yaml [--node ID]        run", parsers) == ("run", [])
    assert check_line("runner plan job.yaml [--jsn]       typo", parsers)[1]
    assert check_line("runner template slurm|nomad job.yaml   x", parsers)[1]
    assert check_line("runner frobnicate                  x", parsers)[1]
    assert {c.name for c in COMMANDS} == set(parsers)


def machine_edges() -> set[tuple[str, str, str]]:
    """(source, trigger, destination) of every row of the table, one per source state."""
    live = [s for s in GroupState if s is not GroupState.SHUTDOWN]
    found = set()
    for row in TRANSITIONS:
        trigger, sources, dest = (row.trigger, row.sources, row.dest) if hasattr(row, "trigger") else row
        for src in live if sources == "*" else sources:
            found.add((src.value, trigger.value, dest.value))
    return found


def diagram_edges(text: str) -> tuple[set[tuple[str, str, str]], list[str]]:
    """The edges a diagram block draws, and the lines that are not edges."""
    live = [s.value for s in GroupState if s is not GroupState.SHUTDOWN]
    edges, junk = set(), []
    for line in text.splitlines():
        if not line.strip():
            continue
        m = EDGE.match(line)
        if m is None:
            junk.append(line)
            continue
        sources = live if m.group(1) == "*" else m.group(1).split("|")
        edges |= {(src, m.group(2), m.group(3)) for src in sources}
    return edges, junk


def test_architecture_diagram_has_exactly_the_machines_edges() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = FENCE.search(doc)
    assert block, "docs/architecture.md has no fenced diagram"
    drawn, junk = diagram_edges(block.group(1))
    assert not junk, "lines of the diagram that are not `SRC --trigger--> DST`:\n" + "\n".join(junk)
    real = machine_edges()
    assert drawn == real, f"missing from the diagram: {sorted(real - drawn)}\nnot in the machine: {sorted(drawn - real)}"


def test_the_diagram_check_itself_catches_mistakes() -> None:
    edges, junk = diagram_edges("INIT --initialized--> RENDEZVOUS\n* --stop_requested--> SHUTDOWN\nart ──▶\n")
    assert ("INIT", "initialized", "RENDEZVOUS") in edges and ("FAILED", "stop_requested", "SHUTDOWN") in edges
    assert ("SHUTDOWN", "stop_requested", "SHUTDOWN") not in edges and junk == ["art ──▶"]
    assert ("INIT", "initialized", "RENDEZVOUS") in machine_edges()


def test_architecture_shows_the_job_machine_of_replica_groups_edge_by_edge() -> None:
    """The block under "The job of replica groups has a machine of its own" draws exactly JOB_TRANSITIONS."""
    from runner.core.job_machine import job_edges

    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = doc.split("## The job of replica groups has a machine of its own", 1)
    assert len(section) == 2, "docs/architecture.md does not show the job machine"
    block = FENCE.search(section[1])
    assert block
    drawn, junk = diagram_edges(block.group(1))
    assert not junk
    assert drawn == {(s.value, t.value, d.value) for s, t, d, _ in job_edges()}


def test_the_readme_opens_with_exactly_two_commands() -> None:
    """Before its first section, README.md shows two commands, each one line of bash: the first sets up and runs the
    main example (hello.yaml), the second sets up and runs the whole suite (pytest). A third command block there (the
    multi-node install once stood there) makes the opening ambiguous: it goes in prose."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    opening = readme.split("\n## ", 1)[0]
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", opening, flags=re.MULTILINE | re.DOTALL)
    commands = [body.strip() for lang, body in blocks if lang in ("bash", "sh", "shell", "console", "")]
    assert len(commands) == 2, commands  # (the spec shown after them is yaml, not a command)
    assert all("\n" not in c for c in commands), commands
    assert "examples/jobs/hello.yaml" in commands[0] and "python -m pytest" in commands[1], commands
