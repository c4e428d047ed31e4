"""Every warning and error reaches the console as a sentence, never as `event_name  key=value` (issue 40, point 5).

runner/observe/phrases.py is the table of the console's words. These tests keep it whole against the code:

- every warning and error the code emits under a literal name (`log.warning("name", ...)`, `.error`, `.exception`,
  WarnOnce's `warn`, and the helpers that log a kind they are given: `warn_once`, `close_fd`, `OutputPump`,
  `RestartPolicy`, `HeartbeatMonitor(event=...)`) has a `message=` at its call or an entry in the table, and so does
  every info event shown at the normal level (console.NOTABLE); a call whose name is not a literal is one of the
  known forwarders of such names;
- every entry is emitted somewhere;
- each entry, rendered by the console with its call sites' fields (values of the right rough type), with none of
  them, and with arbitrary values (Hypothesis: control characters, huge texts, None, numbers, nested lists), gives
  one line of words (and a hint line): no `key=value` of its fields, not its own name, nothing unprintable, no
  escape sequence, and it never raises.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.observe.console import NOTABLE, ConsoleRenderer
from runner.observe.phrases import PHRASES
from runner.watchdog.heartbeat import HeartbeatMonitor

RUNNER = Path(__file__).resolve().parents[2] / "runner"
STAMP = "2026-01-02T03:04:05.000001Z"
EVENT_NAME = re.compile(r"[a-z][a-z0-9_]*")
LOG_METHODS = {"warning": "warning", "error": "error", "exception": "error", "critical": "error", "warn": "warning"}
FILE_FIELDS = ("path", "error")  # what soft_io.warn_once logs beside the kind
# Helpers that log a kind given to them: where the kind is (argument index, keyword), the fields they log with it.
EMITTERS: dict[str, tuple[int | None, str, tuple[str, ...]]] = {
    "warn_once": (0, "kind", FILE_FIELDS),
    "close_fd": (1, "kind", FILE_FIELDS),
    "OutputPump": (1, "warning", FILE_FIELDS),
    "RestartPolicy": (0, "restarting", ("exit", "restart", "after_s")),  # runner/system/supervised.py
    "HeartbeatMonitor": (None, "event", ("local_rank", "silent_s")),
}
# The calls whose event name is a variable: each forwards a name given by one of the emitters above.
FORWARDERS = {
    ("system/soft_io.py", "kind"),  # WarnOnce.warn, warn_once, close_fd
    ("system/supervised.py", "policy.restarting"),  # RestartPolicy
    ("watchdog/heartbeat.py", "self._event"),  # HeartbeatMonitor
    ("system/output_pump.py", "self.warning"),  # OutputPump
}
OWN_LINES = {"run_started", "transition", "job_transition", "failure", "waiting", "backoff"}  # console's own renderers
ESCAPE = re.compile(r"\\[ntrx]|\\u[0-9a-f]{4}|\x1b")  # a literal `\n`, `\x1b`..., or a raw escape


@dataclass(frozen=True)
class Site:
    """One call that emits an event: where, at which level, with which field names, and whether it says `message`."""

    where: str
    level: str
    fields: frozenset[str]
    message: bool


def scan() -> tuple[dict[str, list[Site]], list[str]]:
    """Every event the code emits by a literal name (info ones only when NOTABLE), and the calls with a name that is
    not a literal and not a known forwarder."""
    sites: dict[str, list[Site]] = defaultdict(list)
    unknown: list[str] = []
    heartbeat_default = inspect.signature(HeartbeatMonitor).parameters["event"].default
    sites[heartbeat_default].append(Site("runner/watchdog/heartbeat.py (default)", "warning",
                                         frozenset(EMITTERS["HeartbeatMonitor"][2]), message=False))
    for path in sorted(RUNNER.rglob("*.py")):
        rel = path.relative_to(RUNNER).as_posix()
        tree = ast.parse(path.read_text())
        constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                     and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                     for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            callee = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            keywords = frozenset(k.arg for k in node.keywords if k.arg)
            if callee in LOG_METHODS or (callee == "info" and node.args):
                kind, level, fields = (node.args[0] if node.args else None), LOG_METHODS.get(callee, "info"), keywords
            elif callee in EMITTERS:
                index, keyword, implied = EMITTERS[callee]
                given_kw = next((k.value for k in node.keywords if k.arg == keyword), None)
                kind = given_kw or (node.args[index] if index is not None and len(node.args) > index else None)
                level, fields = "warning", frozenset(implied) | (keywords if callee == "warn_once" else frozenset())
            else:
                continue
            if kind is None:
                continue
            name = kind.value if isinstance(kind, ast.Constant) else (
                constants.get(kind.id) if isinstance(kind, ast.Name) else None)
            if not isinstance(name, str):
                if level != "info" and (rel, ast.unparse(kind)) not in FORWARDERS:
                    unknown.append(f"runner/{rel}:{node.lineno}: {ast.unparse(node)[:100]}")
                continue
            if not EVENT_NAME.fullmatch(name) or (level == "info" and name not in NOTABLE - OWN_LINES):
                continue
            sites[name].append(Site(f"runner/{rel}:{node.lineno}", level, fields, "message" in keywords))
    return dict(sites), unknown


SITES, UNKNOWN = scan()
PHRASED = sorted(name for name, sites in SITES.items() if any(not s.message for s in sites) and name not in OWN_LINES)


def test_the_scan_finds_the_code_s_warnings() -> None:
    """The scan itself sees what it should (a scan that finds nothing would pass everything below)."""
    assert {"etcd_call_retry", "workers_killed", "worker_log_write_failed", "lighthouse_restarting",
            "heartbeat_silent", "progress_stalled", "logs_dir_unwritable", "stall_check_failed",
            "graceful_stop", "heartbeat_never_sent"} <= set(SITES)
    assert len(PHRASED) > 80


def test_every_warning_and_error_has_words() -> None:
    """A `message=` at the call, or an entry in runner/observe/phrases.py: never `name  key=value` on the console."""
    bare = [f"{s.where}: {name}" for name, sites in SITES.items() for s in sites
            if not s.message and name not in PHRASES and name not in OWN_LINES]
    assert not bare, "events with neither a message= nor an entry in runner/observe/phrases.py:\n" + "\n".join(bare)


def test_every_name_that_is_not_a_literal_is_forwarded_by_a_known_helper() -> None:
    """A new wrapper that logs a name it is given must be taught to the scan (EMITTERS), so its names are checked."""
    assert not UNKNOWN, "\n".join(UNKNOWN)


def test_every_phrase_is_emitted_by_the_code() -> None:
    unused = sorted(set(PHRASES) - set(SITES))
    assert not unused, f"entries of runner/observe/phrases.py that no code emits: {unused}"


INTS = re.compile(r"(^|_)(rank|local_rank|pid|round|current|restart|restarts|count|total|tries|workers|attempt|keys|"
                  r"exit_code|py_spy_exit|suppressed|signum|port|revision|oldest|resume_from|joined_at|seen_up_to)$")
LISTS = re.compile(r"^(ranks|nodes|peers|pids|reached|culprits|answered|ready|hosts|processes|reasons|checked|"
                   r"unkillable)$")


def sample(field: str) -> object:
    """A value of the field's rough type, as the code gives it."""
    if field.endswith("_s"):
        return 2.5
    if INTS.search(field):
        return 3
    if LISTS.match(field):
        return ["a", "b"]
    if field in ("kinds", "unread"):
        return {"bad_json": 2}
    if field == "stacks_captured":
        return True
    return "something went wrong"


