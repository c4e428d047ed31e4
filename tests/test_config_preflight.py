"""Preflight: what a valid spec needs from this machine. `validate` warns and exits 0; `run` exits 2 before it
creates anything (no run dir, no worker)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner.config import load_spec_text
from runner.config.preflight import preflight

ROOT = Path(__file__).resolve().parents[1]


def runner(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runner", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, timeout=120, check=False)


def findings(text: str, base: Path, environ: dict[str, str] | None = None) -> list[tuple[str, str]]:
    spec = load_spec_text(text, base_dir=base, environ={})
    return [(p.path, p.message) for p in preflight(spec, environ=environ)]


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


def test_a_complete_spec_has_no_findings(job_dir: Path) -> None:
    assert findings(f"name: job\nentrypoint: train.py\nlogs:\n  dir: {job_dir}/logs\n", job_dir) == []


def test_missing_script_warns_in_validate_and_stops_run_before_anything_exists(job_dir: Path) -> None:
    spec = job_dir / "job.yaml"
    logs = job_dir / "logs"
    spec.write_text(f"name: job\nentrypoint: missing.py\nlogs:\n  dir: {logs}\n")
    checked = runner("validate", str(spec), cwd=job_dir)
    assert checked.returncode == 0, checked.stderr
    assert f"{spec}:2:13: warning: entrypoint: script missing.py not found in {job_dir}" in checked.stderr
    ran = runner("run", str(spec), cwd=job_dir)
    assert ran.returncode == 2, ran.stderr
    assert "script missing.py not found" in ran.stderr and "Traceback" not in ran.stderr
    assert not logs.exists()


@pytest.mark.parametrize(
    ("text", "path", "message"),
    [
        ("cwd: nowhere", "cwd", "is not a directory here"),
        ("entrypoint: {command: [no-such-program-here]}", "entrypoint.command", "'no-such-program-here' not found"),
        ("entrypoint: {command: ./tool.sh}", "entrypoint.command", "'./tool.sh' not found or not executable"),
        ("entrypoint: {script: train.py, python: /no/python}", "entrypoint.python", "'/no/python' not found"),
        ("entrypoint: {module: no_such_module_xyz.main}", "entrypoint.module", "module no_such_module_xyz is neither"),
        ("logs: {dir: train.py/logs}", "logs.dir", "is not a directory, so logs cannot go under"),
        ("metrics: {enabled: true}", "", ""),
    ],
)
def test_each_machine_dependent_need_is_found(job_dir: Path, text: str, path: str, message: str) -> None:
    base = "name: job\nentrypoint: train.py\n" if not text.startswith("entrypoint") else "name: job\n"
    old = Path.cwd()
    os.chdir(job_dir)  # logs.dir resolves against the agent's own cwd, as the agent does
    try:
        found = findings(base + text + "\n", job_dir)
    finally:
        os.chdir(old)
    if not message:  # prometheus-client is installed here: no finding
        assert found == []
        return
    assert len(found) == 1 and found[0][0] == path and message in found[0][1], found


def test_an_executable_relative_program_is_found_in_cwd(job_dir: Path) -> None:
    tool = job_dir / "tool.sh"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert findings(f"name: job\nentrypoint: {{command: ./tool.sh}}\nlogs: {{dir: {job_dir}}}\n", job_dir) == []


def test_etcd_files_and_password_variable(job_dir: Path) -> None:
    text = ("name: job\nentrypoint: train.py\nrendezvous:\n  backend: etcd\n  tls: {ca: ca.pem}\n"
            f"  auth: {{user: u, password_env: ETCD_PW}}\nlogs: {{dir: {job_dir}}}\n")
    assert {path for path, _ in findings(text, job_dir, environ={})} == {"rendezvous.tls.ca",
                                                                          "rendezvous.auth.password_env"}
    (job_dir / "ca.pem").write_text("x")
    assert findings(text, job_dir, environ={"ETCD_PW": "pw"}) == []


def test_arguments_and_environment_beyond_arg_max(job_dir: Path) -> None:
    big = {f"V{i}": "x" * 100_000 for i in range(os.sysconf("SC_ARG_MAX") // 100_000 + 1)}
    found = findings(f"name: job\nentrypoint: train.py\nlogs: {{dir: {job_dir}}}\n", job_dir, environ=big)
    assert len(found) == 1 and found[0][0] == "env" and "more than ARG_MAX" in found[0][1]


def test_more_workers_than_the_open_file_limit(job_dir: Path) -> None:
    spec = job_dir / "job.yaml"
    spec.write_text(f"name: job\nentrypoint: train.py\nnproc_per_node: 64\nlogs: {{dir: {job_dir}}}\n")
    command = f"ulimit -n 128 && exec {sys.executable} -m runner validate {spec}"
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd=ROOT, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert "warning: nproc_per_node: 64 workers need about 384 open files, the limit here is 128" in result.stderr
