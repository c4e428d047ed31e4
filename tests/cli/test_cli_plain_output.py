"""Every `runner` subcommand's human output, on a real run, reads as text: no Python repr (`{'`, `[{`, `<object`).

One real local job (a worker that raises on attempt 0 and succeeds on attempt 1, so the node ledger, a recovery and
an ETTR are all there), then every subcommand on it; and the header of an etcd job's status, whose shape (round,
nodes in the round, groups, ledger) a local run does not have.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
from typing import Any

import pytest
from conftest import EXAMPLES, RUNNER, Job
from failing_jobs import failing_job

from runner.cli.commands import names
from runner.cli.status import plain, print_status
from runner.runs.status import basis_legend, ettr, watch_key

# `{'`, `[{` and `<object`, and a runner class's or a datetime's repr; `[{node}:{rank}]` (logs.prefix, a template of
# the spec) is not one.
REPR = re.compile(r"\{'|\[\{(?![a-z_]+\})|<object|<runner\.|datetime\.")


def reprs_in(text: str) -> list[str]:
    """The lines of `text` that show a Python repr."""
    return [line for line in text.splitlines() if REPR.search(line)]


def test_the_scan_itself_catches_a_repr() -> None:
    assert reprs_in("ledger=[{'node': 'vm'}]\nfine") == ["ledger=[{'node': 'vm'}]"]
    assert reprs_in(f"x={object()}") and reprs_in("x=[{1: 2}]") and not reprs_in("job=ft · state RUNNING")
    assert not reprs_in("    prefix: '[{node}:{rank}] '")
    assert reprs_in(html.unescape("<td>{&#x27;node&#x27;: 1}</td>"))  # the report page is read unescaped


def human(j: Job, *args: str, target: str | None = None) -> str:
    """stdout and stderr of `runner ARGS [target]` (the spec unless given), checked not to be a traceback."""
    argv = [*RUNNER, *args, *([target] if target is not None else [])]
    done = subprocess.run(argv, cwd=j.tmp, env=j.env(), capture_output=True, text=True, timeout=120, check=False)
    both = done.stdout + done.stderr
    assert "Traceback" not in both, both
    return both


@pytest.mark.integration
def test_every_subcommand_prints_text_not_reprs(job: Any) -> None:
    j = job(failing_job(job, "raise", fails=1, max_restarts=1).spec.read_text().replace(
        'logs: {dir: "${LOGS}"}', 'logs: {dir: "${LOGS}", format: console}'))
    ran = j.run()
    assert ran.returncode == 0, ran.stderr
    report = j.tmp / "report.html"
    converted = human(j, "convert", "--", "torchrun", "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-id", "t",
                      "--redirects", "3", "train.py", "--lr", "0.1")
    outputs = {
        "run": ran.stdout + ran.stderr,
        "status": human(j, "status", target=str(j.spec)),
        "status --watch": human(j, "status", "--watch", target=str(j.spec)),
        "status JOB": human(j, "status", target="fc"),
        "validate": human(j, "validate", target=str(j.spec)),
        "plan": human(j, "plan", target=str(j.spec)),
        "graph": human(j, "graph"),
        "runs": human(j, "runs"),
        "report": human(j, "report", "fc", "-o", str(report)),
        "report page": html.unescape(report.read_text()),
        "stop": human(j, "stop", target=str(j.spec)),
        "reset": human(j, "reset", target=str(j.spec)),
        "template slurm": human(j, "template", "slurm", target=str(j.spec)),
        "template kubernetes": human(j, "template", "kubernetes", target=str(j.spec)),
        "convert": converted,
        "validate example": human(j, "validate", target=str(EXAMPLES / "ft_train.yaml")),
        "plan example": human(j, "plan", target=str(EXAMPLES / "multinode.yaml")),
        "secret": human(j, "secret", "--new", target=str(j.tmp / "job.secret")),
        "secret again": human(j, "secret", "--new", target=str(j.tmp / "job.secret")),  # refused: it exists
    }
    assert {name.split()[0] for name in outputs} >= set(names())  # every subcommand, none forgotten
    found = {name: reprs_in(text) for name, text in outputs.items() if reprs_in(text)}
    assert not found, json.dumps(found, indent=2)
    status = outputs["status"]
    assert "node ledger (across runs):" in status and "exception 1" in status  # the ledger, as a table only
    assert "ledger=" not in status and "ETTR " in status


ETCD_STATUS: dict[str, Any] = {  # as runner.rendezvous.etcd.admin.read_status shapes it, replica groups and all
    "job": "ft", "status": "running", "round": 3, "result_round": 3, "nodes_in_round": ["a", "b"],
    "world_size": 4, "master_addr": None, "master_port": None, "restarts": 1, "backend": "etcd",
    "groups": [{"group": 0, "status": "running", "round": 3, "world_size": 2, "restarts": 1}],
    "nodes": [{"node": "a", "state": "RUNNING", "attempt": 1, "group": 0, "workers": [{"rank": 0, "pid": 7}],
               "ledger": {"basis": "ready", "ettr": 0.82, "lost_s": 0.0, "wall_s": 9.0}}],
    "ledger": [{"node": "a", "last_seen": 1.0e9, "counts": {"exception": 1},
                "marks": [{"class": "exception", "reason": "rank 1 exited with code 1", "culprit": False}]}],
}


def test_the_status_header_of_an_etcd_job_is_plain(capsys: pytest.CaptureFixture[str]) -> None:
    print_status(ETCD_STATUS)
    out = capsys.readouterr().out
    assert not reprs_in(out), out
    head = out.splitlines()[0]
    assert "nodes_in_round=a,b" in head and "master_addr=-" in head and "ledger" not in head
    assert "ETTR 0.82 [ready]" in out  # no steps reported: the basis is said, and what it means
    assert "ETTR [ready]: no step reported: counted from the workers' readiness" in out


def test_ettr_says_its_basis_unless_steps() -> None:
    assert ettr({"ettr": 0.93, "lost_s": 3.1, "basis": "steps"}) == "0.93 (lost 3.1s)"
    assert ettr({"ettr": 0.82, "lost_s": 0.0, "basis": "ready"}) == "0.82 [ready]"
    assert ettr({"ettr": 0.5, "lost_s": 0.4, "basis": "running"}) == "0.50 [running] (lost 0.4s)"
    assert ettr(None) == "-" and ettr({"ettr": 2}) == "?"
    assert basis_legend([{"basis": "steps"}, None]) == []
    assert [line.split(":")[0] for line in basis_legend([{"basis": "running"}, {"basis": "ready"}])] == [
        "ETTR [ready]", "ETTR [running]"]


def test_plain_never_shows_a_repr() -> None:
    assert plain(None) == "-" and plain(["a", "b"]) == "a,b" and plain([]) == "-"
    assert plain({"hosted": True, "address": None}) == "hosted:True,address:-"
    assert not reprs_in(plain([{"node": "a"}]))


def test_the_watch_key_ignores_the_clocks_and_sees_a_change() -> None:
    moved = json.loads(json.dumps(ETCD_STATUS))
    moved["nodes"][0]["ledger"] = {"basis": "ready", "ettr": 0.9, "lost_s": 0.0, "wall_s": 12.0}  # later totals
    assert watch_key(moved) == watch_key(ETCD_STATUS)
    moved["nodes"][0]["workers"][0]["exit_code"] = 1
    assert watch_key(moved) != watch_key(ETCD_STATUS)
    moved = json.loads(json.dumps(ETCD_STATUS))
    moved["nodes"][0]["state"] = "RESTARTING"
    assert watch_key(moved) != watch_key(ETCD_STATUS)

