"""Prometheus metrics on the agent: scraped over HTTP during a real run with a restart, they show the state
changes; without metrics.enabled the agent never imports prometheus_client."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import RUNNER, wait_for
from metrics_scrape import has_series, value
from torchft_mark import needs_torchft

from runner.rendezvous.ports import free_port

pytestmark = pytest.mark.integration

WORKER = """
import os, sys, time
out = sys.argv[1]
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["RANK"] == "1":
    sys.exit(7)
open(os.path.join(out, "running-" + os.environ["RANK"]), "w").close()
while not os.path.exists(os.path.join(out, "release")):
    time.sleep(0.1)
"""


def scrape(port: int) -> str:
    """GET /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return resp.read().decode()


def start_metered(tmp_path: Path, worker: str, name: str, shape: str) -> tuple[Path, int, subprocess.Popen[bytes]]:
    """Start the runner on a job `name` of `worker` (given its out folder) with metrics on a free port; `shape`: the
    spec's lines for its workers and restarts. (out folder, metrics port, the runner's process)."""
    out, port = tmp_path / "out", free_port("127.0.0.1")
    out.mkdir()
    (tmp_path / "worker.py").write_text(worker)
    (tmp_path / "job.yaml").write_text(f"""\
name: {name}
entrypoint: {{script: worker.py, args: ["{out}"]}}
{shape}
shutdown: {{grace_period: 5s}}
logs: {{dir: "{tmp_path / 'logs'}", tee: false}}
metrics: {{enabled: true, host: 127.0.0.1, port: {port}}}
""")
    proc = subprocess.Popen([*RUNNER, str(tmp_path / "job.yaml")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out, port, proc


@contextlib.contextmanager
def released_at_the_end(out: Path, port: int, proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """Around the scrapes of a metered run: then its workers are released and it must exit 0 (killed if the body
    failed), and its endpoint must be gone with the agent."""
    try:
        yield
        (out / "release").touch()
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with pytest.raises(OSError):
        scrape(port)


def test_scrape_during_a_run_shows_state_attempt_restarts_and_exits(tmp_path: Path) -> None:
    """Attempt 0 fails (rank 1 exits 7), attempt 1 runs: the endpoint shows RUNNING, attempt 1, one restart used,
    one failed exit, two rendezvous rounds and the FAILED -> RESTARTING transition."""
    out, port, proc = start_metered(tmp_path, WORKER, "metrics", "nproc_per_node: 2\nrestart: {max_restarts: 2}")
    with released_at_the_end(out, port, proc):
        wait_for(lambda: (out / "running-0").exists() and (out / "running-1").exists(), 120, "attempt 1")
        wait_for(lambda: value(scrape(port), 'runner_state{runner_state="RUNNING"}') == 1.0, 60, "RUNNING")
        text = scrape(port)
        assert value(text, 'runner_state{runner_state="FAILED"}') == 0.0
        assert value(text, "runner_attempt") == 1.0
        assert value(text, "runner_restarts_used") == 1.0
        assert value(text, "runner_max_restarts") == 2.0
        assert value(text, 'runner_worker_exits_total{cause="failed"}') == 1.0
        assert value(text, 'runner_failures_total{class="exception"}') == 1.0  # a plain non-zero exit
        assert value(text, "runner_rendezvous_duration_seconds_count") == 2.0
        assert value(text, 'runner_transitions_total{dst="RESTARTING",src="FAILED",trigger="retry"}') == 1.0
        assert (value(text, "runner_seconds_since_last_transition") or -1) >= 0
        assert has_series(text, "runner_job_info", job="metrics")


def test_agent_does_not_import_prometheus_client_unless_enabled() -> None:
    """Importing the agent (and the CLI) loads no prometheus_client: start-up stays fast."""
    code = "import sys, runner.agent.agent, runner.cli.main; print('prometheus_client' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_hooks_before_start_are_no_ops() -> None:
    """AgentMetrics has no side effects until start(): hooks before it record nothing and raise nothing."""
    from runner.config import load_spec_text
    from runner.observe.metrics import AgentMetrics

    metrics = AgentMetrics(load_spec_text("name: j\nentrypoint: t.py\n", environ={}), "node0")
    metrics.on_transition("INIT", "RENDEZVOUS", "initialized", 0, 0)
    metrics.on_worker_exit("failed")
    metrics.stop()
    assert metrics.port is None


GROUP_WORKER = """
import json, os, sys, time
out, group = sys.argv[1], os.environ["REPLICA_GROUP_ID"]
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
if group == "1" and attempt == "0":
    sys.exit(5)  # group 1's first attempt fails: it restarts alone
tmp = os.environ["RUNNER_HEARTBEAT_FILE"] + ".tmp"
with open(tmp, "w") as f:
    json.dump({"step": 40 + int(group)}, f)  # what a TorchFT script writes after each committed step
os.replace(tmp, os.environ["RUNNER_HEARTBEAT_FILE"])
open(os.path.join(out, "running-" + group), "w").close()
while not os.path.exists(os.path.join(out, "release")):
    time.sleep(0.1)
"""


@needs_torchft
def test_replica_groups_export_each_groups_state_restarts_and_committed_step(tmp_path: Path) -> None:
    """Two groups, group 1's first attempt fails: every series is labelled with its group."""
    out, port, proc = start_metered(tmp_path, GROUP_WORKER, "groupmetrics",
                                    "replica_groups: {count: 2, nproc_per_node: 1}\n"
                                    "restart: {max_restarts: 2, backoff: {initial: 0s}}")
    with released_at_the_end(out, port, proc):
        wait_for(lambda: (out / "running-0").exists() and (out / "running-1").exists(), 120, "both groups")
        wait_for(lambda: value(scrape(port), 'runner_group_committed_step{group="1"}') == 41.0, 60, "group 1's step")
        text = scrape(port)
        assert value(text, 'runner_group_committed_step{group="0"}') == 40.0
        assert value(text, 'runner_group_state{group="0",runner_group_state="RUNNING"}') == 1.0
        assert value(text, 'runner_group_state{group="1",runner_group_state="RUNNING"}') == 1.0
        assert (value(text, 'runner_group_attempt{group="0"}'), value(text, 'runner_group_attempt{group="1"}')) \
            == (0.0, 1.0)
        assert value(text, 'runner_group_restarts_used{group="1"}') == 1.0
        assert value(text, 'runner_group_failures_total{class="exception",group="1"}') == 1.0
        assert value(text, 'runner_group_failures_total{class="exception",group="0"}') is None
        assert value(text, 'runner_group_transitions_total{dst="RESTARTING",group="1",src="FAILED",trigger="retry"}') \
            == 1.0
        assert value(text, "runner_lighthouse_restarts") == 0.0
        assert has_series(text, "runner_job_info", job="groupmetrics")