def render(name: str, fields: dict[str, object]) -> str:
    """The console's line(s) for the event, at the level its code emits it."""
    level = SITES[name][0].level
    return ConsoleRenderer(colors=False)(None, level, {"event": name, "level": level, "timestamp": STAMP, **fields})


def words_only(name: str, fields: dict[str, object], text: str) -> None:
    """One line of words (and a hint line), none of `field=`, not the event's own name, nothing unprintable."""
    lines = text.split("\n")
    assert 1 <= len(lines) <= 2, text
    if len(lines) == 2:
        assert lines[1].startswith(" " * 10 + "hint  "), text
    assert all(line.isprintable() for line in lines), text
    assert not ESCAPE.search(text), text
    keyed = [k for k in [*fields, "event", "level"] if re.search(rf"(^|\W){re.escape(k)}=", text)]
    assert not keyed, f"key=value of {keyed}: {text}"
    if "_" in name:  # a one-word name (stall, fenced) is a plain word
        assert name not in text, text
    assert "None" not in text, text


@pytest.mark.parametrize("name", PHRASED)
def test_each_event_reads_as_words_with_its_fields_and_without(name: str) -> None:
    fields = {f: sample(f) for s in SITES[name] for f in s.fields if f not in ("message", "hint")}
    full = render(name, fields)
    words_only(name, fields, full)
    assert "?" not in full.split("\n")[0] or "?" in str(fields), full  # every slot filled when the fields are there
    bare = render(name, {})
    words_only(name, {}, bare)
    assert "?" not in bare, bare  # the last template needs no field: a `?` would stand for one
    words_only(name, fields, render(name, dict.fromkeys(fields)))
    assert re.match(r"\d\d:\d\d:\d\d[!✗ ] group 1: ", render(name, {**fields, "group": 1}))  # a replica group's


