"""structlog configuration; the run's JSON-lines files (`transitions.jsonl`, and `agent.jsonl`: every event)."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import IO, Any

import structlog
from structlog.typing import EventDict

from runner.config.redact import redact_event
from runner.system.private_files import open_private_fd
from runner.system.soft_io import close_fd, note, write_all


def configure(fmt: str = "auto", stream: IO[str] | None = None, verbosity: str = "normal") -> None:
    """Configure structlog once: the calm console's plain lines (fmt 'auto' or 'console'), or JSON lines ('json').

    The console speaks one language whether or not it is a terminal (`runner job.yaml 2>&1 | tee log` reads as the
    terminal does): a terminal only adds colours (unless NO_COLOR) and the live line. JSON lines on the console
    only where asked (`logs.format: json`); agent.jsonl keeps them always.

    `verbosity` (quiet | normal | verbose; RUNNER_LOG_LEVEL=debug|info|warning overrides it) only changes what the
    console shows: `<run dir>/agent.jsonl` keeps every event at INFO and above (and DEBUG when verbose).
    """
    from runner.observe.console import ConsoleRenderer, LevelFilter, level_number, writer_factory

    shown = level_number(os.environ.get("RUNNER_LOG_LEVEL") or verbosity)
    out = stream or sys.stderr
    tty = out.isatty()
    pretty = fmt != "json"
    renderer: Any = (
        ConsoleRenderer(colors=tty and not os.environ.get("NO_COLOR"), verbose=shown <= logging.DEBUG)
        if pretty
        else structlog.processors.JSONRenderer(sort_keys=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            redact_event,  # nothing secret-looking reaches agent.jsonl or the console
            RUN_LOG,
            LevelFilter(shown),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(min(shown, logging.INFO)),
        logger_factory=writer_factory(out),
        cache_logger_on_first_use=True,
    )


class JsonLines:
    """Appends one JSON object per line to a file, written at once (survives a SIGKILL of the agent).

    Each line is one write on an O_APPEND descriptor, with no buffer: a line the disk refused (full, read-only,
    failing) raises OSError from `write` (the caller warns) and leaves nothing for `close` to retry, which never
    raises. After a line cut short, the next one starts on a fresh line.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._torn = False  # the last line was cut short: the next one starts with a newline

    def write(self, event: dict[str, Any]) -> None:
        """Append `event` as one line; OSError when the disk cannot take it (the file stays usable)."""
        data = (json.dumps(event, default=str) + "\n").encode("utf-8", "surrogateescape")
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = open_private_fd(self.path)
        if self._torn:
            data = b"\n" + data
        written, error = write_all(self._fd, data)
        if error is not None:
            self._torn = self._torn or written > 0  # part of the line is in the file
            raise error
        self._torn = False

    def close(self) -> None:
        """Close the file (idempotent; never raises: nothing is buffered, and a failing close is a warning)."""
        fd, self._fd = self._fd, None
        close_fd(fd, "log_close_failed", self.path)


class RunLog:
    """structlog processor that keeps every event of the run.

    Once a run dir exists, every event (whatever the console shows) also goes to `<run dir>/agent.jsonl`, so the
    agent's own story is kept with the workers' logs.
    """

    def __init__(self) -> None:
        self.sink: JsonLines | None = None
        self.failed = False

    def __call__(self, _logger: object, _method: str, event_dict: EventDict) -> EventDict:
        """Copy the event to the sink; pass it on unchanged."""
        if self.sink is not None and not self.failed:
            try:
                self.sink.write(dict(event_dict))
            except OSError as e:  # a full or read-only disk: the console still shows events, the job goes on
                self.failed = True
                note("agent_log_write_failed", self.sink.path, e)  # logging it here would come back to this sink
                event_dict["agent_log"] = f"agent.jsonl stopped: {e}"
        return event_dict

    def open(self, path: Path) -> None:
        """Start keeping events in `path`."""
        self.close()
        self.sink = JsonLines(path)
        self.failed = False

    def close(self) -> None:
        """Stop keeping events (idempotent)."""
        if self.sink is not None:
            self.sink.close()
            self.sink = None


RUN_LOG = RunLog()
