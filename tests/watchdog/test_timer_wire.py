"""The wire format (runner/watchdog/wire.py): request parsing, line splitting, resynchronisation, fuzzing."""

from __future__ import annotations

import json
import signal

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch.distributed.elastic.timer.file_based_local_timer import FileTimerRequest

from runner.watchdog.wire import (
    MAX_LINE,
    Line,
    LineSplitter,
    Rejection,
    RequestError,
    RequestReader,
    TimerRequest,
    parse_request,
)

NOW = 1_700_000_000.0


def line(**fields: object) -> bytes:
    doc: dict[str, object] = {"version": 1, "pid": 42, "scope_id": "step", "expiration_time": NOW + 5, "signal": 9}
    doc.update(fields)
    return json.dumps({k: v for k, v in doc.items() if v is not None}).encode()


def torch_line(pid: int = 42, scope: str = "a.py#step", expiration: float = NOW + 1.5, sig: int = 9) -> bytes:
    """Exactly what torch's FileTimerClient writes for one request (without the newline)."""
    return FileTimerRequest(worker_pid=pid, scope_id=scope, expiration_time=expiration, signal=sig).to_json().encode()


class TestParseRequest:
    def test_torch_client_request_parses(self) -> None:
        """What torch's FileTimerRequest.to_json() sends is exactly what we accept."""
        assert parse_request(torch_line(), NOW) == TimerRequest(42, "a.py#step", NOW + 1.5, signal.SIGKILL)

    def test_torch_release_parses_as_negative_expiration(self) -> None:
        """A torch release (expiration_time -1, signal 0) parses as a release."""
        assert parse_request(torch_line(expiration=-1, sig=0), NOW).expiration_time < 0

    def test_integer_expiration_and_report_only_signal(self) -> None:
        """An integral expiration_time is fine; signal <= 0 means report only and is kept."""
        assert parse_request(line(expiration_time=int(NOW) + 3, signal=-1), NOW).signal == -1

    def test_unknown_extra_fields_are_ignored(self) -> None:
        """Extra fields from a newer client do not make the request invalid."""
        assert parse_request(line(extra="x"), NOW).pid == 42

    @pytest.mark.parametrize(
        ("raw", "kind", "why"),
        [
            (b"{oops", Rejection.NOT_JSON, "not JSON"),
            (b"\xff", Rejection.NOT_JSON, "not JSON"),
            (b"[" * 100_000, Rejection.NOT_JSON, "not JSON"),
            (b'{"pid": ' + b"9" * 5000 + b"}", Rejection.NOT_JSON, "not JSON"),
            (b"[1]", Rejection.NOT_OBJECT, "not a JSON object"),
            (line(version=2), Rejection.VERSION, "unsupported version"),
            (line(version=None), Rejection.FIELD, "missing field 'version'"),
            (line(pid=None), Rejection.FIELD, "missing field 'pid'"),
            (line(pid="42"), Rejection.FIELD, "field 'pid' has the wrong type"),
            (line(pid=True), Rejection.FIELD, "field 'pid' has the wrong type"),
            (line(pid=0), Rejection.PID, "pid must be positive"),
            (line(scope_id=7), Rejection.FIELD, "field 'scope_id' has the wrong type"),
            (line(scope_id="s" * 2000), Rejection.SCOPE_TOO_LONG, "longer than"),
            (line(expiration_time="soon"), Rejection.FIELD, "field 'expiration_time' has the wrong type"),
            (line(expiration_time=float("inf")), Rejection.EXPIRATION, "within a year"),
            (line(expiration_time=10**400), Rejection.EXPIRATION, "within a year"),
            (line(expiration_time=NOW + 400 * 86400), Rejection.EXPIRATION, "within a year"),
            (line(signal=1.5), Rejection.FIELD, "field 'signal' has the wrong type"),
            (line(signal=999), Rejection.SIGNAL, "not a valid signal"),
        ],
    )
    def test_bad_requests_are_rejected_with_a_kind_and_a_reason(self, raw: bytes, kind: Rejection, why: str) -> None:
        """Every kind of malformed line raises RequestError saying what is wrong, with a countable kind."""
        with pytest.raises(RequestError, match=why) as info:
            parse_request(raw, NOW)
        assert info.value.kind is kind


