"""The agent's console: a header once, one calm line per transition and per notable event.

Warnings and errors read as sentences: an event's `message`, or its words in runner/observe/phrases.py.

The same plain lines on a terminal (with colours) and off one (a pipe, a file, a CI log); JSON lines only with
`logs.format: json` (runner/observe/logs.py). Every event, shown or not, is kept in `<run dir>/agent.jsonl`.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import re
from collections.abc import Callable, Mapping
from typing import IO

import structlog
from structlog.typing import EventDict

from runner.observe import phrases
from runner.observe.live_line import LIVE
from runner.observe.phrases import names, printable, short

RESET, BOLD, DIM = "\x1b[0m", "\x1b[1m", "\x1b[2m"
RED, GREEN, YELLOW, BLUE, CYAN = "\x1b[31m", "\x1b[32m", "\x1b[33m", "\x1b[34m", "\x1b[36m"
STATE_COLORS = {
    "INIT": DIM, "RENDEZVOUS": BLUE, "RUNNING": GREEN, "FAILED": RED, "RESTARTING": YELLOW, "SHUTDOWN": BOLD,
}
OUTCOME_COLORS = {"succeeded": GREEN, "failed": RED, "error": RED, "stopped": YELLOW}
# Info events worth a line at the normal level; the rest are shown with --verbose (all are in agent.jsonl). Not the
# rendezvous's own records (rendezvous_joined, rendezvous_event, restart_charged, rendezvous_closed): each only
# restates, as `name key=value`, the transition line beside it (the round, the lost peer, the restart's charge).
NOTABLE = frozenset({
    "run_started", "transition", "failure", "backoff", "graceful_stop", "metrics_listening", "waiting",
    "rendezvous_waiting_for_host",  # else a node started before the hosting one shows nothing until it is up
    "hosted_node_stopped_job",  # a Ctrl-C of the hosting node stops the other nodes too: it says so
})
HIDDEN_FIELDS = frozenset({"event", "level", "timestamp", "job", "node", "logger", "time"})
ROUND = re.compile(r"^round (\d+): (\d+) node\(s\), world size (\d+), master (\S+)$")
INDENT = " " * 10  # under the time column
LEVELS = {"quiet": logging.WARNING, "normal": logging.INFO, "verbose": logging.DEBUG}


def level_number(name: str) -> int:
    """The logging level of a name as RUNNER_LOG_LEVEL or the console verbosity spells it (unknown: INFO)."""
    name = name.lower()
    if name in LEVELS:
        return LEVELS[name]
    value = logging.getLevelName(name.upper())
    return value if isinstance(value, int) else logging.INFO


class LevelFilter:
    """structlog processor placed after the run log: drops, for the console only, events below `min_level`."""

    def __init__(self, min_level: int) -> None:
        self.min_level = min_level

    def __call__(self, _logger: object, method: str, event_dict: EventDict) -> EventDict:
        """Pass the event on, or raise DropEvent."""
        level = event_dict.get("level", method)
        if level_number(str(level)) < self.min_level:
            raise structlog.DropEvent
        return event_dict


class ConsoleRenderer:
    """structlog's last processor on a terminal: each event becomes zero or more short lines.

    `now` gives the local time of events that carry no timestamp (injected by tests).
    """

    def __init__(
        self, colors: bool, verbose: bool = False, now: Callable[[], dt.datetime] | None = None
    ) -> None:
        self.colors = colors
        self.verbose = verbose
        self.now = now or (lambda: dt.datetime.now().astimezone())
        self.run_dir = ""
        self.failed_reason = ""  # the reason on the last `→ FAILED` line: a failure line with nothing more is dropped

    def __call__(self, _logger: object, method: str, event_dict: EventDict) -> str:
        """The event's lines, or DropEvent when it is not worth a line at this verbosity."""
        event = str(event_dict.get("event", ""))
        level = str(event_dict.get("level", method))
        if event == "run_started":
            return self.header(event_dict)
        if event in ("transition", "job_transition"):  # job_transition: the replica groups' job machine
            return self.transition(event_dict)
        if event == "failure":
            return self.failure(event_dict)
        if event == "waiting":
            if LIVE.on:  # the live line shows the wait as it goes; agent.jsonl has kept the event
                raise structlog.DropEvent
            return self.paint(self.clock(event_dict), DIM) + "  " + self.paint(wait_text(event_dict), DIM)
        if level in ("info", "debug") and event not in NOTABLE and not self.verbose:
            raise structlog.DropEvent
        return self.generic(event, level, event_dict)

    def paint(self, text: str, *codes: str) -> str:
        """`text` in the given ANSI styles when colours are on."""
        if not self.colors or not codes:
            return text
        return "".join(codes) + text + RESET

    def clock(self, event_dict: Mapping[str, object]) -> str:
        """HH:MM:SS, local time, of the event."""
        stamp = event_dict.get("timestamp")
        when = None
        if isinstance(stamp, str):
            try:
                when = dt.datetime.fromisoformat(stamp).astimezone()
            except ValueError:
                when = None
        return (when or self.now()).strftime("%H:%M:%S")

    def header(self, e: Mapping[str, object]) -> str:
        """Who and where, once: job, node, workers, rendezvous, run dir."""
        self.run_dir = str(e.get("run_dir", ""))
        parts = [f"job {e.get('job', '?')}", f"node {e.get('node', '?')}"]
        if e.get("replica_groups") is not None:  # docs/replica_groups.md: each group is its own world
            parts.append(f"{e['replica_groups']} replica groups of {e.get('group_workers', '?')} worker(s)"
                         + (f" (at least {e['min_active']} stepping)" if e.get("min_active") is not None else ""))
        elif e.get("nproc_per_node") is not None:
            parts.append(f"{e['nproc_per_node']} worker(s) per node")
        if e.get("nodes"):
            parts.append(f"nodes {e['nodes']}")
        if e.get("backend"):
            parts.append(f"{e['backend']} rendezvous")
        first = self.paint("runner", BOLD, CYAN) + "    " + self.paint(" · ".join(parts), BOLD)
        return first + "\n" + INDENT + self.paint(f"logs {self.run_dir}", DIM)

    def transition(self, e: Mapping[str, object]) -> str:
        """`12:00:01  RENDEZVOUS → RUNNING   round 0 · 2 nodes · world 4 · master 10.0.0.5:41231`."""
        src, dst = str(e.get("src", "?")), str(e.get("dst", "?"))
        arrow = f"{src} → {dst}"
        pad = " " * max(1, 26 - len(arrow))
        reason = self.reason(printable(str(e.get("reason") or "")))
        if dst == "FAILED":
            self.failed_reason = reason
        outcome = e.get("outcome")
        color = OUTCOME_COLORS.get(str(outcome), BOLD) if dst in ("SHUTDOWN", "ENDED") else STATE_COLORS.get(dst, "")
        text = self.paint(self.clock(e), DIM) + "  " + self.paint(src, DIM) + " → " + self.paint(dst, color)
        if e.get("group") is not None:  # a replica group's own machine (docs/replica_groups.md)
            reason = f"group {e['group']} · {reason}" if reason else f"group {e['group']}"
        elif e.get("event") == "job_transition":  # the machine of the job above the groups
            reason = f"job · {reason}" if reason else "job"
        if outcome:
            reason = f"{reason} · {outcome}" if reason else str(outcome)
        return text + pad + reason if reason else text

    def reason(self, reason: str) -> str:
        """The transition's reason, shortened where it is known (rendezvous rounds, the run dir)."""
        if self.run_dir and reason == f"logs in {self.run_dir}":
            return ""  # the header said it
        m = ROUND.match(reason)
        if m:
            rnd, nodes, world, master = m.groups()
            return f"round {rnd} · {nodes} node{'s' if nodes != '1' else ''} · world {world} · master {master}"
        return reason

    def failure(self, e: Mapping[str, object]) -> str:
        """The attempt's root cause under its transition: error, hint, log folder."""
        lines = []
        if e.get("error"):
            lines.append(INDENT + self.paint("error ", RED, BOLD) + printable(str(e["error"])))
        if e.get("hint"):
            lines.append(INDENT + self.paint("hint  ", YELLOW) + printable(str(e["hint"])))
        log_dir = str(e.get("log_dir") or "")
        if log_dir:
            if self.run_dir and log_dir.startswith(self.run_dir + "/"):
                log_dir = log_dir[len(self.run_dir) + 1 :]
            lines.append(INDENT + self.paint(f"logs  {log_dir}", DIM))
        if not lines:
            reason = printable(str(e.get("reason", "")))
            if reason == self.failed_reason:  # the FAILED line above says it already
                raise structlog.DropEvent
            lines.append(INDENT + self.paint("failed ", RED) + reason)
        return "\n".join(lines)

    def generic(self, event: str, level: str, e: Mapping[str, object]) -> str:
        """Any other event: time, a mark for warnings and errors, then its sentence in words.

        The sentence is the event's `message`, or its phrase (runner/observe/phrases.py); an event with neither (an
        info event shown under --verbose) is its name and its fields as key=value.
        """
        if event == "backoff":
            return INDENT + self.paint(f"waiting {e.get('delay_s')} s before restart {e.get('restart')}", DIM)
        mark = {"warning": self.paint("!", YELLOW, BOLD), "error": self.paint("✗", RED, BOLD)}.get(level, " ")
        if isinstance(e.get("message"), str):  # an event that says itself in words: its sentence, then its hint
            return self.said(mark, e, printable(str(e["message"])))
        if level not in ("info", "debug") or event in NOTABLE:
            words = phrases.sentence(event, e)
            if words is not None:
                text, hint = words
                if e.get("group") is not None:  # a replica group's own event (docs/replica_groups.md)
                    text = f"group {short(e['group'])}: {text}"
                return self.said(mark, e, text, hint)
        fields = " ".join(f"{k}={short(v)}" for k, v in e.items() if k not in HIDDEN_FIELDS)
        name = self.paint(event, YELLOW if level == "warning" else RED if level in ("error", "critical") else "")
        body = f"{name}  {self.paint(fields, DIM)}" if fields else name
        return f"{self.paint(self.clock(e), DIM)}{mark} {body}"

    def said(self, mark: str, e: Mapping[str, object], text: str, hint: str = "") -> str:
        """`12:00:04! <text>`, and `hint  <hint>` under it when there is one (the event's own hint first)."""
        line = f"{self.paint(self.clock(e), DIM)}{mark} {text}"
        if isinstance(e.get("hint"), str) and e["hint"]:
            hint = printable(str(e["hint"]))
        if hint:
            line += "\n" + INDENT + self.paint("hint  ", YELLOW) + hint
        return line


