"""The agent's console: calm lines on a terminal (a real pty), JSON lines where asked (`logs.format: json`), and a
closed console never stops the job (tests/observe/test_console_language.py: the same plain lines off a terminal). Unit tests drive the renderer with events shaped like the agent's; the rest run real jobs."""

from __future__ import annotations

import datetime as dt
import fcntl
import io
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import termios
import textwrap
from pathlib import Path

import pytest
import structlog
from conftest import EXAMPLES, RUNNER
from hypothesis import given
from hypothesis import strategies as st
from terminal import (
    ANSI,
    ERASE,
    env,
    finish,
    frames,
    only_run_dir,
    read_until,
    run_job_on_a_terminal,
    screen,
    start_on_a_terminal,
)

from runner.observe.console import ConsoleRenderer, ConsoleWriter, LevelFilter, countdown, level_number, wait_text
from runner.observe.live_line import LiveLine
from runner.observe.progress import step_intervals
from runner.testing.etcd_server import etcd_server

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


def test_a_job_transition_of_replica_groups_is_one_line_labelled_as_the_jobs() -> None:
    """The job machine above replica groups (runner/core/job_machine.py): shown at the normal level, as the job's."""
    line = render({"event": "job_transition", "src": "TRAINING", "dst": "DEGRADED", "trigger": "group_down",
                   "reason": "group 1 FAILED", "time": 1767323045.1, "job": "j", "node": "n"})
    assert line == f"{LOCAL}  TRAINING → DEGRADED       job · group 1 FAILED"


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


def test_header_of_replica_groups_names_the_groups() -> None:
    """`1 worker(s) per node · nodes 1` hid the 2 groups of a TorchFT job: the header says them."""
    head = render({"event": "run_started", "run_dir": "/r/d", "replica_groups": 2, "group_workers": 1,
                   "min_active": 1, "nodes": "1", "backend": "local", "job": "ft", "node": "n1"},
                  renderer=ConsoleRenderer(colors=False))
    assert "job ft · node n1 · 2 replica groups of 1 worker(s) (at least 1 stepping) · nodes 1" in head
    assert "per node" not in head


