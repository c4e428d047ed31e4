"""Watchdog fields never accepted and then ignored: heartbeat_timeout alone turns the watchdog on, and an explicit
`enabled: false` beside a field only the running watchdog reads is refused (exit 2, the field named, the fix given).

max_run_time needs no watchdog (runner/states/running.py arm_deadline), so it is neither refused nor a switch.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Job
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.config import load_spec_text
from runner.config.durations import parse_duration
from runner.config.loader import load_document
from runner.config.spec import JobSpec, Watchdog
from runner.errors import SpecError

HEAD = "name: wd\nentrypoint: train.py\n"
FIX = "remove watchdog.heartbeat_timeout, or set watchdog.enabled: true"
ABSENT = object()  # the key is not written at all


def load(watchdog_yaml: str) -> JobSpec:
    return load_spec_text(HEAD + watchdog_yaml, source="job.yaml", base_dir="/base", environ={})


def refused(watchdog_yaml: str) -> SpecError:
    with pytest.raises(SpecError) as caught:
        load(watchdog_yaml)
    return caught.value


def validate(tmp_path: Path, watchdog_yaml: str) -> Any:
    """`python -m runner validate job.yaml` on a spec with this watchdog section (train.py exists: no warning)."""
    job = Job(tmp_path, HEAD + watchdog_yaml)
    (job.tmp / "train.py").write_text("")
    return job.cli("validate")


# -- heartbeat_timeout alone turns the watchdog on ----------------------------------------------------------------


def test_heartbeat_timeout_alone_enables_the_watchdog() -> None:
    spec = load("watchdog: {heartbeat_timeout: 5s}\n")
    assert spec.watchdog == Watchdog(enabled=True, heartbeat_timeout=5.0)


def test_no_watchdog_section_and_a_null_heartbeat_leave_it_off() -> None:
    assert load("").watchdog.enabled is False
    assert load("watchdog: {heartbeat_timeout: null}\n").watchdog.enabled is False


def test_max_run_time_alone_does_not_enable_the_watchdog_and_needs_no_watchdog() -> None:
    """The deadline is armed by RUNNING whatever `enabled` says: it is no switch, and `enabled: false` beside it is fine."""
    assert load("watchdog: {max_run_time: 1h}\n").watchdog == Watchdog(max_run_time=3600.0)
    assert load("watchdog: {enabled: false, max_run_time: 1h}\n").watchdog == Watchdog(max_run_time=3600.0)


# -- an explicit enabled: false beside a field it would silence ---------------------------------------------------


def test_explicit_false_with_heartbeat_timeout_is_refused_by_the_cli(tmp_path: Path) -> None:
    res = validate(tmp_path, "watchdog:\n  enabled: false\n  heartbeat_timeout: 5s\n")
    assert res.returncode == 2, (res.stdout, res.stderr)
    line = next(ln for ln in res.stderr.splitlines() if "watchdog.heartbeat_timeout" in ln)
    assert re.search(r"job\.yaml:5:22: watchdog\.heartbeat_timeout: does nothing while watchdog\.enabled is false", line)
    assert line.endswith(FIX)
    assert "ok" not in res.stdout


def test_explicit_false_alone_is_accepted_by_the_cli(tmp_path: Path) -> None:
    res = validate(tmp_path, "watchdog: {enabled: false}\n")
    assert res.returncode == 0, res.stderr
    assert "job.yaml: ok" in res.stdout


def test_explicit_true_with_heartbeat_timeout_is_accepted_by_the_cli(tmp_path: Path) -> None:
    res = validate(tmp_path, "watchdog: {enabled: true, heartbeat_timeout: 5s}\n")
    assert res.returncode == 0, res.stderr
    assert "job.yaml: ok" in res.stdout


@pytest.mark.parametrize(
    ("written", "field"),
    [("check_interval: 1s", "check_interval"),
     ("capture_stacks: false\n  stall_timeout: null", "capture_stacks")],  # the stall detector (on) takes stacks
)
def test_explicit_false_with_a_changed_timer_field_is_refused(written: str, field: str) -> None:
    err = refused(f"watchdog:\n  enabled: false\n  {written}\n")
    (problem,) = err.problems
    assert (problem.path, problem.line) == (f"watchdog.{field}", 5)
    assert "does nothing while watchdog.enabled is false" in problem.message
    assert problem.fix == f"remove watchdog.{field}, or set watchdog.enabled: true"


def test_every_silenced_field_is_reported_at_once() -> None:
    err = refused("watchdog:\n  enabled: false\n  check_interval: 1s\n  capture_stacks: false\n"
                  "  heartbeat_timeout: 5s\n  max_run_time: 1h\n  stall_timeout: null\n")
    assert [p.path for p in err.problems] == [
        "watchdog.check_interval", "watchdog.capture_stacks", "watchdog.heartbeat_timeout",
    ]


def test_explicit_false_with_the_defaults_written_out_is_accepted() -> None:
    """A spec that writes every schema default (enabled: false, check_interval: 0.1, ...) says nothing unused."""
    spec = load("watchdog: {enabled: false, check_interval: 0.1, capture_stacks: true, heartbeat_timeout: null,"
                " max_run_time: null}\n")
    assert spec.watchdog == Watchdog()


def test_an_enabled_false_brought_by_a_merge_key_counts_as_written() -> None:
    err = refused("watchdog:\n  <<: {enabled: false}\n  heartbeat_timeout: 5s\n")
    assert [p.path for p in err.problems] == ["watchdog.heartbeat_timeout"]


def test_a_wrong_enabled_is_reported_alone_not_as_a_contradiction() -> None:
    """salvage checks the rest without the wrong value: its default must not be taken for an explicit false."""
    err = refused("watchdog:\n  enabled: maybe\n  heartbeat_timeout: 5s\n")
    assert [p.path for p in err.problems] == ["watchdog.enabled"]


# -- the rule, over generated watchdog sections -------------------------------------------------------------------

GOOD_DURATIONS = st.builds(
    lambda n, frac, unit: f"{n}{frac}{unit}",
    st.integers(0, 10**6), st.sampled_from(["", ".5", ".25"]), st.sampled_from(["", "ms", "s", "m", "h", "d"]),
)
BAD_DURATIONS = st.sampled_from(["soon", "-1s", "1x", "", "5 minutes", "1e999", ".inf"])
HEARTBEATS = st.one_of(st.just(ABSENT), st.none(), GOOD_DURATIONS, BAD_DURATIONS, st.integers(0, 10**5))
ENABLED = st.sampled_from([ABSENT, True, False])
CHECK_INTERVALS = st.sampled_from([ABSENT, 0.1, "100ms", "1s"])
CAPTURE_STACKS = st.sampled_from([ABSENT, True, False])


def seconds(value: Any) -> float | None:
    """What a heartbeat_timeout value builds to: None for null, -1 for a value the loader must refuse."""
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError:
        return -1.0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(enabled=ENABLED, heartbeat=HEARTBEATS, check_interval=CHECK_INTERVALS, capture_stacks=CAPTURE_STACKS)
def test_enabled_is_what_the_user_wrote_or_follows_heartbeat_timeout(
    enabled: Any, heartbeat: Any, check_interval: Any, capture_stacks: Any,
) -> None:
    """Only SpecError escapes; an accepted spec's watchdog is on iff `enabled: true`, or `enabled` unwritten and a
    heartbeat_timeout set; exactly the contradictions (and bad durations) are refused."""
    section = {key: value for key, value in (("enabled", enabled), ("heartbeat_timeout", heartbeat),
               ("check_interval", check_interval), ("capture_stacks", capture_stacks)) if value is not ABSENT}
    text = yaml.safe_dump({"name": "wd", "entrypoint": "train.py", "watchdog": section})
    try:
        spec: JobSpec | None = load_document(text, source="job.yaml", base_dir="/base", environ={})[0]
        problems: list[str] = []
    except SpecError as err:
        spec, problems = None, [p.path for p in err.problems]

    timeout = None if heartbeat is ABSENT else seconds(heartbeat)
    explicit_off = enabled is False
    # capture_stacks applies to the stall detector, on by default (watchdog.stall_timeout) with the watchdog off too
    silenced = explicit_off and (timeout is not None or check_interval == "1s")
    bad_timeout = timeout is not None and timeout <= 0  # unparsable, over the limit, or 0: refused as such
    if spec is not None:
        assert spec.watchdog.enabled is (enabled is True or (enabled is ABSENT and timeout is not None))
        assert not silenced and not bad_timeout
        assert spec.watchdog.heartbeat_timeout == timeout
    else:
        assert silenced or bad_timeout, problems
        if explicit_off and timeout is not None and not bad_timeout:
            assert "watchdog.heartbeat_timeout" in problems


# -- end to end: heartbeat_timeout alone catches a real hang -------------------------------------------------------

HANG_SCRIPT = """
import json, os, pathlib, sys, time