def wait_text(e: Mapping[str, object]) -> str:
    """A `waiting` event's fields in one line, e.g. `⋯ rendezvous round 0 · joined 1 of 2 (vm) · 1 more needed`.

    Never raises, whatever the fields hold.
    """
    wait, left = str(e.get("wait", "")), countdown(e.get("left_s"))
    if wait == "backoff":
        text = f"restart {short(e.get('restart', '?'))}" + (f" in {left}" if left else " soon")
    elif wait == "grace":
        alive = e.get("ranks")
        many = isinstance(alive, list | tuple) and len(alive) > 1
        text = "stopping workers"
        if names(alive):
            text += f": rank{'s' if many else ''} {names(alive)} still alive"
        if left:
            text += f" · SIGKILL in {left}"
    elif wait == "rendezvous":
        text = rendezvous_text(e, left)
    else:
        text = f"waiting for {short(wait) or 'something'}" + (f" · {left} left" if left else "")
    return "⋯ " + text


def rendezvous_text(e: Mapping[str, object], left: str) -> str:
    """A rendezvous wait: who joined (the leader knows), how many more are needed, the time left."""
    low, high = number(e.get("min")), number(e.get("max"))
    need = "?" if low is None else str(low) if high in (None, low) else f"{low}..{high}"
    text = f"rendezvous round {short(e.get('round', '?'))}"
    if e.get("role") == "follower":
        text += f" · led by {short(e.get('leader', '?'))} · nodes {need}"
    else:
        joined, count = e.get("joined"), number(e.get("joined_count"))
        if count is None:
            count = len(joined) if isinstance(joined, list | tuple) else 0
        text += f" · joined {count} of {need}" + (f" ({names(joined)})" if names(joined) else "")
        if low is not None and count < low:
            text += f" · {low - count} more needed"
        if names(e.get("waiting_for")):
            text += f" · waiting for {names(e.get('waiting_for'))}"
    last_call = countdown(e.get("last_call_s"))
    if last_call:
        return text + f" · closes in {last_call} (last call)"
    return text + (f" · timeout in {left}" if left else "")


