"""The agent's console: calm lines on a terminal (a real pty), JSON lines otherwise, and a closed console never
stops the job. Unit tests drive the renderer with events shaped like the agent's; the rest run real jobs."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import pty
import re
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from runner.console import ConsoleRenderer, ConsoleWriter, LevelFilter, level_number

STAMP = "2026-01-02T03:04:05.000001Z"
LOCAL = dt.datetime.fromisoformat(STAMP).astimezone().strftime("%H:%M:%S")
EPOCH_FLOAT = re.compile(r"\b1\d{9}\.\d+")

# A worker that needs no torch: rank 1 fails on attempt 0, everyone succeeds on attempt 1.
FLAKY = """\
import os, sys
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"rank {rank} attempt {attempt} says hello", flush=True)
if rank == 1 and attempt == 0:
    print("boom on purpose", file=sys.stderr, flush=True)
    sys.exit(7)
"""
SPEC = """\
version: 1
name: calm
entrypoint: {script: flaky.py}
nproc_per_node: 2
restart: {max_restarts: 2, backoff: {initial: 0.1s}}
shutdown: {grace_period: 5s}
logs: {dir: logs}
"""


def render(event: dict, verbose: bool = False, renderer: ConsoleRenderer | None = None) -> str:
    r = renderer or ConsoleRenderer(colors=False, verbose=verbose)
    return r(None, event.get("level", "info"), {"timestamp": STAMP, "level": "info", **event})


def test_transition_is_one_short_line_with_the_round_spelled_out() -> None:
    line = render({"event": "transition", "src": "RENDEZVOUS", "dst": "RUNNING", "trigger": "rendezvous_complete",
                   "reason": "round 0: 2 node(s), world size 4, master 10.0.0.5:41231", "attempt": 0,
                   "time": 1767323045.1, "job": "j", "node": "n"})
    assert line == f"{LOCAL}  RENDEZVOUS → RUNNING      round 0 · 2 nodes · world 4 · master 10.0.0.5:41231"


def test_header_names_job_node_and_run_dir_once_and_the_first_transition_does_not_repeat_it() -> None:
    r = ConsoleRenderer(colors=False)
    head = render({"event": "run_started", "run_dir": "/r/d", "nproc_per_node": 2, "nodes": "2:4",
                   "backend": "etcd", "job": "train", "node": "n1"}, renderer=r)
    assert "job train · node n1" in head and "nodes 2:4" in head and "logs /r/d" in head
    first = render({"event": "transition", "src": "INIT", "dst": "RENDEZVOUS", "reason": "logs in /r/d",
                    "job": "train", "node": "n1"}, renderer=r)
    assert first == f"{LOCAL}  INIT → RENDEZVOUS"
    fail = render({"event": "failure", "level": "error", "reason": "rank 1 exited with code 7", "error": "E: x",
                   "hint": "h", "log_dir": "/r/d/attempt_0/rank_1"}, renderer=r)
    assert fail.splitlines() == [" " * 10 + "error E: x", " " * 10 + "hint  h", " " * 10 + "logs  attempt_0/rank_1"]


def test_shutdown_line_carries_the_outcome_and_colours_only_when_asked() -> None:
    event = {"event": "transition", "src": "RUNNING", "dst": "SHUTDOWN", "reason": "all 2 worker(s) exited with code 0",
             "outcome": "succeeded"}
    assert render(event).endswith("all 2 worker(s) exited with code 0 · succeeded")
    assert "\x1b[" not in render(event)
    assert "\x1b[32mSHUTDOWN" in render(event, renderer=ConsoleRenderer(colors=True))


def test_routine_events_wait_for_verbose_but_warnings_always_show() -> None:
    started = {"event": "worker_started", "rank": 0, "local_rank": 0, "pid": 42}
    with pytest.raises(structlog.DropEvent):
        render(started)
    assert render(started, verbose=True).endswith("worker_started  rank=0 local_rank=0 pid=42")
    warn = render({"event": "workers_killed", "level": "warning", "signal": "SIGKILL", "ranks": [0, 1]})
    assert warn == f"{LOCAL}! workers_killed  signal=SIGKILL ranks=0,1"


def test_quiet_drops_info_for_the_console_only() -> None:
    quiet = LevelFilter(level_number("quiet"))
    with pytest.raises(structlog.DropEvent):
        quiet(None, "info", {"event": "transition", "level": "info"})
    assert quiet(None, "warning", {"event": "x", "level": "warning"})["event"] == "x"
    assert level_number("DEBUG") == level_number("verbose") < level_number("normal") == level_number("nonsense")


@given(st.dictionaries(st.text(max_size=8), st.one_of(st.none(), st.integers(), st.floats(), st.text(),
                                                        st.lists(st.integers(), max_size=3)), max_size=6))
def test_any_event_renders_or_is_dropped_never_raises(fields: dict) -> None:
    for event in ("transition", "failure", "run_started", "backoff", "other"):
        try:
            out = render({**fields, "event": event}, verbose=True)
        except structlog.DropEvent:
            continue
        assert isinstance(out, str)


def test_writer_on_a_closed_pipe_goes_quiet_instead_of_raising() -> None:
    r, w = os.pipe()
    os.close(r)
    stream = io.TextIOWrapper(os.fdopen(w, "wb"), encoding="utf-8")
    writer = ConsoleWriter(stream)
    writer.info("x" * 100_000)  # larger than the pipe buffer: EPIPE for sure
    assert writer.closed
    writer.info("and nothing after")
    stream.close() if not stream.closed else None


def write_job(tmp_path: Path) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "flaky.py").write_text(FLAKY)
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC)
    return spec


def env(tmp_path: Path) -> dict[str, str]:
    return dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"), PYTHONUNBUFFERED="1", NO_COLOR="")


def run_on_a_terminal(tmp_path: Path, *args: str) -> tuple[int, str]:
    """Run the job with stdout and stderr on a real pseudo-terminal; everything it printed."""
    spec = write_job(tmp_path)
    main, sub = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "runner", str(spec), *args], cwd=tmp_path, env=env(tmp_path),
                            stdin=subprocess.DEVNULL, stdout=sub, stderr=sub)
    os.close(sub)
    chunks = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(main, 65536)
            except OSError:  # EIO: the terminal's other side is closed
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main)
    return code, b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


def run_dir(tmp_path: Path) -> Path:
    dirs = [d for d in (tmp_path / "logs" / "calm").iterdir() if not d.is_symlink()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def test_terminal_gets_the_calm_console(tmp_path: Path) -> None:
    code, out = run_on_a_terminal(tmp_path)
    assert code == 0, out
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    lines = plain.splitlines()
    assert lines[0].startswith("runner") and "job calm · node" in lines[0], plain
    assert f"logs {run_dir(tmp_path)}" in lines[1]
    assert any(re.fullmatch(r"\d\d:\d\d:\d\d  RENDEZVOUS → RUNNING +round 0 · 1 node · world 2 · master 127\.0\.0\.1:\d+",
                            ln) for ln in lines), plain
    assert any(ln.endswith("RUNNING → FAILED          rank 1 exited with code 7") for ln in lines), plain
    assert any(ln.strip() == "logs  attempt_0/rank_1" for ln in lines), plain
    assert any("[" in ln and ":1] boom on purpose" in ln for ln in lines), plain  # the tee's [node:rank] prefix
    assert any(ln.endswith("· succeeded") and "→ SHUTDOWN" in ln for ln in lines), plain
    assert not EPOCH_FLOAT.search(plain), plain
    assert not any(ln.lstrip().startswith("{") for ln in lines), plain  # no JSON on a terminal
    assert "\x1b[" in out  # colours on a terminal
    events = [json.loads(ln)["event"] for ln in (run_dir(tmp_path) / "agent.jsonl").read_text().splitlines()]
    assert events.count("worker_started") == 4 and "run_started" in events  # kept, though the console hid them


def test_quiet_and_verbose_change_the_console_not_the_run_log(tmp_path: Path) -> None:
    code, out = run_on_a_terminal(tmp_path / "q", "--quiet")
    assert code == 0, out
    assert "→" not in out and "runner: job 'calm' succeeded" in out, out
    assert '"dst": "SHUTDOWN"' in (run_dir(tmp_path / "q") / "agent.jsonl").read_text()
    code, out = run_on_a_terminal(tmp_path / "v", "--verbose")
    assert code == 0, out
    assert out.count("worker_started") == 4 and "RENDEZVOUS → RUNNING" in re.sub(r"\x1b\[[0-9;]*m", "", out), out


def test_not_a_terminal_keeps_json_lines(tmp_path: Path) -> None:
    spec = write_job(tmp_path)
    res = subprocess.run([sys.executable, "-m", "runner", str(spec)], cwd=tmp_path, env=env(tmp_path),
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    events = [json.loads(ln) for ln in res.stderr.splitlines() if ln.startswith("{")]
    transitions = [e for e in events if e["event"] == "transition"]
    assert [(t["src"], t["dst"]) for t in transitions][:2] == [("INIT", "RENDEZVOUS"), ("RENDEZVOUS", "RUNNING")]
    for t in transitions:
        assert {"src", "dst", "trigger", "reason", "attempt", "time", "job", "node", "level", "timestamp"} <= set(t)
    assert all(e["job"] == "calm" for e in events)


def run_with_console_closed(tmp_path: Path) -> tuple[int, list[dict]]:
    """`runner job.yaml 2>&1 | head -1`: the reader goes away after one line. Exit code and transitions."""
    spec = write_job(tmp_path)
    (tmp_path / "flaky.py").write_text(textwrap.dedent("""\
        import os, sys, time
        time.sleep(1)  # the console is gone by now
        for i in range(200):
            print(f"line {i} " + "x" * 200, flush=True)
        sys.exit(7 if os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" else 0)
        """))
    proc = subprocess.Popen([sys.executable, "-m", "runner", str(spec)], cwd=tmp_path, env=env(tmp_path),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline()
        proc.stdout.close()
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return code, [json.loads(ln) for ln in (run_dir(tmp_path) / "transitions.jsonl").read_text().splitlines()]


def test_a_closed_console_never_stops_the_job(tmp_path: Path) -> None:
    """The agent's events and the workers' output hit a closed pipe; the job still recovers and runs to its end."""
    _, transitions = run_with_console_closed(tmp_path)
    assert [t["dst"] for t in transitions].count("RUNNING") == 2, transitions
    assert transitions[-1]["dst"] == "SHUTDOWN" and transitions[-1]["outcome"] == "succeeded", transitions
    events = [json.loads(ln)["event"] for ln in (run_dir(tmp_path) / "agent.jsonl").read_text().splitlines()]
    assert events.count("worker_exited") >= 3  # agent.jsonl kept what the console could not show


def test_a_closed_console_keeps_the_jobs_exit_code(tmp_path: Path) -> None:
    code, _ = run_with_console_closed(tmp_path)
    assert code == 0
