"""Pure pieces of the timer server: request parsing and line splitting."""

from __future__ import annotations

import json
import signal

import pytest
from torch.distributed.elastic.timer.file_based_local_timer import FileTimerRequest

from runner.watchdog.timer_server import MAX_LINE, LineSplitter, TimerRequest, parse_request

NOW = 1_700_000_000.0


def line(**fields: object) -> bytes:
    doc: dict[str, object] = {"version": 1, "pid": 42, "scope_id": "step", "expiration_time": NOW + 5, "signal": 9}
    doc.update(fields)
    return json.dumps({k: v for k, v in doc.items() if v is not None}).encode()


class TestParseRequest:
    def test_torch_client_request_parses(self) -> None:
        """What torch's FileTimerRequest.to_json() sends is exactly what we accept."""
        wire = FileTimerRequest(
            worker_pid=42, scope_id="a.py#step", expiration_time=NOW + 1.5, signal=signal.SIGKILL
        ).to_json()
        assert parse_request(wire.encode(), NOW) == TimerRequest(42, "a.py#step", NOW + 1.5, signal.SIGKILL)

    def test_torch_release_parses_as_negative_expiration(self) -> None:
        """A torch release (expiration_time -1, signal 0) parses as a release."""
        wire = FileTimerRequest(worker_pid=42, scope_id="s", expiration_time=-1, signal=0).to_json()
        assert parse_request(wire.encode(), NOW).expiration_time < 0

    def test_integer_expiration_and_report_only_signal(self) -> None:
        """An integral expiration_time is fine; signal <= 0 means report only and is kept."""
        assert parse_request(line(expiration_time=int(NOW) + 3, signal=-1), NOW).signal == -1

    def test_unknown_extra_fields_are_ignored(self) -> None:
        """Extra fields from a newer client do not make the request invalid."""
        assert parse_request(line(extra="x"), NOW).pid == 42

    @pytest.mark.parametrize(
        ("raw", "why"),
        [
            (b"{oops", "not JSON"),
            (b"\xff", "not JSON"),
            (b"[1]", "not a JSON object"),
            (line(version=2), "unsupported version"),
            (line(version=None), "missing field 'version'"),
            (line(pid=None), "missing field 'pid'"),
            (line(pid="42"), "field 'pid' has the wrong type"),
            (line(pid=True), "field 'pid' has the wrong type"),
            (line(pid=0), "pid must be positive"),
            (line(scope_id=7), "field 'scope_id' has the wrong type"),
            (line(scope_id="s" * 2000), "longer than"),
            (line(expiration_time="soon"), "field 'expiration_time' has the wrong type"),
            (line(expiration_time=float("inf")), "within a year"),
            (line(expiration_time=NOW + 400 * 86400), "within a year"),
            (line(signal=1.5), "field 'signal' has the wrong type"),
            (line(signal=999), "not a valid signal"),
        ],
    )
    def test_bad_requests_are_rejected_with_a_reason(self, raw: bytes, why: str) -> None:
        """Every kind of malformed line raises ValueError saying what is wrong."""
        with pytest.raises(ValueError, match=why):
            parse_request(raw, NOW)


class TestLineSplitter:
    def test_partial_lines_are_buffered_until_newline(self) -> None:
        """A line split over several reads comes out whole, once."""
        split = LineSplitter()
        assert split.feed(b"ab") == ([], 0)
        assert split.feed(b"c\nde") == ([b"abc"], 0)
        assert split.feed(b"f\n\n") == ([b"def", b""], 0)

    def test_line_at_the_limit_is_kept(self) -> None:
        """A line of exactly PIPE_BUF bytes (the client's maximum) is delivered."""
        assert LineSplitter().feed(b"x" * MAX_LINE + b"\n") == ([b"x" * MAX_LINE], 0)

    def test_oversized_line_in_one_read_is_dropped(self) -> None:
        """An over-long complete line is counted as dropped and the next line survives."""
        assert LineSplitter().feed(b"x" * (MAX_LINE + 1) + b"\nok\n") == ([b"ok"], 1)

    def test_oversized_line_over_many_reads_is_dropped_up_to_its_newline(self) -> None:
        """An over-long line arriving in pieces is dropped once, up to its newline, without buffering it."""
        split = LineSplitter(limit=10)
        assert split.feed(b"x" * 8) == ([], 0)
        assert split.feed(b"x" * 8) == ([], 1)
        assert split.feed(b"x" * 100) == ([], 0)
        assert split.feed(b"tail\nok\n") == ([b"ok"], 0)
