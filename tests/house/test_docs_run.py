"""Docs that run: every fenced block of README.md and docs/*.md is executed, validated, or marked as an excerpt.

The rule each block follows, by its fence's language (a block with none is refused: say what it is):
- `yaml`: a job spec, validated as `runner validate` does. A block without `version`/`entrypoint` is a fragment:
  it is merged onto a minimal spec (examples/jobs/hello.py, one node) and that is validated.
- `bash`: each command (lines joined at `\\`, split at `&&`, `;`, `|`, `&`, comments dropped) is checked:
  `runner ...` has only real subcommands and options and names only repo paths that exist, and the cheap ones
  (`validate`, `plan`, `graph`, `convert`, `template` on files that exist) are run and must exit 0; `pip install`
  names only extras pyproject.toml has and files that exist; `etcd`, `python bench/X.py`, `bash .ci/X`, `pytest`
  have only the options the program has; `pip-compile` is the one constraints.txt says it was made with.
- `text`, `json`, `python`: output, diagrams, formats: not commands (other tests check the diagrams and formats).

A marker on the line before a fence changes the rule: `<!-- doc-test: excerpt (why) -->` (not checked: part of a
spec, a command for another machine), `<!-- doc-test: run tests/FILE.py::TEST -->` (a named test runs the block
as it is; the test must exist). `docs/torchrun.md`'s table is generated and checked by tests/config/test_torchrun_flags_doc.py.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import socket
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from ci_skips import need
from cli_words import check_words, subparsers
from conftest import ROOT, RUNNER, wait_for

from runner.config import load_spec_text
from runner.config.torchrun_flags import BY_OPTION
from runner.errors import SpecError

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```", re.MULTILINE | re.DOTALL)
MARKER = re.compile(r"<!-- doc-test: (excerpt|run) ?(.*?) -->\s*$")
KNOWN = {"yaml", "bash", "text", "json", "python"}
BASE = {"version": 1, "name": "doc", "entrypoint": {"script": "hello.py"}}
ENV = {"RUNNER_ETCD_ENDPOINTS": "10.0.0.5:2379", "ETCD_PASSWORD": "x", "EPOCHS": "3",
       "RUNNER_FIRST_NODE": "node0"}  # set by `runner template` on every node (docs/clusters.md)
REPO_PATH = re.compile(r"^(examples|tests|bench|docs|runner|\.ci)/[\w./-]+$")
CHEAP = {"validate", "plan", "graph", "convert", "template"}
SHELL_WORDS = {"wait", "kill", "rm", "cd", "export", "ss", "echo", "mkdir", "jq"}


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its text, and its marker (kind, argument) if any."""

    doc: Path
    line: int
    lang: str
    body: str
    marker: tuple[str, str] | None

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def blocks() -> list[Block]:
    out = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            found = MARKER.search(before)
            body = "\n".join(ln[len(m.group("indent")):] for ln in m.group("body").splitlines())
            out.append(Block(doc, text[: m.start()].count("\n") + 1, m.group("lang").strip(), body,
                             (found.group(1), found.group(2)) if found else None))
    return out


ALL = blocks()


def ids(items: list[Block]) -> list[str]:
    return [b.where for b in items]


def test_every_block_says_what_it_is() -> None:
    unknown = [f"{b.where}: fence language {b.lang!r}: use one of {sorted(KNOWN)} (or mark it as an excerpt)"
               for b in ALL if b.lang not in KNOWN and b.marker is None]
    assert not unknown, "\n".join(unknown)
    assert len(ALL) > 50  # README and every doc were read


def test_a_run_marker_names_a_test_that_exists() -> None:
    for b in ALL:
        if b.marker and b.marker[0] == "run":
            path, _, name = b.marker[1].partition("::")
            assert (ROOT / path).is_file() and f"def {name}(" in (ROOT / path).read_text(), b.where


# --- yaml: specs and fragments ------------------------------------------------------------------------------------

YAML = [b for b in ALL if b.lang == "yaml" and b.marker is None]


@pytest.mark.parametrize("block", YAML, ids=ids(YAML))
def test_yaml_block_is_a_valid_spec_or_fragment(block: Block) -> None:
    data = yaml.safe_load(block.body)
    assert isinstance(data, dict), f"{block.where}: not a mapping"
    text = block.body  # a whole spec is validated as written (quotes and all)
    if not {"version", "entrypoint"} <= data.keys():
        data = merge(BASE, data)
        rdzv = data.setdefault("rendezvous", {})
        assert isinstance(rdzv, dict)
        if rdzv.get("backend") == "etcd" or "endpoints" in rdzv or data.get("nodes", 1) != 1:
            rdzv.setdefault("backend", "etcd")  # a multi-node fragment: on the etcd it needs
            rdzv.setdefault("endpoints", ["10.0.0.5:2379"])
            data.setdefault("nodes", 2)
        text = yaml.safe_dump(data)
    try:
        load_spec_text(text, source=block.where, base_dir=ROOT / "examples" / "jobs", environ=ENV)
    except SpecError as e:
        pytest.fail(f"{block.where}: the block is not a valid spec (or fragment):\n{e}")