class TestLineSplitter:
    def test_partial_lines_are_buffered_until_newline(self) -> None:
        """A line split over several reads comes out whole, once (with its tail, for resynchronisation)."""
        split = LineSplitter()
        assert split.feed(b"ab") == ([], 0)
        assert split.feed(b"c\nde") == ([Line(b"abc", b"c")], 0)
        assert split.feed(b"f\n\n") == ([Line(b"def", b"f"), Line(b"")], 0)
        assert split.buffered == 0

    def test_line_at_the_limit_is_kept(self) -> None:
        """A line of exactly PIPE_BUF bytes (the client's maximum) is delivered."""
        assert LineSplitter().feed(b"x" * MAX_LINE + b"\n") == ([Line(b"x" * MAX_LINE)], 0)

    def test_oversized_line_in_one_read_is_dropped(self) -> None:
        """An over-long complete line is counted as dropped and the next line survives."""
        assert LineSplitter().feed(b"x" * (MAX_LINE + 1) + b"\nok\n") == ([Line(None, b"x" * MAX_LINE), Line(b"ok")], 1)

    def test_oversized_line_over_many_reads_is_dropped_up_to_its_newline(self) -> None:
        """An over-long line arriving in pieces is dropped once, without buffering it; its end is offered alone."""
        split = LineSplitter(limit=10)
        assert split.feed(b"x" * 8) == ([], 0)
        assert split.feed(b"x" * 8) == ([], 1)
        assert split.buffered == 0
        assert split.feed(b"x" * 100) == ([], 0)
        assert split.feed(b"tail\nok\n") == ([Line(None, b"tail"), Line(b"ok")], 0)

    def test_buffered_part_plus_chunk_over_the_limit_is_dropped_but_offers_the_chunk(self) -> None:
        """A fragment that only overflows once its newline arrives is counted and its chunk still offered."""
        split = LineSplitter(limit=10)
        assert split.feed(b"x" * 8) == ([], 0)
        assert split.feed(b"yyyyy\n") == ([Line(None, b"yyyyy")], 1)


class TestRequestReader:
    def test_fragment_without_newline_does_not_cost_the_next_request(self) -> None:
        """A writer leaves bytes without a newline; the next atomic request is still accepted, the fragment counted."""
        reader = RequestReader()
        assert reader.feed(b'{"version": 1, "pid": 7', NOW) == []
        assert reader.feed(torch_line() + b"\n", NOW) == [TimerRequest(42, "a.py#step", NOW + 1.5, 9)]
        assert reader.rejected == {Rejection.FRAGMENT: 1}

    def test_fragment_and_request_in_one_read_still_give_the_request(self) -> None:
        """A fragment and the next request can arrive in the same read: the request is found at its start."""
        reader = RequestReader()
        raw = b'{"version": 1, "pid": 7' + torch_line() + b"\n" + b"z" * (2 * MAX_LINE) + torch_line(scope="b") + b"\n"
        assert reader.feed(raw, NOW) == [
            TimerRequest(42, "a.py#step", NOW + 1.5, 9),
            TimerRequest(42, "b", NOW + 1.5, 9),
        ]
        assert reader.rejected == {Rejection.FRAGMENT: 1, Rejection.TOO_LONG: 1}

    def test_request_split_over_two_reads_is_one_request(self) -> None:
        """A request split by a read boundary is joined, not counted as a fragment."""
        reader = RequestReader()
        raw = torch_line() + b"\n"
        assert reader.feed(raw[:20], NOW) == []
        assert reader.feed(raw[20:], NOW) == [TimerRequest(42, "a.py#step", NOW + 1.5, 9)]
        assert not reader.rejected

    def test_after_an_over_long_fragment_the_next_request_survives(self) -> None:
        """Over-long garbage without a newline, then a request: the request is parsed, the garbage counted once."""
        reader = RequestReader()
        assert reader.feed(b"z" * (3 * MAX_LINE), NOW) == []
        assert reader.feed(torch_line() + b"\n" + torch_line(scope="b") + b"\n", NOW) == [
            TimerRequest(42, "a.py#step", NOW + 1.5, 9),
            TimerRequest(42, "b", NOW + 1.5, 9),
        ]
        assert reader.rejected == {Rejection.TOO_LONG: 1}
        assert reader.buffered == 0

    def test_bad_lines_are_counted_by_kind_with_the_last_message(self) -> None:
        """Every refused line is one count of its kind; the last message is kept for the summary."""
        reader = RequestReader()
        assert reader.feed(b"junk\n[1]\n" + line(signal=999) + b"\n" + b"x" * 5000 + b"\n", NOW) == []
        assert reader.rejected == {
            Rejection.NOT_JSON: 1, Rejection.NOT_OBJECT: 1, Rejection.SIGNAL: 1, Rejection.TOO_LONG: 1,
        }  # fmt: skip
        assert "not a valid signal" in reader.last_error


