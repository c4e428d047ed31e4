"""What a failed worker left, read as text.

Its last traceback (the exception, where it was raised, its fingerprint), torch's error file, its stderr's tail, and
the words that say it died of another's failure (the collateral rule) or of a collective's timeout or mismatch. Text
in, text out: no record, no process.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

from runner.hangs import mismatch_words

TAIL_LINES = 20
_TRACEBACK = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<func>.*)$')
RANK_PREFIX = re.compile(r"^\[(?:default)?rank\d+\]:\s?")  # torch's excepthook marks each line `[rank1]: `
LIBRARY = re.compile(r"/(?:site|dist)-packages/|/lib/python3\.\d+/")  # a frame of a library, not the user's code
EXCEPTION_CHARS = 200  # of an exception line in a reason (gloo's run long)
# What a rank prints when another one died first: its peer's socket closed, its store gone, its communicator aborted
# (gloo's, c10d's and NCCL's words in torch 2.13). Such a failure is collateral: the root cause is elsewhere.
COLLATERAL = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|DistNetworkError|recvValue|failed to recv"
    r"|NCCL communicator was aborted|ProcessGroupNCCL.*(?:[Aa]bort|[Tt]erminat)|Socket Timeout|connect\(\) failed"
)
_VARIES = re.compile(r"0x[0-9a-fA-F]+|\d+")  # addresses and numbers: differ from one attempt to the next
# A worker that gave up waiting in a collective: gloo's transport, NCCL's watchdog, c10d's wait (torch 2.13 words)
COLLECTIVE_TIMEOUT = re.compile(
    r"Timed out waiting \d+ms for \w+ operation|Watchdog caught collective operation timeout"
    r"|[Cc]ollective operation timeout|wait timeout after \d+ ?ms|DistBackendError.*[Tt]imed out"
)
# A worker that died of a collective mismatch: gloo's words (a receiver got more than its call expected), c10d's
# (TORCH_DISTRIBUTED_DEBUG=DETAIL's collective fingerprints), NCCL's (torch 2.13 words; NCCL's not tried: no GPU)
COLLECTIVE_MISMATCH = re.compile(
    r"Is there a distributed collective mismatch|Received data size doesn't match expected size"
    r"|[Dd]etected mismatch between collectives|[Cc]ollective (?:operation )?mismatch|[Mm]ismatched collective"
)


def traceback_parts(text: str) -> tuple[str, str] | None:
    """(exception line, innermost frame "file:function") of the last Python traceback in `text`, or None."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == _TRACEBACK]
    if not starts:
        return None
    frame, exc = "", ""
    for line in lines[starts[-1] + 1 :]:
        m = _FRAME.match(line)
        if m:
            frame = f"{m['file']}:{m['func'].strip()}"
        elif line and not line[0].isspace():
            exc = line.strip()
            break
    return (exc, frame) if exc else None


def exception_line(text: str) -> str:
    """`ValueError: bad batch (train.py:42)`: the last traceback's exception and where it was raised, or ''.

    The place is the innermost frame of the user's code (outside the interpreter's and the installed libraries'
    folders), else the innermost frame; torch's `[rank1]: ` marks are read through.
    """
    lines = [RANK_PREFIX.sub("", line) for line in text.splitlines()]
    starts = [i for i, line in enumerate(lines) if line.strip() == _TRACEBACK]
    if not starts:
        return ""
    frames: list[tuple[str, str]] = []
    exc = ""
    for line in lines[starts[-1] + 1 :]:
        m = _FRAME.match(line)
        if m:
            frames.append((m["file"], m["line"]))
        elif line and not line[0].isspace():
            exc = line.strip()
            break
    if not exc:
        return ""
    if len(exc) > EXCEPTION_CHARS:
        exc = exc[: EXCEPTION_CHARS - 3] + "..."
    own = [f for f in frames if not LIBRARY.search(f[0])] or frames
    return f"{exc} ({Path(own[-1][0]).name}:{own[-1][1]})" if own else exc


def collateral(text: str) -> bool:
    """Whether the last exception in a worker's output says a peer died first (a closed connection, a lost store)."""
    return bool(COLLATERAL.search(exception_line(text)))


def fingerprint(traceback: str, error: str = "") -> str:
    """The normalised identity of the exception `traceback` shows ("" without one).

    `error` (torch's error file message) stands in for a missing exception line.
    """
    parts = traceback_parts(traceback)
    if parts is None:
        return ""
    exc, frame = parts
    return f"{_VARIES.sub('N', exc or error)} @ {frame}"  # the frame's path as it is: /data2 is not /data3


def signal_name(exit_code: int) -> str | None:
    """'SIGKILL' for -9, None for a normal exit."""
    if exit_code >= 0:
        return None
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


def read_error_file(path: Path) -> tuple[str, str]:
    """(message, traceback) from torch's TORCHELASTIC_ERROR_FILE; empty strings when absent or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
        msg = data["message"]
    except (OSError, ValueError, KeyError, TypeError):
        return "", ""
    if isinstance(msg, str):
        return msg.strip().splitlines()[-1] if msg.strip() else "", ""
    text = str(msg.get("message", ""))
    tb = str(msg.get("extraInfo", {}).get("py_callstack", ""))
    first = text.strip().splitlines()[-1] if text.strip() else ""
    return first, tb


def last_lines(text: str, lines: int = TAIL_LINES) -> str:
    """The last `lines` lines of `text`."""
    return "\n".join(text.splitlines()[-lines:])


def tail(path: Path, lines: int = TAIL_LINES, max_bytes: int = 16384) -> str:
    """The last `lines` lines of a file (reads at most `max_bytes` from its end)."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return ""
    return last_lines(data.decode(errors="replace"), lines)


def mismatch_line(text: str) -> str:
    """The line of `text` that says a collective mismatch, short (runner.hangs.mismatch_words); "" for none."""
    for line in text.splitlines():
        if COLLECTIVE_MISMATCH.search(line):
            return mismatch_words(line)
    return ""