def merge(base: dict[str, object], over: dict[str, object]) -> dict[str, object]:
    out = dict(base)
    for k, v in over.items():
        old = out.get(k)
        out[k] = merge(old, v) if isinstance(old, dict) and isinstance(v, dict) else v
    return out


# --- bash: commands -----------------------------------------------------------------------------------------------

BASH = [b for b in ALL if b.lang == "bash" and b.marker is None]


def commands(body: str) -> list[list[str]]:
    """The commands of a block, as argv lists (comments dropped, continuations joined, env prefixes removed)."""
    joined = re.sub(r"\\\n\s*", " ", body)
    out = []
    for raw in joined.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()  # a comment: `#` at the start or after a space
        if not line:
            continue
        for part in re.split(r"\s*(?:&&|;|\|\|?|&(?!\d))\s*", line):
            try:
                words = shlex.split(part)
            except ValueError:
                words = part.split()
            while words and re.match(r"^[A-Z_]+=", words[0]):
                words = words[1:]
            kept: list[str] = []
            for w in words:  # redirections: `> FILE`, `2>&1`, `>FILE`
                if kept and kept[-1] in (">", ">>", "2>", "<"):
                    kept.pop()
                elif not re.match(r"^\d?[<>]", w) or w in (">", ">>", "2>", "<"):
                    kept.append(w)
            if kept:
                out.append(kept)
    return out


@functools.cache
def etcd_options() -> set[str]:
    done = subprocess.run([str(Path(sys.executable).parent / "etcd"), "--help"], capture_output=True, text=True,
                          check=False, timeout=30)
    return set(re.findall(r"--[a-z][\w-]*", done.stdout + done.stderr))


@functools.cache
def program_options(argv: tuple[str, ...]) -> set[str]:
    done = subprocess.run([*argv, "--help"], capture_output=True, text=True, check=False, timeout=60, cwd=ROOT)
    return set(re.findall(r"(?<![\w-])--?[a-zA-Z][\w-]*", done.stdout + done.stderr))


def flags(words: list[str]) -> list[str]:
    return [w.split("=", 1)[0] for raw in words for w in re.split(r"[\[\]|]", raw) if re.match(r"^--?[A-Za-z]", w)]


def check_command(words: list[str]) -> list[str]:  # noqa: PLR0911, C901 - one branch per program
    """Problems with one command of a doc."""
    prog = Path(words[0]).name
    rest = words[1:]
    problems = [f"no such file {w}" for w in rest if REPO_PATH.match(w) and not (ROOT / w).exists()]
    if prog == "runner":
        return problems + check_runner(rest)
    if prog in ("pip", "pip3"):
        extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
        for w in rest:
            m = re.fullmatch(r"\.\[([\w,]+)\]", w)
            problems += [f"pyproject.toml has no extra {x!r}" for x in (m.group(1).split(",") if m else [])
                         if x not in extras]
            if re.fullmatch(r"runner\[[\w,]+\]", w):
                problems.append(f"{w}: runner is not on PyPI; install from the checkout: -e '.[extra]'")
        if "-c" in rest and not (ROOT / rest[rest.index("-c") + 1]).exists():
            problems.append("no such constraints file")
        return problems
    if prog == "etcd":
        return problems + [f"etcd has no option {f}" for f in flags(rest) if f not in etcd_options()]
    if prog in ("python", "python3") and rest[:1] == ["-m"]:
        if rest[1] == "venv":
            return problems
        if rest[1] == "pytest":
            known = program_options((sys.executable, "-m", "pytest"))
            return problems + [f"pytest has no option {f}" for f in flags(rest[2:]) if f not in known]
    if prog in ("python", "python3", "bash") and rest and REPO_PATH.match(rest[0]):
        source = (ROOT / rest[0]).read_text() if (ROOT / rest[0]).is_file() else ""
        return problems + [f"{rest[0]} has no option {f}" for f in flags(rest[1:]) if f not in source]
    if prog == "pip-compile":
        header = (ROOT / "constraints.txt").read_text().splitlines()[3].lstrip("# ").split()
        return problems + ([] if words == header else [f"not the command constraints.txt was made with: {header}"])
    if prog in SHELL_WORDS:
        return problems
    return [*problems, f"`{prog}` is not checked: mark the block `<!-- doc-test: excerpt (why) -->`"]