def test_run_started_of_a_spec_with_replica_groups_carries_them() -> None:
    from runner.config import load_spec
    from runner.runs.index import announce

    seen: list[dict[str, object]] = []

    class Log:
        def info(self, event: str, **kw: object) -> None:
            seen.append({"event": event, **kw})

    spec = load_spec(str(EXAMPLES / "ft_train.yaml"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("runner.runs.index.record_start", lambda *a: None)
        announce(spec, "n1", Path("/r/d"), Log())  # type: ignore[arg-type]
    assert seen[0]["replica_groups"] == spec.replica_groups.count and "nproc_per_node" not in seen[0]
    head = render(seen[0] | {"job": "ft", "node": "n1"}, renderer=ConsoleRenderer(colors=False))
    assert f"{spec.replica_groups.count} replica groups of" in head


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
    assert warn == f"{LOCAL}! rank(s) 0, 1 still ran after the stop: killed with SIGKILL"  # words (phrases.py)


def test_quiet_drops_info_for_the_console_only() -> None:
    quiet = LevelFilter(level_number("quiet"))
    with pytest.raises(structlog.DropEvent):
        quiet(None, "info", {"event": "transition", "level": "info"})
    assert quiet(None, "warning", {"event": "x", "level": "warning"})["event"] == "x"
    assert level_number("DEBUG") == level_number("verbose") < level_number("normal") == level_number("nonsense")


@given(st.dictionaries(st.text(max_size=8), st.one_of(st.none(), st.integers(), st.floats(), st.text(),
                                                        st.lists(st.integers(), max_size=3)), max_size=6))
def test_any_event_renders_or_is_dropped_never_raises(fields: dict) -> None:
    for event in ("transition", "failure", "run_started", "backoff", "waiting", "other"):
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


def run_on_a_terminal(tmp_path: Path, *args: str) -> tuple[int, str]:
    """Run the job with stdout and stderr on a real pseudo-terminal; everything it printed."""
    spec = write_job(tmp_path)
    main, sub = pty.openpty()
    proc = subprocess.Popen([*RUNNER, str(spec), *args], cwd=tmp_path, env=env(tmp_path),
                            stdin=subprocess.DEVNULL, stdout=sub, stderr=sub)
    os.close(sub)
    return finish(main, proc, [])


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


def test_logs_format_json_gives_json_lines_off_a_terminal(tmp_path: Path) -> None:
    spec = write_job(tmp_path)
    spec.write_text(spec.read_text().replace("logs: {dir: logs}", "logs: {dir: logs, format: json}"))
    res = subprocess.run([*RUNNER, str(spec)], cwd=tmp_path, env=env(tmp_path),
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
    proc = subprocess.Popen([*RUNNER, str(spec)], cwd=tmp_path, env=env(tmp_path),
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


# --- long waits show progress; a peer's crash does not bury the root cause (issue 13) ---

def test_wait_lines_say_what_is_awaited_and_how_long_is_left() -> None:
    assert wait_text({"wait": "backoff", "restart": 2, "left_s": 6.2}) == "⋯ restart 2 in 7 s"
    assert wait_text({"wait": "grace", "ranks": [1, 3], "signal": "SIGTERM", "left_s": 125}) == (
        "⋯ stopping workers: ranks 1, 3 still alive · SIGKILL in 2:05")
    assert wait_text({"wait": "grace", "ranks": [0], "left_s": 0}) == (
        "⋯ stopping workers: rank 0 still alive · SIGKILL in 0 s")
    leader = {"wait": "rendezvous", "round": 3, "role": "leader", "joined": ["a", "b"], "joined_count": 2,
              "min": 3, "max": 5, "waiting_for": ["c"], "left_s": 3725.0}
    assert wait_text(leader) == ("⋯ rendezvous round 3 · joined 2 of 3..5 (a, b) · 1 more needed · waiting for c"
                                 " · timeout in 1:02:05")
    closing = {**leader, "joined": ["a", "b", "c"], "joined_count": 3, "waiting_for": [], "last_call_s": 29.5}
    assert wait_text(closing) == "⋯ rendezvous round 3 · joined 3 of 3..5 (a, b, c) · closes in 30 s (last call)"
    follower = {"wait": "rendezvous", "round": 0, "role": "follower", "leader": "a", "min": 2, "max": 2,
                "left_s": 59}
    assert wait_text(follower) == "⋯ rendezvous round 0 · led by a · nodes 2 · timeout in 59 s"
    many = {**leader, "joined": [f"n{i}" for i in range(16)], "joined_count": 40}
    assert "joined 40 of 3..5 (n0, n1, n2, n3, n4, n5, +10)" in wait_text(many)


@given(st.dictionaries(st.sampled_from(["wait", "left_s", "last_call_s", "ranks", "joined", "joined_count", "min",
                                        "max", "role", "leader", "restart", "waiting_for", "round"]),
                       st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5),
                                 st.sampled_from(["backoff", "grace", "rendezvous", "follower"]),
                                 st.lists(st.one_of(st.integers(), st.text(max_size=3)), max_size=9))))
def test_any_waiting_fields_make_one_line(fields: dict) -> None:
    text = wait_text(fields)
    assert text.startswith("⋯ ") and "\n" not in text


def test_countdown_is_whole_seconds_rounded_up() -> None:
    assert [countdown(v) for v in (0, 0.1, 59.5, 60, 3599, 3600, 7384.2)] == [
        "0 s", "1 s", "1:00", "1:00", "59:59", "1:00:00", "2:03:05"]
    assert [countdown(v) for v in (-1, float("nan"), float("inf"), True, "5", None)] == [""] * 6


def test_waiting_events_come_at_most_once_per_step_and_the_step_grows_to_a_minute() -> None:
    steps = step_intervals()
    first = [next(steps) for _ in range(8)]
    assert first == [5, 10, 20, 40, 60, 60, 60, 60]
    assert sum(first[:4]) + 60 * 60 > 3600  # an hour of waiting: about 60 events, not 720


def test_a_waiting_event_is_a_line_where_there_is_no_live_line() -> None:
    line = render({"event": "waiting", "wait": "backoff", "restart": 2, "left_s": 4})
    assert line == f"{LOCAL}  ⋯ restart 2 in 4 s"


def drain(fd: int) -> str:
    """Everything the pty has to read now (its writer is done: the reads stop once nothing more comes)."""
    data = b""
    while select.select([fd], [], [], 0.5)[0]:
        data += os.read(fd, 4096)
    return data.decode()


def test_live_line_on_a_terminal_is_erased_around_other_output() -> None:
    main, sub = pty.openpty()
    live = LiveLine()
    try:
        live.attach(sub, wait_text, colors=False, waits=True)
        live.update({"wait": "backoff", "restart": 2, "left_s": 3})
        live.update({"wait": "backoff", "restart": 2, "left_s": 3})  # same text: not written again
        with live.writing():
            os.write(sub, b"worker says hi\n")
        live.clear()
        live.clear()
        out = drain(main)
    finally:
        live.detach()
        os.close(sub)
        os.close(main)
    line = "⋯ restart 2 in 3 s"
    assert out == f"{ERASE}{line}{ERASE}worker says hi\r\n{ERASE}{line}{ERASE}", repr(out)
    assert not live.on


def test_live_line_never_wraps_on_a_narrow_terminal() -> None:
    main, sub = pty.openpty()
    fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 12, 0, 0))
    live = LiveLine()
    try:
        live.attach(sub, wait_text, colors=True, waits=True)
        live.update({"wait": "grace", "ranks": [0, 1, 2], "left_s": 30})
        out = drain(main)
    finally:
        live.detach()
        os.close(sub)
        os.close(main)
    assert out == f"{ERASE}\x1b[2m⋯ stopping…\x1b[0m", repr(out)  # 11 columns of 12: dimmed, cut, no wrap


