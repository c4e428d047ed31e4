"""torch's FileTimerClient wire format: one JSON line per request, parsed and split with bounded memory.

A client (torch.distributed.elastic.timer.FileTimerClient) opens the FIFO O_WRONLY|O_NONBLOCK for each
request and writes FileTimerRequest.to_json() plus a newline in one write() of at most PIPE_BUF bytes:
    {"version": 1, "pid": int, "scope_id": str, "expiration_time": float (time.time()), "signal": int}
`expiration_time < 0` releases the scope; `signal <= 0` asks for a report only.

Such a write is atomic: it reaches the reader whole or not at all, never interleaved with another writer's
bytes. A writer that breaks the rule (a line without its newline, a line over PIPE_BUF) must not cost the
next valid request: `LineSplitter` keeps at most PIPE_BUF bytes of a partial line and, when a line does
not parse, `RequestReader` tries the part after the read boundary and the part from the last
`{"version"` (where every FileTimerRequest.to_json() begins): a fragment and the next request may arrive
in one read or in two. The orphan fragment is counted as a rejection.

Every input ends as a `TimerRequest` or as one counted `Rejection` kind; nothing here raises on input.
"""

from __future__ import annotations

import json
import math
import select
import signal
from collections import Counter
from dataclasses import dataclass
from enum import StrEnum

WIRE_VERSION = 1
MAX_LINE = select.PIPE_BUF  # the client refuses to send more; longer lines are discarded
MAX_HORIZON_S = 366 * 24 * 3600.0  # a deadline further ahead than this is treated as garbage
MAX_SCOPE_CHARS = 1024
REQUEST_START = b'{"version"'  # how FileTimerRequest.to_json() begins
_VALID_SIGNALS = frozenset(int(s) for s in signal.valid_signals())


class Rejection(StrEnum):
    """Why a request was refused: a small fixed set, so counting them takes bounded memory."""

    NOT_JSON = "not_json"
    NOT_OBJECT = "not_object"
    VERSION = "version"
    FIELD = "field"  # a field missing or of the wrong type
    PID = "pid"  # pid not positive
    SCOPE_TOO_LONG = "scope_too_long"
    EXPIRATION = "expiration"  # not finite, or more than a year ahead
    SIGNAL = "signal"  # not a valid signal number
    TOO_LONG = "too_long"  # line over PIPE_BUF bytes
    FRAGMENT = "fragment"  # bytes without a newline, orphaned when the next request arrived
    FOREIGN_PID = "foreign_pid"  # pid is not a worker of this runner (or is the agent itself)
    OTHER_RANK = "other_rank"  # pid is a worker of another local rank than the channel's
    SCOPE_CAP = "scope_cap"  # the worker already holds the maximum number of scopes