# -- fuzzing --------------------------------------------------------------------------------------------

requests = st.builds(
    torch_line,
    pid=st.integers(1, 2**22),
    scope=st.text(max_size=60),
    expiration=st.one_of(st.just(-1.0), st.floats(NOW - 10, NOW + 86400)),
    sig=st.sampled_from([0, -1, int(signal.SIGTERM), int(signal.SIGKILL)]),
)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid request with a few bytes replaced, inserted, deleted, or the line truncated."""
    raw = bytearray(draw(requests))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["replace", "insert", "delete", "truncate"]))
        at = draw(st.integers(0, max(len(raw) - 1, 0)))
        byte = draw(st.integers(0, 255))
        if op == "replace" and raw:
            raw[at] = byte
        elif op == "insert":
            raw.insert(at, byte)
        elif op == "delete" and raw:
            del raw[at]
        else:
            del raw[at:]
    return bytes(raw)


def outcomes(reader: RequestReader, chunks: list[bytes]) -> tuple[list[TimerRequest], int]:
    """Feed every chunk, checking the buffer bound after each; (requests, rejections)."""
    got: list[TimerRequest] = []
    for chunk in chunks:
        got += reader.feed(chunk, NOW)
        assert reader.buffered <= MAX_LINE
    return got, reader.rejected.total()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=3 * MAX_LINE), max_size=12))
def test_arbitrary_bytes_end_as_requests_or_counted_rejections(chunks: list[bytes]) -> None:
    """Any byte stream: no exception, bounded buffer, and every newline-terminated line has an outcome."""
    got, rejected = outcomes(RequestReader(), chunks)
    assert len(got) + rejected >= b"".join(chunks).count(b"\n")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(mutated(), requests), min_size=1, max_size=20), st.data())
def test_mutated_requests_end_as_requests_or_counted_rejections(lines: list[bytes], data: st.DataObject) -> None:
    """Valid and damaged requests cut at arbitrary points: each line is a request or a counted rejection."""
    stream = b"".join(raw + b"\n" for raw in lines)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    got, rejected = outcomes(RequestReader(), chunks)
    assert len(got) + rejected >= len(lines)
    for raw in lines:
        try:
            parse_request(raw, NOW)
        except RequestError:
            continue
        except Exception as exc:  # the parser may only ever refuse with RequestError
            pytest.fail(f"{raw!r} raised {exc!r}")


@settings(max_examples=300, deadline=None)
@given(st.lists(requests, min_size=1, max_size=20), st.data())
def test_valid_requests_survive_any_read_boundaries(lines: list[bytes], data: st.DataObject) -> None:
    """Valid requests split at arbitrary read boundaries all come out, in order, with nothing rejected."""
    stream = b"".join(raw + b"\n" for raw in lines)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    got, rejected = outcomes(RequestReader(), chunks)
    assert got == [parse_request(raw, NOW) for raw in lines]
    assert rejected == 0


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=3 * MAX_LINE), requests, st.booleans())
def test_a_fragment_never_costs_the_next_atomic_request(fragment: bytes, raw: bytes, one_read: bool) -> None:
    """Whatever a broken writer left without a newline, the next whole request is parsed, whether it arrives
    in the same read as the fragment or in the next one."""
    assume(b"\n" not in fragment)
    assume(not fragment.lstrip(b" \t\r").startswith(b"{"))  # only then could fragment+request be one object
    chunks = [fragment + raw + b"\n"] if one_read else [fragment, raw + b"\n"]
    got, _ = outcomes(RequestReader(), chunks)
    assert got == [parse_request(raw, NOW)]