BACKOFF_SPEC = """\
version: 1
name: backoff
entrypoint: {script: work.py}
nproc_per_node: 1
restart: {max_restarts: 2, backoff: {initial: 2s, jitter: 0}}
logs: {dir: logs}
"""
ALWAYS_FAILS = """\
import sys
print("failing on purpose", file=sys.stderr, flush=True)
sys.exit(3)
"""


def test_the_restart_backoff_counts_down_in_place(tmp_path: Path) -> None:
    code, raw = run_job_on_a_terminal(tmp_path, BACKOFF_SPEC, ALWAYS_FAILS)
    assert code != 0, raw
    drawn = frames(raw)
    assert any(re.fullmatch(r"⋯ restart 2 in [12] s", f) for f in drawn), drawn  # restart 1 is immediate
    assert not any("restart 1 in" in f for f in drawn), drawn
    shown = screen(raw)
    assert not any(ln.startswith("⋯") for ln in shown), shown  # erased when the wait ended
    assert any("RESTARTING → RENDEZVOUS" in ln and "attempt 2" in ln for ln in shown), shown
    events = [json.loads(ln) for ln in (only_run_dir(tmp_path, "backoff") / "agent.jsonl").read_text().splitlines()]
    assert not [e for e in events if e["event"] == "waiting"]  # a wait under 5 s adds nothing to the logs


COLLATERAL_SPEC = """\
version: 1
name: collateral
entrypoint: {script: work.py}
nproc_per_node: 2
restart: {max_restarts: 0}
shutdown: {grace_period: 3s}
logs: {dir: logs}
"""
# Rank 1 says it is ready; once the runner has read that (it is in rank 1's log), rank 0 crashes: the root cause.
# Rank 1 answers the runner's SIGTERM with a traceback, as a rank does when its peer's crash breaks a collective,
# and stays alive through the grace period.
ROOT_AND_COLLATERAL = """\
import os, signal, sys, time, traceback
rank = int(os.environ["RANK"])
ready = os.path.join(os.path.dirname(os.environ["TORCHELASTIC_ERROR_FILE"]), "..", "rank_1", "stdout.log")
if rank == 1:
    def collateral(signum, frame):
        try:
            raise ConnectionResetError("collateral on purpose: peer rank 0 went away")
        except ConnectionResetError:
            traceback.print_exc()
        sys.stderr.flush()
    signal.signal(signal.SIGTERM, collateral)
    print("rank 1 ready", flush=True)
    while True:
        time.sleep(0.1)
while not (os.path.exists(ready) and open(ready).read()):
    time.sleep(0.05)
raise RuntimeError("root cause on purpose")
"""


def test_a_peers_collateral_traceback_is_folded_and_the_root_cause_stays(tmp_path: Path) -> None:
    code, raw = run_job_on_a_terminal(tmp_path, COLLATERAL_SPEC, ROOT_AND_COLLATERAL)
    assert code == 1, raw
    shown = screen(raw)
    node = next(m.group(1) for ln in shown if (m := re.match(r"\[(.+):0\] ", ln)))
    logs = only_run_dir(tmp_path, "collateral") / "attempt_0"
    root_log = (logs / "rank_0" / "stderr.log").read_text()
    collateral_log = (logs / "rank_1" / "stderr.log").read_text()
    assert "RuntimeError: root cause on purpose" in root_log and "Traceback" in root_log
    assert "ConnectionResetError: collateral on purpose" in collateral_log and "Traceback" in collateral_log
    # The root cause, whole and undimmed; rank 1's output before the crash as ever; its collateral folded.
    root_lines = [ln for ln in raw.split("\n") if ln.startswith(f"[{node}:0] ")]
    assert [ANSI.sub("", ln) for ln in root_lines] == [f"[{node}:0] {ln}" for ln in root_log.splitlines()]
    assert not any("\x1b[2m" in ln for ln in root_lines), root_lines
    assert f"[{node}:1] rank 1 ready" in shown, shown
    assert not any("collateral on purpose" in ln for ln in shown), shown
    count = len(collateral_log.splitlines())
    note = f"[{node}:1] {count} line(s) of collateral output (after rank 0 failed), in attempt_0/rank_1/stderr.log"
    assert note in shown, shown
    # The grace period named the rank still alive and counted down to SIGKILL.
    drawn = frames(raw)
    assert any(re.fullmatch(r"⋯ stopping workers: rank 1 still alive · SIGKILL in [123] s", f) for f in drawn), drawn
    assert (logs / "rank_1" / "stdout.log").read_text() == "rank 1 ready\n"