rank = int(os.environ["RANK"])
pathlib.Path(os.environ["OUT"], f"rank{rank}.json").write_text(json.dumps({"pid": os.getpid()}))  # reaped by `job`
beat = pathlib.Path(os.environ["RUNNER_HEARTBEAT_FILE"])
start = time.monotonic()
while rank == 0 or time.monotonic() - start < 1.0:  # rank 0 stays alive until the agent stops it
    beat.touch()
    time.sleep(0.1)
print(f"rank {rank}: silent from now on", flush=True)
time.sleep(3600)
"""


@pytest.mark.integration
def test_heartbeat_timeout_alone_ends_a_hung_job_as_a_hang(tmp_path: Path, job: Any) -> None:
    """No `enabled` written: rank 1 goes silent after ~1 s, the watchdog kills it 2 s later, the job fails (exit 1)
    with class `hang` in report.json instead of waiting forever."""
    script = tmp_path / "hang_after_1s.py"
    script.write_text(textwrap.dedent(HANG_SCRIPT))
    j = job(f"""
        name: hb-alone
        entrypoint: {{script: {script}}}
        nproc_per_node: 2
        # No restart (the first hang ends the job) and no standby: this test needs only the watchdog, not warm workers.
        restart: {{max_restarts: 0, standby: false}}
        watchdog: {{heartbeat_timeout: 2s}}
        shutdown: {{grace_period: 2s}}
        logs: {{dir: "${{LOGS}}"}}
    """)
    res = j.run(timeout=120)
    assert res.returncode == 1, res.stderr[-4000:]
    assert "watchdog: rank 1 sent no heartbeat for" in res.stderr
    report = json.loads((j.run_dir() / "report.json").read_text())
    assert report["outcome"] == "failed" and report["exit_code"] == 1
    failure = report["failures"][0]
    assert (failure["class"], failure["kind"], failure["rank"]) == ("hang", "watchdog", 1), failure
    assert report["duration_s"] < 60, report["duration_s"]  # ~1 s of beats + 2 s of silence, not a hang of its own