def test_examples_as_the_docs_show_them() -> None:
    """docs/console.md's examples, as the console prints them."""
    assert render("etcd_call_retry", {"error": "UNAVAILABLE: failed to connect to all addresses"}).split("\n") == [
        "03:04:05! etcd did not answer (UNAVAILABLE: failed to connect to all addresses); trying again".replace(
            "03:04:05", ConsoleRenderer(colors=False).clock({"timestamp": STAMP})),
        " " * 10 + "hint  check that etcd is up and reachable from this node (rendezvous.endpoints)"]
    killed = render("workers_killed", {"signal": "SIGKILL", "after_s": 30.0, "ranks": [0, 1]})
    assert killed.endswith("! rank(s) 0, 1 still ran 30 s after the stop: killed with SIGKILL"), killed
    again = render("lighthouse_restarting", {"exit": "exit code 1", "restart": 1, "after_s": 0.5, "group": 1})
    assert again.endswith("! group 1: the TorchFT lighthouse (the replica groups' coordinator) this node hosts exited "
                          "(exit code 1): restarting it (restart 1) in 0.5 s"), again
    expired = render("timer_expired", {"local_rank": 1, "pid": 42, "scope": "train_step", "signal": 9,
                                       "overdue_s": 0.021, "stacks_captured": True})
    assert expired.endswith("! the watchdog timer 'train_step' of local rank 1 (pid 42) expired 0.021 s past its "
                            "deadline; sent SIGKILL"), expired
    assert render("timer_expired", {"signal": 0}).endswith("! the watchdog timer expired; sent no signal")


def test_a_logged_exception_is_named_in_its_line() -> None:
    """`log.exception(...)` renders while the exception is handled: its type and text are woven in."""
    try:
        {}["local_rank"]
    except KeyError:
        line = render("stall_check_failed", {"exc_info": True})
    assert line.endswith("✗ the stall detector failed: KeyError: 'local_rank'; the job runs on without it"), line


VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text()
    | st.builds(lambda s, n: s * n, st.text(min_size=1, max_size=8), st.integers(0, 3000)),
    lambda inner: st.lists(inner, max_size=12) | st.dictionaries(st.text(max_size=5), inner, max_size=8),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(PHRASED), data=st.data())
def test_any_values_render_as_one_readable_line(name: str, data: st.DataObject) -> None:
    """Whatever the fields hold (control characters, huge texts, None, numbers, nested lists): no raise, one line of
    printable text (and a hint), bounded."""
    names = sorted({f for s in SITES[name] for f in s.fields} | {"group", "exc_info"})
    fields = data.draw(st.dictionaries(st.sampled_from(names), VALUES, max_size=len(names)))
    text = render(name, fields)
    lines = text.split("\n")
    assert 1 <= len(lines) <= 2, text
    assert all(line.isprintable() and "\x1b" not in line for line in lines), text
    assert all(len(line) < 8000 for line in lines), len(text)
