"""A worker whose code ended cleanly but whose interpreter died in its teardown is not a failure.

gloo's threads meeting the interpreter's exit sometimes abort it (SIGABRT, "terminate called without an active
exception") after the work is done, under runner and torchrun alike (bench/abort_at_exit.py); a job whose work was
over was then restarted. A worker run in a standby marks, from the last Python atexit handler, that its code and
handlers ended cleanly; a death by signal after that mark counts as exit 0, with a warning.
Here the teardown death is made certain: an object's finalizer aborts the process when module globals are cleared.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import ROOT, RUNNER, Job

from runner.contract import CODE_ENDED_FILE

pytestmark = pytest.mark.integration

SCRIPT = """
import atexit, os, sys

class DiesInTeardown:
    def __del__(self):  # runs when the interpreter clears this module's globals: after every atexit handler
        os.abort()

keeper = DiesInTeardown()
atexit.register(lambda: open(os.path.join(os.environ["OUT_DIR"], f"rank{os.environ['RANK']}.atexit"), "w").close())
if os.environ.get("FAIL_RANK") == os.environ["RANK"]:
    sys.exit(3)
"""


def run(tmp_path, *, standby: str, fail_rank: str = "") -> tuple[Job, dict]:
    (tmp_path / "w.py").write_text(SCRIPT)
    out = tmp_path / "out"
    j = Job(tmp_path, f"""
        version: 1
        name: teardown
        entrypoint: {{script: w.py}}
        nproc_per_node: 2
        env: {{OUT_DIR: "{out}", FAIL_RANK: "{fail_rank}"}}
        restart: {{max_restarts: 0, standby: true, preload: []}}
        shutdown: {{grace_period: 5s}}
        logs: {{dir: "${{LOGS}}"}}
    """)
    env = dict(j.env(), RUNNER_STANDBY=standby)
    res = subprocess.run([*RUNNER, str(j.spec)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    report = json.loads((j.run_dir() / "report.json").read_text())
    report["_exit"] = res.returncode
    return j, report


def test_a_death_in_teardown_after_a_clean_end_counts_as_success(tmp_path):
    j, report = run(tmp_path, standby="1")
    assert report["standby"]["handed_off"] == 2  # both ran in standbys
    assert (report["_exit"], report["outcome"]) == (0, "succeeded")
    assert "worker_died_in_teardown" in report["warnings"]
    assert all((tmp_path / "out" / f"rank{r}.atexit").exists() for r in (0, 1))  # their own handlers ran
    assert all((j.run_dir() / "attempt_0" / f"rank_{r}" / "code_ended").exists() for r in (0, 1))


def test_a_worker_that_failed_is_still_a_failure(tmp_path):
    j, report = run(tmp_path, standby="1", fail_rank="1")
    assert (report["_exit"], report["outcome"]) == (1, "failed")
    assert not (j.run_dir() / "attempt_0" / "rank_1" / "code_ended").exists()


def test_a_cold_worker_gives_no_such_mark(tmp_path):
    """Without a standby runner has no hook in the worker: the abort is a failure, as under torchrun."""
    j, report = run(tmp_path, standby="0")
    assert report["standby"] == {"enabled": False} or report["standby"].get("handed_off", 0) == 0
    assert (report["_exit"], report["outcome"]) == (1, "failed")


def test_the_standby_and_the_agent_name_the_same_mark():
    """standby_main imports nothing of runner's, so it spells the file's name itself: the two must agree."""
    source = (ROOT / "runner" / "workers" / "standby_main.py").read_text()
    assert f'ENDED_FILE = "{CODE_ENDED_FILE}"' in source
