"""A worker that ran in a standby and ended cleanly has its default process group destroyed at exit.

gloo's threads left to the interpreter's exit sometimes abort it (SIGABRT, "terminate called without an active
exception") after the work is done (bench/abort_at_exit.py counts it under each launcher). The standby destroys the
group once the script's own code and atexit handlers are done; a script that failed is left alone.
"""

from __future__ import annotations

import json

import pytest
from conftest import Job

pytestmark = pytest.mark.integration

SCRIPT = """
import atexit, json, os, sys
import torch.distributed as dist

out = os.environ["OUT_DIR"]
dist.init_process_group("gloo")
rank = dist.get_rank()
real = dist.destroy_process_group

def spy(*args, **kwargs):  # who destroys the group, and when
    with open(os.path.join(out, f"rank{rank}.destroyed"), "w") as f:
        f.write("destroyed")
    return real(*args, **kwargs)

dist.destroy_process_group = spy

def own_handler():  # the script's own handler runs first: the group is still there for it
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"initialized": dist.is_initialized()}, f)

atexit.register(own_handler)
if os.environ.get("FAIL_RANK") == str(rank):
    sys.exit(3)
"""


def run(tmp_path, fail_rank: str = ""):
    (tmp_path / "w.py").write_text(SCRIPT)
    out = tmp_path / "out"
    j = Job(tmp_path, f"""
        version: 1
        name: clean-exit
        entrypoint: {{script: w.py}}
        nproc_per_node: 2
        env: {{OUT_DIR: "{out}", FAIL_RANK: "{fail_rank}"}}
        restart: {{max_restarts: 0, standby: true}}
        shutdown: {{grace_period: 5s}}
        logs: {{dir: "${{LOGS}}"}}
    """)
    proc = j.start()
    proc.communicate(timeout=120)
    return j, out


def test_a_clean_worker_leaves_no_process_group_to_the_interpreter_exit(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNNER_STANDBY", "1")
    j, out = run(tmp_path)
    assert j.proc.returncode == 0
    assert json.loads((j.run_dir() / "report.json").read_text())["standby"]["handed_off"] == 2  # in standbys
    for rank in (0, 1):
        assert json.loads((out / f"rank{rank}.json").read_text()) == {"initialized": True}  # its handler first
        assert (out / f"rank{rank}.destroyed").read_text() == "destroyed"  # then the standby's


def test_a_failed_worker_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNNER_STANDBY", "1")
    j, out = run(tmp_path, fail_rank="1")
    assert j.proc.returncode == 1
    assert not (out / "rank1.destroyed").exists()  # exit code 3: nothing is destroyed for it