def check_runner(rest: list[str]) -> list[str]:
    parsers = subparsers()
    if rest and rest[0] in parsers:
        sub, args = rest[0], rest[1:]
    elif rest and rest[0].startswith("-") and rest[0] in ("--version", "-h", "--help"):
        return []
    else:
        sub, args = "run", rest
    problems = check_words(sub, args, parsers[sub], "runner " + " ".join(rest))
    files = [w for w in args if w.endswith((".yaml", ".yml"))]
    if not problems and sub in CHEAP and all((ROOT / f).is_file() for f in files):
        done = subprocess.run([*RUNNER, sub, *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=60, check=False, env=dict(os.environ, **ENV))
        if done.returncode != 0:
            problems.append(f"`runner {' '.join(rest)}` exits {done.returncode}: {done.stderr.strip()[-400:]}")
    return problems


@pytest.mark.parametrize("block", BASH, ids=ids(BASH))
def test_bash_block_runs_or_names_only_what_exists(block: Block) -> None:
    problems = [f"{' '.join(words)}: {p}" for words in commands(block.body) for p in check_command(words)]
    assert not problems, f"{block.where}:\n" + "\n".join(problems)


def test_the_command_check_itself_catches_mistakes() -> None:
    assert check_command(["runner", "plan", "examples/jobs/hello.yaml", "--jsn"])
    assert check_command(["runner", "examples/jobs/nope.yaml"])
    assert check_command(["pip", "install", "-e", ".[nope]"])
    assert check_command(["pip", "install", "runner[etcd]"])
    assert check_command(["etcd", "--data-dirr", "/tmp/x"])
    assert check_command(["curl", "x"])
    assert not check_command(["etcd", "--data-dir", "/tmp/x", "--log-level", "warn"])
    assert not check_command(["runner", "convert", "--", "torchrun", "--nproc-per-node", "gpu", "t.py"])
    assert commands("a x \\\n  y && b # c; d\nFOO=1 c --d > f 2>&1 &\n") == [["a", "x", "y"], ["b"], ["c", "--d"]]


# --- docs/clusters.md "From torchrun": what it says each torchrun option becomes --------------------------------


def test_clusters_from_torchrun_says_what_convert_does() -> None:
    """Each `--option` → `field` it names is the converter's own mapping (runner/config/torchrun_flags.py)."""
    doc = (ROOT / "docs" / "clusters.md").read_text()
    section = doc.split("## From torchrun", 1)[1].split("\n## ", 1)[0]
    pairs = re.findall(r"`(--[\w-]+)`(?:/`(--[\w-]+)`)? → `([\w.]+)`", section)
    assert len(pairs) >= 5, section
    for first, second, field in pairs:
        for option in filter(None, (first, second)):
            assert field in BY_OPTION[option].spec, f"{option} → {field}: the table says {BY_OPTION[option].spec}"
    for claim in re.findall(r"`runner convert -- (torchrun [^`]+)`", section):
        done = subprocess.run([*RUNNER, "convert", "--", *claim.split()], cwd=ROOT,
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, (claim, done.stderr)


# --- docs/multinode.md "Trying it on one machine", run as it is ---------------------------------------------------


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_trying_multinode_on_one_machine_leaves_no_etcd(tmp_path: Path) -> None:
    """The block runs as written (etcd and runner from the virtualenv's bin/); after it, port 2379 is free."""
    me = "tests/house/test_docs_run.py::test_trying_multinode_on_one_machine_leaves_no_etcd"
    block = next(b for b in ALL if b.marker == ("run", me))
    if not port_free(2379) or Path("/tmp/etcd-test").exists():
        need("port 2379 or /tmp/etcd-test is in use on this machine (the block uses etcd's defaults)")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", STEPS="3",
               XDG_STATE_HOME=str(tmp_path / "state"))
    done = subprocess.run(["bash", "-c", block.body], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240, check=False)  # as pasted into a shell: every line runs
    both = done.stdout + done.stderr
    assert done.returncode == 0, both[-4000:]
    assert both.count("runner: job 'multinode' succeeded") == 2, both[-4000:]  # node a and node b
    wait_for(lambda: port_free(2379), timeout=10, what="port 2379 free after the block stopped etcd")
    assert not Path("/tmp/etcd-test").exists()