class RequestError(ValueError):
    """A refused wire line: `kind` for counting, the message for humans."""

    def __init__(self, kind: Rejection, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class TimerRequest:
    """One validated line from a client. expiration_time < 0 means release."""

    pid: int
    scope: str
    expiration_time: float  # time.time() based
    signal: int  # <= 0: report only, do not signal


def parse_request(line: bytes, now: float) -> TimerRequest:
    """Validate one wire line (without its newline) against wall-clock `now`. Raises RequestError."""
    doc = _decode(line)
    version = _int_field(doc, "version")
    if version != WIRE_VERSION:
        raise RequestError(Rejection.VERSION, f"unsupported version {version!r} (expected {WIRE_VERSION})")
    pid = _int_field(doc, "pid")
    scope = doc.get("scope_id")
    if not isinstance(scope, str):
        raise _field_error(doc, "scope_id")
    when = _expiration(doc, now)
    sig = _int_field(doc, "signal")
    if pid <= 0:
        raise RequestError(Rejection.PID, f"pid must be positive, got {pid}")
    if len(scope) > MAX_SCOPE_CHARS:
        raise RequestError(Rejection.SCOPE_TOO_LONG, f"scope_id longer than {MAX_SCOPE_CHARS} characters")
    if sig > 0 and sig not in _VALID_SIGNALS:
        raise RequestError(Rejection.SIGNAL, f"signal {sig} is not a valid signal number")
    return TimerRequest(pid=pid, scope=scope, expiration_time=when, signal=sig)


def _decode(line: bytes) -> dict[str, object]:
    try:
        doc = json.loads(line)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        raise RequestError(Rejection.NOT_JSON, f"not JSON: {exc}") from None
    except RecursionError:
        raise RequestError(Rejection.NOT_JSON, "not JSON: nested too deeply") from None
    if not isinstance(doc, dict):
        raise RequestError(Rejection.NOT_OBJECT, "not a JSON object")
    return doc


def _expiration(doc: dict[str, object], now: float) -> float:
    value = doc.get("expiration_time")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _field_error(doc, "expiration_time")
    try:
        when = float(value)
    except OverflowError:  # an integer too large for a float
        when = math.inf
    if not math.isfinite(when) or when > now + MAX_HORIZON_S:
        raise RequestError(Rejection.EXPIRATION, f"expiration_time {when!r} is not a time.time() value within a year")
    return when


def _int_field(doc: dict[str, object], name: str) -> int:
    value = doc.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _field_error(doc, name)
    return value


def _field_error(doc: dict[str, object], name: str) -> RequestError:
    if name not in doc:
        return RequestError(Rejection.FIELD, f"missing field '{name}'")
    return RequestError(Rejection.FIELD, f"field '{name}' has the wrong type ({type(doc[name]).__name__})")


@dataclass(frozen=True)
class Line:
    """A complete line. `tail` is set when the line began with bytes buffered from an earlier read.

    Such a line is either one request split over two reads (parse `data`) or an orphan fragment followed by a
    whole request (parse `tail`, the part that came with the newline). `data` is None when the line was
    over-long and dropped; `tail` then holds its last PIPE_BUF bytes at most, where a request may still end it.
    """

    data: bytes | None
    tail: bytes | None = None


class LineSplitter:
    """Split a byte stream into lines; keep at most `limit` bytes of a partial line; drop over-long lines."""

    def __init__(self, limit: int = MAX_LINE) -> None:
        self._limit = limit
        self._buf = bytearray()
        self._discarding = False  # inside an over-long line: its bytes are dropped up to its newline

    @property
    def buffered(self) -> int:
        """Bytes held for a partial line (never more than the limit)."""
        return len(self._buf)

    def reset(self) -> None:
        """Forget any partial line."""
        self._buf.clear()
        self._discarding = False

    def feed(self, data: bytes) -> tuple[list[Line], int]:
        """The complete lines in `data` (plus what was buffered) and how many over-long lines were dropped."""
        lines: list[Line] = []
        dropped = 0
        *complete, rest = data.split(b"\n")
        for i, chunk in enumerate(complete):
            if i == 0 and self._discarding:  # the end of an over-long line (counted when it overflowed)
                self._discarding = False
                lines.append(Line(None, chunk[-self._limit :]))
            elif i == 0 and self._buf:
                joined = bytes(self._buf) + chunk
                self._buf.clear()
                if len(joined) > self._limit:
                    dropped += 1
                    lines.append(Line(None, chunk[-self._limit :]))
                else:
                    lines.append(Line(joined, chunk))
            elif len(chunk) > self._limit:  # dropped, but a request may end it (after a fragment in the same read)
                dropped += 1
                lines.append(Line(None, chunk[-self._limit :]))
            else:
                lines.append(Line(chunk))
        if rest and not self._discarding:
            if len(self._buf) + len(rest) > self._limit:
                self._buf.clear()
                self._discarding = True
                dropped += 1
            else:
                self._buf += rest
        return lines, dropped


class RequestReader:
    """One channel's byte stream to requests: a LineSplitter, parse_request, and counted rejections."""

    def __init__(self, limit: int = MAX_LINE) -> None:
        self._splitter = LineSplitter(limit)
        self.rejected: Counter[Rejection] = Counter()
        self.last_error = ""  # the most recent rejection's message, for the periodic summary

    @property
    def buffered(self) -> int:
        """Bytes held for a partial line."""
        return self._splitter.buffered

    def reset(self) -> None:
        """Forget any partial line (the counters stay)."""
        self._splitter.reset()

    def reject(self, kind: Rejection, message: str, count: int = 1) -> None:
        """Count refused requests."""
        self.rejected[kind] += count
        self.last_error = message

    def feed(self, data: bytes, now: float) -> list[TimerRequest]:
        """The valid requests in `data`; every other line (or fragment) is counted in `rejected`."""
        lines, dropped = self._splitter.feed(data)
        if dropped:
            self.reject(Rejection.TOO_LONG, f"line longer than {MAX_LINE} bytes (PIPE_BUF)", dropped)
        out: list[TimerRequest] = []
        for line in lines:
            request = self._parse(line, now)
            if request is not None:
                out.append(request)
        return out

    def _parse(self, line: Line, now: float) -> TimerRequest | None:
        """A request from the whole line, else from its last request-shaped suffix (the rest was a fragment)."""
        whole: RequestError | None = None
        if line.data is not None:
            try:
                return parse_request(line.data, now)
            except RequestError as exc:
                whole = exc
        for candidate in _suffixes(line):
            try:
                request = parse_request(candidate, now)
            except RequestError:
                continue
            if whole is not None:  # (a dropped over-long start was counted when it was dropped)
                self.reject(Rejection.FRAGMENT, "bytes without a newline before a request (a writer broke the rule)")
            return request
        if whole is not None:  # else: the end of an over-long line, already counted
            self.reject(whole.kind, str(whole))
        return None


def _suffixes(line: Line) -> list[bytes]:
    """Where a whole request may start inside a line that does not parse.

    After the read boundary (`tail`), and at the last b'{"version"' (torch's to_json starts with it and cannot
    contain it elsewhere: quotes inside strings are escaped). A fragment and the request after it can arrive in
    one read, or in two.
    """
    out: list[bytes] = []
    if line.tail is not None:
        out.append(line.tail)
    text = line.tail if line.data is None else line.data
    assert text is not None
    start = text.rfind(REQUEST_START)
    if start > 0 and text[start:] not in out:
        out.append(text[start:])
    return out
