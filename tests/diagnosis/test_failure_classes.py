"""Failure classes from evidence: real workers that raise, exit, are killed by the test or by the OOM killer.

The parsers of that evidence (tracebacks, kernel log records, memory.events) get property-based tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ci_skips import need
from conftest import wait_for
from failing_jobs import WORKER, failing_job, report, worker_pid
from hypothesis import given
from hypothesis import strategies as st

from runner.diagnosis import oom
from runner.diagnosis.evidence import fingerprint, traceback_parts
from runner.diagnosis.failure import Failure, default_class
from runner.outcomes import FailureClass, FailureKind
from runner.system.cgroup import JobCgroup

pytestmark = pytest.mark.integration


def test_a_python_exception_is_classed_exception_with_its_traceback(job: Any) -> None:
    """A worker that raises: class exception, the traceback kept, a fingerprint without the varying address."""
    j = failing_job(job, "raise")
    res = j.run()
    assert res.returncode == 1, res.stderr
    failure = report(j)["failures"][0]
    assert failure["class"] == "exception" and failure["kind"] == "worker"
    assert "Traceback (most recent call last)" in failure["stderr_tail"]
    assert "ValueError: bad batch at 0x" in failure["stderr_tail"]
    assert failure["fingerprint"] == f"ValueError: bad batch at N @ {WORKER}:fail"
    assert "class: exception" in res.stderr
    saved = json.loads((j.run_dir() / "attempt_0" / "failure.json").read_text())
    assert saved["class"] == "exception"


def test_a_plain_non_zero_exit_is_exception_without_fingerprint(job: Any) -> None:
    """exit(3) with no traceback: still `exception` (the process chose to fail), but it can never make a loop."""
    j = failing_job(job, "exit")
    assert j.run().returncode == 1
    failure = report(j)["failures"][0]
    assert (failure["class"], failure["exit_code"]) == ("exception", 3)
    assert "fingerprint" not in failure


def test_sigkill_from_the_test_is_signal_with_the_oom_hint_but_no_evidence(job: Any) -> None:
    """SIGKILL is what the OOM killer sends, but here the test sent it: `signal`, with the hint, not `oom`."""
    j = failing_job(job, "wait")
    j.start()
    os.kill(worker_pid(j), signal.SIGKILL)
    assert j.proc is not None and j.proc.wait(60) == 1
    failure = report(j)["failures"][0]
    assert (failure["class"], failure["signal"]) == ("signal", "SIGKILL")
    assert "OOM" in failure["hint"] and "evidence" not in failure


def test_sigterm_from_outside_is_preempted_and_restarts_uncharged(job: Any) -> None:
    """A worker stopped by SIGTERM not sent by the runner (a scheduler's preemption): `preempted`, restarted
    although max_restarts is 0, and the job-wide count stays 0."""
    j = failing_job(job, "wait")
    j.start()
    os.kill(worker_pid(j), signal.SIGTERM)
    assert j.proc is not None and j.proc.wait(60) == 0
    data = report(j)
    assert (data["outcome"], data["restarts"], data["attempts"]) == ("succeeded", 0, 2)
    assert data["failures"][0]["class"] == "preempted"
    assert ("FAILED", "retry", "RESTARTING") in j.edges()
    retry = next(t for t in j.transitions() if t["trigger"] == "retry")
    assert "not charged to max_restarts" in retry["reason"]


# --- a real OOM kill: the runner in a memory-limited cgroup, its worker allocating past the limit ---

LIMIT = 256 * 1024 * 1024


def v2_memory_cgroup(name: str) -> Path | None:
    """A cgroup v2 with memory.max, made under the test's own cgroup when the memory controller is delegated."""
    base = JobCgroup.create(name)
    if base is None:
        return None
    try:
        if "memory" not in (base.path / "cgroup.controllers").read_text().split():
            base.remove()
            return None
        (base.path / "memory.max").write_text(str(LIMIT))
        with contextlib.suppress(OSError):
            (base.path / "memory.swap.max").write_text("0")
    except OSError:
        base.remove()
        return None
    return base.path


def v1_memory_cgroup(name: str) -> Path | None:
    """A cgroup v1 memory group with a limit (machines where memory is not in cgroup v2): kernel-log evidence."""
    root = Path("/sys/fs/cgroup/memory")
    own = next((line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                if line.split(":")[1] == "memory"), None)
    if own is None or not (root / own.lstrip("/")).is_dir():
        return None
    path = root / own.lstrip("/") / f"runner-test-{name}-{os.getpid()}"
    try:
        path.mkdir()
        (path / "memory.limit_in_bytes").write_text(str(LIMIT))
        with contextlib.suppress(OSError):
            (path / "memory.swappiness").write_text("0")
    except OSError:
        with contextlib.suppress(OSError):
            path.rmdir()
        return None
    return path


@pytest.fixture
def memory_limited() -> Iterator[Path]:
    """A memory-limited cgroup the runner can be started in; skipped where the machine offers none."""
    path = v2_memory_cgroup("oom") or v1_memory_cgroup("oom")
    if path is None:
        need("no cgroup memory control here (cgroup v2 memory controller not delegated, no writable v1 "
                    "memory hierarchy): an OOM kill cannot be caused safely")
    if not (path / "memory.max").exists() and not os.access("/dev/kmsg", os.R_OK):
        path.rmdir()
        need("cgroup v1 only and /dev/kmsg unreadable: no evidence of an OOM kill could be read here")
    yield path
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            path.rmdir()
            break
        except OSError:
            time.sleep(0.1)


def test_a_real_oom_kill_is_classed_oom_with_evidence_and_not_restarted(job: Any, memory_limited: Path) -> None:
    """The worker allocates past the cgroup's limit: the kernel's OOM killer kills it; the class is `oom` with
    the evidence named, and (oom: 0 by default) the job stops at once although max_restarts is 3."""
    j = failing_job(job, "alloc", fails=99, max_restarts=3)
    enter = 'echo $$ > "$0/cgroup.procs" && exec "$@"'
    proc = subprocess.Popen(
        ["/bin/sh", "-c", enter, str(memory_limited), sys.executable, "-m", "runner", str(j.spec)],
        cwd=j.tmp, env=j.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    j.proc = proc  # reaped by the fixture if anything below fails
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    data = report(j)
    failure = data["failures"][0]
    assert failure["class"] == "oom", failure
    assert failure["evidence"] and ("OOM kill" in failure["evidence"] or "kernel log" in failure["evidence"])
    assert data["attempts"] == 1 and data["restarts"] == 0
    assert "oom failures have no restart left (restart.budgets.oom: 0)" in j.transitions()[-1]["reason"]


# --- the evidence's parsers ---

TB = """Traceback (most recent call last):
  File "/x/train.py", line {line}, in <module>
    main()
  File "/x/model.py", line {inner}, in forward
    raise RuntimeError(msg)
RuntimeError: shape [{n}, 3] at 0x{addr:x} does not match
"""


@given(st.integers(1, 10**6), st.integers(1, 10**6), st.integers(0, 10**9), st.integers(0, 2**48))
def test_fingerprint_ignores_numbers_and_addresses(line: int, inner: int, n: int, addr: int) -> None:
    """Line numbers, sizes and addresses vary between attempts of one bug: the fingerprint does not."""
    one = fingerprint(TB.format(line=line, inner=inner, n=n, addr=addr))
    assert one == "RuntimeError: shape [N, N] at N does not match @ /x/model.py:forward"


def test_fingerprint_tells_different_exceptions_and_frames_apart() -> None:
    base = TB.format(line=1, inner=2, n=3, addr=4)
    assert fingerprint(base) != fingerprint(base.replace("RuntimeError: shape", "ValueError: shape"))
    assert fingerprint(base) != fingerprint(base.replace("in forward", "in backward"))
    assert fingerprint("no traceback here\nexit 3") == ""
    # the frame's path is kept whole: a checkout in /tmp/fresh2 is not one in /tmp/fresh3 (nor named /tmp/freshN)
    in_2 = fingerprint(base.replace("/x/model.py", "/runs/exp2/model.py"))
    assert in_2.endswith("@ /runs/exp2/model.py:forward") and in_2 != fingerprint(base.replace("/x/", "/runs/exp3/"))


def test_the_last_traceback_of_a_stderr_tail_counts() -> None:
    """Chained exceptions (or output after them): the final exception and its innermost frame."""
    text = TB.format(line=1, inner=2, n=3, addr=4) + "\nDuring handling...\n" + TB.replace(
        "RuntimeError", "KeyError").format(line=1, inner=2, n=3, addr=4) + "some log line after\n"
    assert traceback_parts(text) == ("KeyError: shape [3, 3] at 0x4 does not match", "/x/model.py:forward")


@given(st.text(max_size=400))
def test_traceback_parsing_never_fails_on_any_text(text: str) -> None:
    parts = traceback_parts(text)
    assert parts is None or parts[0]
    assert isinstance(fingerprint(text), str)


@pytest.mark.parametrize(
    ("message", "pid"),
    [
        ("Out of memory: Killed process 4242 (python3) total-vm:123kB, anon-rss:99kB", 4242),
        ("Memory cgroup out of memory: Killed process 4242 (python) total-vm:1kB", 4242),
        ("oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),task=python,pid=4242,uid=0", 4242),
    ],
)
def test_kernel_log_records_of_the_oom_killer_name_the_pid(message: str, pid: int) -> None:
    record = f"3,1207,5000000,-;{message}\n SUBSYSTEM=memory"
    assert oom.match_record(record, pid, since_us=4_000_000) == message
    assert oom.match_record(record, pid + 1, since_us=0) == ""  # another process
    assert oom.match_record(record, pid, since_us=6_000_000) == ""  # before the worker started: a recycled pid


@given(st.text(max_size=300), st.integers(1, 2**22), st.integers(0, 2**40))
def test_any_kernel_log_record_parses_without_error(record: str, pid: int, since: int) -> None:
    assert isinstance(oom.match_record(record, pid, since), str)


def test_kernel_log_that_cannot_be_read_is_no_evidence(tmp_path: Path) -> None:
    assert oom.kernel_log_kill(1, 0, path=tmp_path / "missing") == ""


@given(st.lists(st.tuples(st.sampled_from(["low", "high", "max", "oom", "oom_kill", "oom_group_kill", "x"]),
                          st.integers(0, 10**6)), max_size=8))
def test_memory_events_oom_kill_is_read_from_the_file(tmp_path_factory: Any, lines: list[tuple[str, int]]) -> None:
    """memory.events as the kernel writes it ("key value" lines): oom_kill's value, 0 without the line."""
    path = tmp_path_factory.mktemp("cg")
    (path / "memory.events").write_text("".join(f"{k} {v}\n" for k, v in lines))
    expected = next((v for k, v in lines if k == "oom_kill"), 0)
    assert JobCgroup.oom_kills(path) == expected
    assert JobCgroup.oom_kills(path / "gone") == 0


def test_default_classes_of_each_kind() -> None:
    assert default_class(FailureKind.WORKER, None) is FailureClass.EXCEPTION
    assert default_class(FailureKind.WORKER, "SIGKILL") is FailureClass.SIGNAL
    assert default_class(FailureKind.WORKER, "SIGTERM") is FailureClass.PREEMPTED
    assert default_class(FailureKind.WATCHDOG, None) is FailureClass.HANG
    assert default_class(FailureKind.PEER, None, "node b lost: lease expired or node left") is FailureClass.NODE_LOST
    assert default_class(FailureKind.PEER, None, "node b lost: node ended (stopped)") is FailureClass.PREEMPTED
    assert default_class(FailureKind.RENDEZVOUS, None) is FailureClass.INFRA


def test_oom_evidence_turns_a_signal_into_oom_and_is_reported() -> None:
    killed = Failure(kind=FailureKind.WORKER, reason="rank 0 killed by SIGKILL", attempt=0, signal="SIGKILL")
    assert killed.with_oom_evidence("") is killed
    classed = killed.with_oom_evidence("kernel log: Out of memory: Killed process 7 (python)")
    assert classed.failure_class is FailureClass.OOM and classed.to_dict()["class"] == "oom"
    assert "class: oom (kernel log: Out of memory" in classed.report()


def test_the_metrics_count_failures_by_class() -> None:
    """runner_failures_total{class=...}, scraped from the agent's real endpoint."""
    import urllib.request

    from runner.config import load_spec_text
    from runner.observe.metrics import AgentMetrics

    spec = load_spec_text("name: j\nentrypoint: t.py\nmetrics: {enabled: true, host: 127.0.0.1, port: 0}\n",
                          environ={})
    metrics = AgentMetrics(spec, "node0")
    metrics.on_failure("hang")  # before start(): nothing to count in, nothing raised
    port = metrics.start()
    try:
        for cls in ("oom", "oom", "node_lost"):
            metrics.on_failure(cls)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    finally:
        metrics.stop()
    from metrics_scrape import has_series, value  # read with prometheus_client's parser, not as text

    assert value(text, 'runner_failures_total{class="oom"}') == 2.0
    assert value(text, 'runner_failures_total{class="node_lost"}') == 1.0
    assert not has_series(text, "runner_failures_total", **{"class": "hang"})


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("sig", "cls"), [(signal.SIGTERM, "preempted"), (signal.SIGKILL, "node_lost")],
                         ids=["sigterm-preempted", "sigkill-node-lost"])
def test_a_peer_that_leaves_is_preempted_or_lost_and_restarts_uncharged(
    cluster: Any, sig: signal.Signals, cls: str
) -> None:
    """Elastic 2:3, max_restarts 0: node c's agent gets the scheduler's SIGTERM (it publishes that it was stopped
    before leaving) or is SIGKILLed (its lease expires); a and b class the loss `preempted` / `node_lost`,
    restart without charging max_restarts, and finish with two nodes."""
    from multinode_helpers import probe_args, spec_text

    c = cluster
    try:
        c.write(spec_text(c.endpoint, nodes="2:3", args=probe_args(c.out, "--sleep", "6"), restart="max_restarts: 0"))
        a, b, gone = c.start("a"), c.start("b"), c.start("c")
        wait_for(lambda: all(n.state() == "RUNNING" for n in (a, b, gone)), what="all RUNNING")
        gone.proc.send_signal(sig)
        gone.wait()
        assert a.wait() == 0 and b.wait() == 0, a.output() + b.output()
        for node in (a, b):
            data = node.report()
            assert (data["outcome"], data["restarts"]) == ("succeeded", 0), data
            assert [f["class"] for f in data["failures"]] == [cls], data["failures"]
            assert ("FAILED", "retry", "RESTARTING") in node.edges()
    finally:
        c.close()
