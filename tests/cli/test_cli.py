"""The CLI surface: validate, plan, graph, exit codes, no tracebacks on bad input."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import EXAMPLES, runner_cli


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m runner ARGS`."""
    return runner_cli(*args, cwd=cwd)


def test_validate_ok():
    """A good spec validates with exit 0 and a one-line summary."""
    res = cli("validate", str(EXAMPLES / "hello.yaml"))
    assert res.returncode == 0 and "ok (job 'hello'" in res.stdout


def test_bad_spec_exit_2_with_line_and_fix_and_no_traceback(tmp_path):
    """A typo is reported with file:line:col, the field, a suggestion, exit 2, and no traceback."""
    spec = tmp_path / "job.yaml"
    spec.write_text("name: x\nentrypoint: {script: t.py}\nnproc_per_nod: 2\n")
    for args in (("validate", str(spec)), (str(spec),)):
        res = cli(*args)
        assert res.returncode == 2
        assert f"{spec}:3:1" in res.stderr and "did you mean 'nproc_per_node'" in res.stderr
        assert "Traceback" not in res.stderr


def test_advertise_addr_on_a_one_node_job_is_refused_before_anything_starts(tmp_path):
    """--advertise-addr with the local backend would do nothing (no other node): exit 2, the fix, no run dir."""
    (tmp_path / "t.py").write_text("open('ran', 'w').close()\n")
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: x\nentrypoint: {{script: t.py}}\nlogs: {{dir: {tmp_path / 'logs'}}}\n")
    res = cli(str(spec), "--advertise-addr", "10.0.0.5", cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert "--advertise-addr 10.0.0.5: a job of one node" in res.stderr and "fix: remove --advertise-addr" in res.stderr
    assert not (tmp_path / "logs").exists() and not (tmp_path / "ran").exists() and "Traceback" not in res.stderr


def test_missing_file_is_a_clear_error(tmp_path):
    """A spec path that does not exist: exit 2, says so, no traceback."""
    res = cli("validate", str(tmp_path / "nope.yaml"))
    assert res.returncode == 2 and "nope.yaml" in res.stderr and "Traceback" not in res.stderr


def test_plan_shows_each_rank_and_redacts_secrets(tmp_path):
    """`runner plan --json` lists every rank's argv/env; secret-looking values are redacted."""
    spec = tmp_path / "job.yaml"
    spec.write_text("name: x\nentrypoint: {script: t.py}\nnproc_per_node: 2\nenv: {WANDB_API_KEY: s3cr3t, A: b}\n")
    res = cli("plan", "--json", str(spec))
    assert res.returncode == 0, res.stderr
    view = json.loads(res.stdout)
    ranks = view["nodes"][0]["ranks"]
    assert [r["env"]["RANK"] for r in ranks] == ["0", "1"]
    assert ranks[0]["argv"][-1] == "t.py"
    assert "s3cr3t" not in res.stdout and ranks[0]["env"]["A"] == "b"
    assert view["spec"]["env"]["WANDB_API_KEY"] == "***"


def test_graph_is_mermaid():
    """`runner graph` prints a Mermaid state diagram."""
    res = cli("graph")
    assert res.returncode == 0 and res.stdout.startswith("stateDiagram-v2") and "RUNNING --> FAILED" in res.stdout


def test_graph_job_is_the_replica_groups_job_machine():
    """`runner graph --job` prints the job machine above replica groups; the plain graph stays the agent's."""
    res = cli("graph", "--job")
    assert res.returncode == 0 and res.stdout.startswith("stateDiagram-v2")
    assert "TRAINING --> DEGRADED: group_down [group_down]" in res.stdout and "RUNNING" not in res.stdout


def test_spec_reference_matches_the_schema():
    """docs/spec.md's field table is exactly what runner/config/reference.py renders from the schema."""
    from runner.config.reference import markdown

    page = (EXAMPLES.parent.parent / "docs" / "spec.md").read_text()
    assert markdown() in page, "run: python runner/config/reference.py and paste into docs/spec.md 'Every field'"
