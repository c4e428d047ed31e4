"""Preflight: what a valid spec needs from this machine. `run` exits 2 before it creates anything (no run dir, no
worker); `validate` refuses the same with the same text, or warns where the finding may hold on the node the job
runs on (a `${VAR}` it depends on, a `cluster` section)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import RUNNER

from runner.config import load_spec_text
from runner.config.preflight import preflight

ROOT = Path(__file__).resolve().parents[2]


def runner(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RUNNER, *args], capture_output=True, text=True, cwd=cwd,
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


REFUSED = [
    pytest.param("entrypoint: trian.py\n", "entrypoint: script trian.py not found in", id="script"),
    pytest.param("entrypoint: train.py\ncwd: nowhere\n", "cwd: cwd ", id="cwd"),
    pytest.param("entrypoint: {command: [no-such-program-here]}\n", "'no-such-program-here' not found", id="program"),
    pytest.param("entrypoint: {script: train.py, python: /no/python}\n", "'/no/python' not found", id="python"),
    pytest.param("entrypoint: {module: no_such_module_xyz.main}\n", "module no_such_module_xyz is neither",
                 id="module"),
    pytest.param("entrypoint: train.py\nlogs: {dir: train.py/logs}\n", "is not a directory, so logs", id="logs"),
    pytest.param("entrypoint: train.py\nrendezvous: {backend: etcd, endpoints: ['127.0.0.1:1'], "
                 "auth: {user: u, password_env: RUNNER_TEST_UNSET_PW}}\n",
                 "environment variable RUNNER_TEST_UNSET_PW is not set", id="password_env"),
    pytest.param("entrypoint: train.py\nrendezvous: {backend: etcd, endpoints: ['127.0.0.1:1'], "
                 "tls: {ca: nowhere.pem}}\n", "nowhere.pem is not a readable file", id="tls"),
]


@pytest.mark.parametrize(("body", "message"), REFUSED)
def test_validate_refuses_what_run_refuses_with_the_same_text(job_dir: Path, body: str, message: str) -> None:
    """Each spec `runner` refuses before starting a worker: `runner validate` refuses it too, exit 2, word for word
    (one check serves both), and neither creates anything."""
    spec = job_dir / "job.yaml"
    logs = job_dir / "runner-logs"
    spec.write_text("name: job\n" + body)
    checked = runner("validate", str(spec), cwd=job_dir)
    ran = runner("run", str(spec), cwd=job_dir)
    assert ran.returncode == 2 and checked.returncode == 2, (ran.stderr, checked.stderr)
    assert message in ran.stderr and f"{spec}:" in ran.stderr, ran.stderr  # located: file:line:column
    assert checked.stderr == ran.stderr and checked.stdout == ran.stdout == ""
    assert "Traceback" not in ran.stderr and not logs.exists()


def test_missing_script_stops_run_before_anything_exists(job_dir: Path) -> None:
    spec = job_dir / "job.yaml"
    logs = job_dir / "logs"
    spec.write_text(f"name: job\nentrypoint: missing.py\nlogs:\n  dir: {logs}\n")
    ran = runner("run", str(spec), cwd=job_dir)
    assert ran.returncode == 2, ran.stderr
    assert f"{spec}:2:13: entrypoint: script missing.py not found in {job_dir}" in ran.stderr
    assert "Traceback" not in ran.stderr
    assert not logs.exists()


@pytest.mark.parametrize(
    ("body", "why"),
    [
        pytest.param("entrypoint: ${CODE_DIR:-/nowhere}/train.py\n", "it depends on ${CODE_DIR}", id="variable"),
        pytest.param("entrypoint: train.py\ncwd: ${WORK:-nowhere}\n", "it depends on ${WORK}", id="cwd-variable"),
        pytest.param("entrypoint: trian.py\ncluster: {slurm: {partition: gpu}}\n", "the spec has a `cluster` section",
                     id="cluster"),
    ],
)
def test_validate_warns_where_the_node_the_job_runs_on_may_differ(job_dir: Path, body: str, why: str) -> None:
    """A finding that may hold where the job runs (a path under a variable this shell leaves unset, a spec for a
    cluster's nodes) is a warning saying which; `runner run` here still refuses it."""
    spec = job_dir / "job.yaml"
    spec.write_text("name: job\n" + body)
    env = {"CODE_DIR": "", "WORK": ""}
    checked = runner("validate", str(spec), cwd=job_dir, env=env)
    assert checked.returncode == 0, checked.stderr
    assert ": warning: " in checked.stderr and f"(not refused: {why}" in checked.stderr, checked.stderr
    assert runner("run", str(spec), cwd=job_dir, env=env).returncode == 2


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
    assert result.returncode == 2, result.stderr
    assert "nproc_per_node: 64 workers need about 384 open files, the limit here is 128" in result.stderr