ETCD_SPEC = """\
version: 1
name: waits
entrypoint: {{script: work.py}}
nodes: 2:3
nproc_per_node: 1
rendezvous:
  backend: etcd
  endpoints: ["{endpoint}"]
  master_addr: 127.0.0.1
  join_timeout: 90s
  last_call: 1s
logs: {{dir: logs}}
"""


def test_a_rendezvous_missing_nodes_names_who_joined_and_counts_down(tmp_path: Path) -> None:
    """nodes.min 2, one node started: the live line names it, says one more is needed and counts down to the join
    timeout; agent.jsonl gets one `waiting` event after 5 s, not one per redraw."""
    with etcd_server(tmp_path / "etcd") as etcd:
        proc, main = start_on_a_terminal(tmp_path / "job", ETCD_SPEC.format(endpoint=etcd.endpoint), "print('hi')\n",
                                         "--node", "alpha")
        chunks: list[bytes] = []
        try:
            wanted = re.compile(r"⋯ rendezvous round 0 · joined 1 of 2\.\.3 \(alpha\) · 1 more needed · timeout in "
                                r"(1:[0-3]\d|[0-5]?\d s)")
            assert read_until(main, proc, chunks, lambda raw: any(wanted.fullmatch(f) for f in frames(raw)))
            run = only_run_dir(tmp_path / "job", "waits")

            def stepped(_raw: str) -> bool:
                return '"waiting"' in (run / "agent.jsonl").read_text()

            assert read_until(main, proc, chunks, stepped)
            proc.send_signal(signal.SIGTERM)
        finally:
            code, raw = finish(main, proc, chunks)
    assert code == 128 + signal.SIGTERM, raw
    events = [json.loads(ln) for ln in (run / "agent.jsonl").read_text().splitlines()]
    waits = [e for e in events if e["event"] == "waiting"]
    assert len(waits) == 1, waits  # the next step is 10 s later
    assert waits[0]["wait"] == "rendezvous" and waits[0]["joined"] == ["alpha"] and waits[0]["joined_count"] == 1
    assert (waits[0]["min"], waits[0]["max"], waits[0]["role"]) == (2, 3, "leader")
    assert 0 < waits[0]["left_s"] < 90 and waits[0]["waited_s"] >= 5
    shown = screen(raw)
    assert not any(ln.startswith("⋯") for ln in shown), shown  # erased when the wait ended
    assert not any(ln.lstrip().startswith("{") for ln in shown), shown


def test_a_follower_names_the_leader_and_the_leader_counts_both(tmp_path: Path) -> None:
    """nodes.min 3, two nodes started: the first leads and names both; the second follows and names its leader."""
    spec = ETCD_SPEC.replace("nodes: 2:3", "nodes: 3")
    with etcd_server(tmp_path / "etcd") as etcd:
        text = spec.format(endpoint=etcd.endpoint)
        lead, lead_pty = start_on_a_terminal(tmp_path / "a", text, "print('hi')\n", "--node", "alpha")
        lead_out: list[bytes] = []
        follow_out: list[bytes] = []
        follow, follow_pty = None, None
        try:
            assert read_until(lead_pty, lead, lead_out, lambda raw: "(alpha) · 2 more needed" in raw)
            follow, follow_pty = start_on_a_terminal(tmp_path / "b", text, "print('hi')\n", "--node", "beta")
            led = re.compile(r"⋯ rendezvous round 0 · led by alpha · nodes 3 · timeout in (1:[0-3]\d|[0-5]?\d s)")
            assert read_until(follow_pty, follow, follow_out, lambda raw: any(led.fullmatch(f) for f in frames(raw)))
            both = re.compile(r"⋯ rendezvous round 0 · joined 2 of 3 \(alpha, beta\) · 1 more needed · timeout in .+")
            assert read_until(lead_pty, lead, lead_out, lambda raw: any(both.fullmatch(f) for f in frames(raw)))
        finally:
            for proc in (follow, lead):
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            codes: list[int] = []
            try:
                if follow is not None and follow_pty is not None:
                    codes.append(finish(follow_pty, follow, follow_out)[0])
            finally:
                codes.append(finish(lead_pty, lead, lead_out)[0])  # reaped even if the follower's end failed
    assert codes == [128 + signal.SIGTERM] * 2
