"""One console language (issue 40, point 5): the plain lines of a terminal whether or not stderr is one, JSON only
where asked (`logs.format: json`) and always in agent.jsonl; no literal escape sequence; no line that only restates
a one-node job's shape; the summary's attempts in words; `runner status` never says `None`; ETTR spelt out.

The console tests run real jobs with stderr piped (as `runner job.yaml 2>&1 | tee log` does); the rest drive the
formatting functions with values shaped like the agent's.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import structlog
from conftest import EXAMPLES, RUNNER

from runner.agent.result import attempts_words
from runner.cli.status import print_status
from runner.config.spec import Entrypoint, JobSpec
from runner.core.context import GroupRun
from runner.diagnosis.failure import Failure
from runner.errors import RendezvousError
from runner.observe.console import ConsoleRenderer, printable
from runner.outcomes import FailureKind
from runner.rendezvous.etcd.host_rule import wait_for_host
from runner.runs.status import ETTR_MEANING, table
from runner.states.restarting import count_uncharged
from runner.testing.etcd_server import free_port

STAMP = "2026-01-02T03:04:05.000001Z"
ESCAPE = re.compile(r"\\[ntrx]|\\u[0-9a-f]{4}|\x1b\[")  # a literal `\n`, `\x1b`..., or a colour code


def piped(tmp_path: Path, spec: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`runner SPEC` with stderr a pipe (not a terminal), from `tmp_path`."""
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("RUNNER_LOG_LEVEL", "NO_COLOR")}
    env.update(XDG_STATE_HOME=str(tmp_path / "state"), PYTHONUNBUFFERED="1")
    return subprocess.run([*RUNNER, str(spec), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180, check=False)


def agent_events(tmp_path: Path) -> list[dict[str, Any]]:
    """Every event of the (only) run's agent.jsonl under tmp_path."""
    (path,) = tmp_path.glob("**/agent.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.integration
def test_a_piped_console_speaks_the_terminals_plain_lines(tmp_path: Path) -> None:
    """examples/jobs/restart.yaml (rank 1 fails once, attempt 1 succeeds) with stderr piped: plain lines, as on a
    terminal without colour; the summary counts in words; agent.jsonl keeps the JSON."""
    res = piped(tmp_path, EXAMPLES / "restart.yaml")
    assert res.returncode == 0, res.stderr[-3000:]
    own = [ln for ln in res.stderr.splitlines() if not ln.startswith("[")]  # not the workers' tee
    assert not [ln for ln in own if ln.lstrip().startswith("{")], res.stderr  # no JSON line
    assert own[0].startswith("runner    job restart · node ") and "2 worker(s) per node" in own[0], own
    assert any(re.fullmatch(r"\d\d:\d\d:\d\d  RENDEZVOUS → RUNNING +round 0 · 1 node · world 2 · master \S+", ln)
               for ln in own), own
    assert any(re.fullmatch(r"\d\d:\d\d:\d\d  FAILED → RESTARTING +restart 1 of 2", ln) for ln in own), own
    assert not [ln for ln in own if ESCAPE.search(ln)], own  # no colour off a terminal, no literal escape
    assert "runner: job 'restart' succeeded after 2 attempts (1 restart); exit code 0" in own, own
    events = agent_events(tmp_path)
    assert [e["dst"] for e in events if e["event"] == "transition"][-1] == "SHUTDOWN"
    assert sum(e["event"] == "worker_started" for e in events) == 4  # kept, though the console hid them


@pytest.mark.integration
def test_logs_format_json_keeps_json_lines_on_the_console(tmp_path: Path) -> None:
    """Asked for: `logs.format: json` gives JSON lines on the console, one object per event, terminal or not."""
    (tmp_path / "hello.py").write_text("print('hello', flush=True)\n")
    spec = tmp_path / "job.yaml"
    spec.write_text(textwrap.dedent("""\
        version: 1
        name: asked
        entrypoint: {script: hello.py}
        nproc_per_node: 1
        logs: {dir: logs, format: json}
        """))
    res = piped(tmp_path, spec)
    assert res.returncode == 0, res.stderr[-3000:]
    events = [json.loads(ln) for ln in res.stderr.splitlines() if ln.startswith("{")]
    assert [(e["src"], e["dst"]) for e in events if e["event"] == "transition"][:2] == [
        ("INIT", "RENDEZVOUS"), ("RENDEZVOUS", "RUNNING")]
    assert all(e["job"] == "asked" for e in events)


# --- no literal escape sequences ---

PY_SPY = "Error: No such process (os error 3)\n\nCaused by:\n    0: ptrace attach\n\tfailed"


def test_a_multi_line_value_reads_as_one_line_of_words() -> None:
    assert printable(PY_SPY) == "Error: No such process (os error 3) / Caused by: / 0: ptrace attach / failed"
    assert printable("one line") == "one line"
    assert printable("a\x1b[31mb\x00") == "a\\x1b[31mb\\x00"  # a control sequence is still never sent raw


def test_stacks_unavailable_shows_py_spys_error_without_a_literal_newline() -> None:
    line = ConsoleRenderer(colors=False)(None, "warning", {
        "event": "stacks_unavailable", "level": "warning", "timestamp": STAMP, "pid": 42, "reason": PY_SPY,
        "py_spy_exit": 1})
    assert "\n" not in line and "\\n" not in line, line
    assert line.endswith("could not take the stacks of pid 42 with py-spy: Error: No such process (os error 3) / "
                         "Caused by: / 0: ptrace attach / failed"), line


def test_a_multi_line_failure_or_transition_stays_on_its_lines() -> None:
    render = ConsoleRenderer(colors=False)
    fail = render(None, "error", {"event": "failure", "level": "error", "timestamp": STAMP,
                                  "error": "RuntimeError: a\nb", "hint": "x\ny"})
    assert fail.splitlines() == [" " * 10 + "error RuntimeError: a / b", " " * 10 + "hint  x / y"]
    moved = render(None, "info", {"event": "transition", "level": "info", "timestamp": STAMP, "src": "RUNNING",
                                  "dst": "FAILED", "reason": "rank 1 died:\nboom"})
    assert moved.endswith("rank 1 died: / boom") and "\n" not in moved


# --- no line that only restates another ---

def test_the_rendezvous_records_and_a_bare_failure_are_not_echoed_beside_their_transition() -> None:
    """Seen on a two-node job: `rendezvous_joined  round=0 attempt=0`, `rendezvous_event  kind=PeerLost detail=b
    round=0`, `restart_charged  round=2 count=None max_restarts=2` and `rendezvous_closed  outcome=failed` (event
    names and key=value, a literal None) beside the transition lines that say the same in words, and
    `failed node b lost: ...` under `RUNNING → FAILED  node b lost: ...`. They stay in agent.jsonl and --verbose."""
    render = ConsoleRenderer(colors=False)
    for event, fields in (("rendezvous_joined", {"round": 0, "attempt": 0}),
                          ("rendezvous_event", {"kind": "PeerLost", "detail": "b", "round": 0}),
                          ("restart_charged", {"round": 2, "count": None, "max_restarts": 2}),
                          ("rendezvous_closed", {"outcome": "failed"})):
        with pytest.raises(structlog.DropEvent):
            render(None, "info", {"event": event, "level": "info", "timestamp": STAMP, **fields})
        shown = ConsoleRenderer(colors=False, verbose=True)(
            None, "info", {"event": event, "level": "info", "timestamp": STAMP, **fields})
        assert event in shown
    lost = "node b lost: lease expired or node left"
    moved = render(None, "info", {"event": "transition", "level": "info", "timestamp": STAMP, "src": "RUNNING",
                                  "dst": "FAILED", "reason": lost})
    assert moved.endswith(lost)
    with pytest.raises(structlog.DropEvent):
        render(None, "error", {"event": "failure", "level": "error", "timestamp": STAMP, "reason": lost})
    other = render(None, "error", {"event": "failure", "level": "error", "timestamp": STAMP,
                                   "reason": "hang: rank 3 (node b) never entered all_reduce #57"})
    assert other == " " * 10 + "failed hang: rank 3 (node b) never entered all_reduce #57"  # says more: shown


def test_a_node_waiting_for_the_hosting_nodes_etcd_says_so() -> None:
    """Seen on three hosts: nodes b and c started before a (which hosts the rendezvous) printed their header and
    then nothing for 54 s, not even INIT → RENDEZVOUS: the wait was an info event kept off the console. It is one
    line, in words, naming the endpoint, the bound and why."""
    said: list[dict[str, Any]] = []

    class Recorder:
        def info(self, event: str, **fields: Any) -> None:
            said.append({"event": event, "level": "info", "timestamp": STAMP, **fields})

    with pytest.raises(RendezvousError):
        asyncio.run(wait_for_host("127.0.0.1", free_port(), 0.5, Recorder()))  # type: ignore[arg-type]
    (waited,) = said
    line = ConsoleRenderer(colors=False)(None, "info", waited)
    assert re.fullmatch(r"\d\d:\d\d:\d\d  waiting for the hosting node's etcd at 127\.0\.0\.1:\d+ \(at most 0\.5 s, "
                        r"rendezvous\.join_timeout; the node whose machine has 127\.0\.0\.1 starts it\): .+", line), line


# --- the summary counts attempts in words ---

def test_attempts_in_words() -> None:
    assert attempts_words(1, 0, {}) == "1 attempt"
    assert attempts_words(2, 1, {}) == "2 attempts (1 restart)"
    assert attempts_words(3, 2, {}) == "3 attempts (2 restarts)"
    assert attempts_words(2, 0, {"node_lost": 1}) == (
        "2 attempts (1 re-rendezvous after a lost node, uncharged; 0 restarts)")
    assert attempts_words(4, 1, {"membership": 1, "preempted": 1}) == (
        "4 attempts (1 re-rendezvous for a joining node, uncharged; 1 re-rendezvous after a preempted node, "
        "uncharged; 1 restart)")
    assert attempts_words(3, 0, {"exception": 2}) == (
        "3 attempts (2 restarts after failures of class exception, uncharged; 0 restarts)")


def test_each_attempt_not_charged_is_counted_by_its_cause() -> None:
    """RESTARTING counts a lost node's re-rendezvous (node_lost: uncharged by default) and a joining node's round;
    a charged restart (an exception) is the budget's count, not this one."""
    ctx = SimpleNamespace(spec=JobSpec(name="j", entrypoint=Entrypoint(script="t.py")), run=GroupRun())
    count_uncharged(ctx, Failure(FailureKind.PEER, "node b lost", attempt=0))  # type: ignore[arg-type]
    count_uncharged(ctx, None)  # type: ignore[arg-type]
    count_uncharged(ctx, Failure(FailureKind.WORKER, "rank 1 exited with code 1", 1, exit_code=1))  # type: ignore[arg-type]
    assert ctx.run.uncharged == {"node_lost": 1, "membership": 1}


# --- runner status: never `None`; ETTR spelt out ---

DIED = {"job": "ft", "status": "running", "backend": "etcd", "round": 2, "restarts": 0, "nodes": [
    {"node": "a", "state": "RUNNING", "attempt": 1, "outcome": None, "workers": [{"rank": 0, "pid": 7}],
     "ledger": {"basis": "steps", "ettr": 0.93, "lost_s": 3.1}},
    {"node": "b", "state": "SHUTDOWN", "outcome": "died", "attempt": None, "round": None, "workers": None,
     "ledger": None},
]}


def test_status_of_a_node_its_guard_marked_dead_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    print_status(DIED)
    out = capsys.readouterr().out
    assert "None" not in out, out
    assert "  node b: SHUTDOWN (died: its agent ended without a word; its guard marked it)" in out.splitlines(), out
    assert "  node a: RUNNING attempt 1  [rank 0 pid 7]  ETTR 0.93 (lost 3.1s)" in out.splitlines(), out
    assert f"  {ETTR_MEANING}" in out.splitlines() and "effective training time ratio" in ETTR_MEANING


def test_the_status_table_never_says_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))  # an empty runs index
    lines = table(DIED, now=1.0e9)
    assert not [ln for ln in lines if "None" in ln], lines
    (row,) = [ln for ln in lines if ln.startswith("b ")]
    assert row.split()[:3] == ["b", "SHUTDOWN", "-"], row
    assert ETTR_MEANING in lines
