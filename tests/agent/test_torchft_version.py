"""The hosted lighthouse matches the workers' TorchFT (runner/config/torchft_version.py, docs/replica_groups.md).

What these tests use, honestly: one real CPython (this venv's) and one real torchft 0.2.0 installed in it. The
"other" TorchFT is a stub distribution: a `torchft-0.3.0.dist-info/METADATA` in a folder put first on PYTHONPATH.
`importlib.metadata` finds it exactly as it finds any installed distribution, so an interpreter run with that path
really has "torchft 0.3.0" installed as far as any metadata query can tell; it has no code (nothing imports it).
The "workers' interpreter" of some tests is a real executable shell script that runs this venv's python with that
PYTHONPATH: a second interpreter environment without building a second venv. Nothing is mocked: every version is
asked of a real process, as the agent asks it.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Job
from torchft_mark import LIGHTHOUSE, needs_torchft

from runner.config import load_spec_text
from runner.config.spec import JobSpec
from runner.config.torchft_version import (
    TorchftMismatch,
    check,
    installed_version,
    interpreter_of,
    lighthouse_for,
    matching_lighthouse,
)


def ours() -> str:
    """This venv's torchft version (what its torchft_lighthouse runs)."""
    return importlib.metadata.version("torchft")


def stub(tmp_path: Path, version: str) -> Path:
    """A folder holding only the metadata of a torchft `version` distribution (no code)."""
    folder = tmp_path / f"stub-{version}"
    info = folder / f"torchft-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torchft\nVersion: {version}\n")
    return folder