def number(value: object) -> int | None:
    """An integer field, or None when it is not one."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def countdown(value: object) -> str:
    """Seconds left as `7 s`, `9:58` or `2:03:04`; '' when the field is not a finite non-negative number."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value < 1e9:
        return ""
    left = math.ceil(value)
    if left < 60:
        return f"{left} s"
    hours, rest = divmod(left, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class ConsoleWriter:
    """structlog's logger on the console: one write per event; a closed console (EPIPE, EIO) silences it for good.

    Closing the console (`| head`, a terminal that went away) must never stop the job; agent.jsonl keeps everything.
    """

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.closed = False

    def msg(self, message: str) -> None:
        """Write one rendered event."""
        if self.closed:
            return
        try:
            with LIVE.writing():  # the live line, if any, goes out of the way and comes back below
                self.stream.write(message + "\n")
                self.stream.flush()
        except (OSError, ValueError):  # EPIPE, EIO, EBADF, or a closed file object
            self.closed = True

    debug = info = warning = warn = error = err = critical = exception = fatal = failure = log = msg


def writer_factory(stream: IO[str]) -> Callable[..., ConsoleWriter]:
    """A structlog logger_factory: every logger shares one writer on `stream`.

    The first logger made after structlog.configure() also settles the live line: on when the configured chain
    ends with a ConsoleRenderer and `stream` is a terminal (it shows waits when the chain lets INFO through).
    """
    writer = ConsoleWriter(stream)
    settled = False

    def factory(*_args: object) -> ConsoleWriter:
        nonlocal settled
        if not settled:
            settled = True
            attach_live_line(stream)
        return writer

    return factory


def attach_live_line(stream: IO[str]) -> None:
    """Give the live line to `stream` if it is a terminal under the calm console; else take it away."""
    processors = structlog.get_config()["processors"]
    renderer = next((p for p in processors if isinstance(p, ConsoleRenderer)), None)
    shown = min((p.min_level for p in processors if isinstance(p, LevelFilter)), default=logging.INFO)
    try:
        fd = stream.fileno() if stream.isatty() else None
    except (OSError, ValueError, AttributeError):
        fd = None
    if renderer is None or fd is None:
        LIVE.detach()
        return
    LIVE.attach(fd, wait_text, colors=renderer.colors, waits=shown <= logging.INFO)
