"""What a plain local run and `runner validate` import: nothing that only another backend, a failing spec or
another command needs (each was measured to cost the start-up tens of ms; docs/benchmarks.md, Agent overhead).

The module list is the interpreter's own (`python -X importtime`), read from real runs of the CLI.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)$", re.MULTILINE)

NEVER_LOCAL = {"jsonschema", "aetcd", "grpc", "prometheus_client", "torch"}  # and their submodules
NEVER_IN_VALIDATE = NEVER_LOCAL | {"asyncio", "structlog"}


def imported(argv: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run `python -X importtime -m runner ARGV` in tmp_path; its result and the top-level packages it imported."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")  # this test's runs index, not the user's
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "runner", *argv], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    return result, {name.split(".")[0] for name in IMPORTED.findall(result.stderr)}


def local_job(tmp_path: Path) -> Path:
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: startup\n"
        f"entrypoint: {{command: [{sys.executable!r}, -c, pass]}}\n"
        "nproc_per_node: 2\n"
        f"logs: {{dir: {str(tmp_path / 'logs')!r}}}\n"
    )
    return spec


def test_the_parser_sees_imports(tmp_path: Path) -> None:
    result, modules = imported(["--version"], tmp_path)
    assert result.returncode == 0
    assert {"runner", "argparse"} <= modules


def test_a_local_run_imports_no_other_backend_nor_jsonschema(tmp_path: Path) -> None:
    result, modules = imported([str(local_job(tmp_path))], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "asyncio" in modules and "structlog" in modules  # what the agent does need, seen
    assert modules.isdisjoint(NEVER_LOCAL), sorted(modules & NEVER_LOCAL)


def test_validating_a_valid_spec_imports_neither_jsonschema_nor_the_agent(tmp_path: Path) -> None:
    result, modules = imported(["validate", str(local_job(tmp_path))], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "yaml" in modules
    assert modules.isdisjoint(NEVER_IN_VALIDATE), sorted(modules & NEVER_IN_VALIDATE)


def test_an_invalid_spec_is_worded_by_jsonschema(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: bad\nentrypoint: hello.py\nnproc_per_node: two\n")
    result, modules = imported(["validate", str(spec)], tmp_path)
    assert result.returncode == 2
    assert "nproc_per_node: the string 'two' is not one of: auto" in result.stderr
    assert "jsonschema" in modules