def interpreter(bin_dir: Path, pythonpath: Path | None) -> Path:
    """An executable `python` in `bin_dir` that runs this venv's python (with `pythonpath` first, if given)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    python = bin_dir / "python"
    env = f"PYTHONPATH={pythonpath} " if pythonpath is not None else ""
    python.write_text(f'#!/bin/sh\n{env}exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python


def job_spec(python: Path | None = None, env: dict[str, str] | None = None, **entry: Any) -> JobSpec:
    """A replica-group job spec whose workers run `python` (the spec's env: `env`)."""
    entrypoint: dict[str, Any] = entry or {"script": "train.py"}
    if python is not None:
        entrypoint["python"] = str(python)
    data = {"name": "ft", "entrypoint": entrypoint, "replica_groups": {"count": 2}, "env": env or {}}
    return load_spec_text(json.dumps(data), source="job.json", base_dir="/tmp", environ={})


@needs_torchft
def test_an_interpreter_reports_the_distribution_its_path_finds(tmp_path: Path) -> None:
    """The venv's python says the installed version; with the stub first on PYTHONPATH, the stub's."""
    assert installed_version(sys.executable, dict(os.environ)).version == ours()
    found = installed_version(sys.executable, {**os.environ, "PYTHONPATH": str(stub(tmp_path, "0.3.0"))})
    assert found.version == "0.3.0"


@needs_torchft
def test_workers_with_another_torchft_are_refused_naming_both(tmp_path: Path) -> None:
    """The workers' interpreter has 0.3.0; the only lighthouse is the runner's (ours): a clear error."""
    python = interpreter(tmp_path / "other" / "bin", stub(tmp_path, "0.3.0"))
    spec = job_spec(python)
    program = lighthouse_for(spec, os.environ)
    assert program == str(LIGHTHOUSE)  # none beside the workers' interpreter
    with pytest.raises(TorchftMismatch) as caught:
        check(spec, program, os.environ)
    assert f"TorchFT {ours()}" in caught.value.message and "TorchFT 0.3.0" in caught.value.message
    assert "torchft==0.3.0" in caught.value.fix


@needs_torchft
def test_the_spec_env_is_the_workers_environment(tmp_path: Path) -> None:
    """A PYTHONPATH in the spec's env changes what the workers import: it is checked that way."""
    spec = job_spec(env={"PYTHONPATH": str(stub(tmp_path, "0.3.0"))})
    with pytest.raises(TorchftMismatch):
        matching_lighthouse(spec, os.environ)


@needs_torchft
def test_the_lighthouse_beside_the_workers_interpreter_is_theirs(tmp_path: Path) -> None:
    """A lighthouse script in the workers' bin/ (its #! their interpreter) is taken, and it matches."""
    bin_dir = tmp_path / "venv" / "bin"
    python = interpreter(bin_dir, stub(tmp_path, "0.3.0"))
    theirs = bin_dir / "torchft_lighthouse"
    theirs.write_text(f"#!{python}\nimport sys\nsys.exit(0)\n")
    theirs.chmod(0o755)
    spec = job_spec(python)
    assert matching_lighthouse(spec, os.environ) == (str(theirs), [])
    assert matching_lighthouse(job_spec(), os.environ) == (str(LIGHTHOUSE), [])  # the runner's own: same version


def test_what_cannot_be_known_is_a_warning_not_a_refusal(tmp_path: Path) -> None:
    """A command entrypoint, a binary lighthouse, a missing torchft, a hung interpreter: warnings, each bounded."""
    binary = tmp_path / "lighthouse-binary"
    binary.write_bytes(b"\x7fELF\x02\x01")
    warnings = check(job_spec(command=["./train.sh"]), str(binary), os.environ)
    assert any("command" in w for w in warnings) and any("no Python script" in w for w in warnings)
    bare = tmp_path / "bare"  # this python without site-packages (-S): no torchft installed for it
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    missing = installed_version(str(bare), dict(os.environ), timeout=60)
    assert missing.version is None and "not installed" in missing.why_unknown
    hung = tmp_path / "hung"
    hung.write_text("#!/bin/sh\nexec sleep 60\n")
    hung.chmod(0o755)
    began = time.monotonic()
    side = installed_version(str(hung), dict(os.environ), timeout=0.5)
    assert side.version is None and "did not answer" in side.why_unknown and time.monotonic() - began < 10


@pytest.mark.parametrize(("line", "expected"), [
    ("#!/opt/venv/bin/python3\n", "/opt/venv/bin/python3"),
    ("#!/usr/bin/env python3\n", "python3"),
    ("#!/usr/bin/env -S python3 -u\n", "python3"),
    ("#!/bin/sh\n", None),
    ("print(1)\n", None),
])
def test_the_lighthouse_interpreter_is_read_from_its_first_line(tmp_path: Path, line: str, expected: str) -> None:
    """Only a #! naming a Python counts."""
    script = tmp_path / "s"
    script.write_text(line + "pass\n")
    assert interpreter_of(str(script)) == expected
    assert interpreter_of(str(tmp_path / "absent")) is None


@needs_torchft
@pytest.mark.integration
def test_a_mismatch_stops_the_job_before_any_worker_starts(tmp_path: Path) -> None:
    """`runner run` with workers on 0.3.0 and a hosted lighthouse of ours: an error naming both versions, no
    lighthouse started, no worker spawned."""
    stubbed = stub(tmp_path, "0.3.0")
    worker = tmp_path / "never.py"
    worker.write_text("from pathlib import Path\nPath(__file__).with_name('ran').touch()\n")
    j = Job(tmp_path / "job", f"""
        name: mismatch
        entrypoint: {{script: "{worker}"}}
        env: {{PYTHONPATH: "{stubbed}"}}
        replica_groups: {{count: 2, nproc_per_node: 1}}
        logs: {{dir: "${{LOGS}}", tee: false}}
        """)
    done = j.run(timeout=120)
    assert done.returncode != 0, done.stderr
    assert f"TorchFT {ours()}" in done.stderr and "TorchFT 0.3.0" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "ran").exists()
    assert not list(j.logs.glob("*/*/group_*/attempt_*"))  # no worker's log dir: none was spawned
    assert not list(j.logs.glob("*/*/lighthouse.log"))  # the lighthouse was never started

