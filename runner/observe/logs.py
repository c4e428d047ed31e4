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
from runner.system.private_files import open_private_append


def configure(fmt: str = "auto", stream: IO[str] | None = None, verbosity: str = "normal") -> None:
    """Configure structlog once: the calm console on a TTY (or fmt='console'), JSON lines otherwise.

    `verbosity` (quiet | normal | verbose; RUNNER_LOG_LEVEL=debug|info|warning overrides it) only changes what the
    console shows: `<run dir>/agent.jsonl` keeps every event at INFO and above (and DEBUG when verbose).
    """
    from runner.observe.console import ConsoleRenderer, LevelFilter, level_number, writer_factory

    shown = level_number(os.environ.get("RUNNER_LOG_LEVEL") or verbosity)
    out = stream or sys.stderr
    tty = out.isatty()
    pretty = fmt == "console" or (fmt == "auto" and tty)
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
    """Appends one JSON object per line to a file, flushed at once (survives a SIGKILL of the agent)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] | None = None

    def write(self, event: dict[str, Any]) -> None:
        """Append `event` as one line."""
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open_private_append(self.path)
        self._file.write(json.dumps(event, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None


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
