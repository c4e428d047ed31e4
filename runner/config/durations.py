"""Durations: a number of seconds, or a string such as "500ms", "30s", "5m", "1h", "1h30m", "2d"."""

from __future__ import annotations

import math
import re

from runner.config.limits import MAX_DURATION_S

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_PART = re.compile(rf"\s*({_NUMBER})\s*(ms|s|m|h|d)\s*")
_BARE = re.compile(rf"\s*{_NUMBER}\s*")
HINT = "write seconds as a number, or a string such as 500ms, 30s, 5m, 1h, 1h30m"


def parse_duration(value: float | str) -> float:
    """Seconds as a float; ValueError (with a readable message) if `value` is not a duration >= 0."""
    if isinstance(value, bool):
        raise ValueError(f"{_shown(value)} is not a duration")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _parse_text(value)
    else:
        raise ValueError(f"{_shown(value)} is not a duration")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{_shown(value)} is not a finite duration >= 0")
    if seconds > MAX_DURATION_S:
        raise ValueError(f"{_shown(value)} is longer than {MAX_DURATION_S:.0e} s (etcd's and Python's clocks' limit)")
    return seconds


def _shown(value: float | str) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _parse_text(text: str) -> float:
    if _BARE.fullmatch(text):
        return float(text)
    pos, total = 0, 0.0
    while pos < len(text):
        match = _PART.match(text, pos)
        if match is None or match.end() == pos:
            raise ValueError(f"{_shown(text)} is not a duration")
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos == 0:
        raise ValueError(f"{_shown(text)} is not a duration")
    return total


def format_duration(seconds: float) -> str:
    """Short human form: 0.5 -> '500ms', 90 -> '1m30s', 3600 -> '1h'."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    out = ""
    rest = seconds
    for unit in ("d", "h", "m"):
        whole = int(rest // _UNITS[unit])
        if whole:
            out += f"{whole}{unit}"
            rest -= whole * _UNITS[unit]
    if rest or not out:
        out += f"{rest:g}s"
    return out
