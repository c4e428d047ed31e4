"""Sizes in bytes: a number of bytes, or a string such as "512MiB", "1GiB", "1.5G", "100MB", "4096".

Units (case does not matter, and a `b` is always bytes, never bits):
- KiB, MiB, GiB, TiB, PiB (also written Ki, Mi, Gi, Ti, Pi, as Kubernetes does): powers of 1024;
- kB, MB, GB, TB, PB (also k, M, G, T, P): powers of 1000;
- B, or no unit: bytes.

The value is exact (decimal arithmetic, rounded down to a whole byte) and at most MAX_INT (it fits in 64 bits).
SIZE_PATTERN is the schema's pattern (runner/job.schema.json `$defs/size`): a string it accepts is one this parser
reads, unless the value is too large (tests/config/test_config_sizes.py checks both on generated text).
"""

from __future__ import annotations

import re

from runner.config.limits import MAX_INT

_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_UNIT = r"(?:[bB]|[kKmMgGtTpP][iI]?[bB]?)"
SIZE_PATTERN = rf"^\s*{_NUMBER}\s*{_UNIT}?\s*$"
_SIZE = re.compile(rf"\s*({_NUMBER})\s*({_UNIT})?\s*")
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
HINT = "write bytes as a number, or a string such as 512MiB, 1GiB, 100MB"


def parse_size(value: float | str) -> int:
    """Bytes as an int; ValueError (with a readable message) if `value` is not a size from 0 to MAX_INT bytes."""
    if isinstance(value, bool):
        raise ValueError(f"{_shown(value)} is not a size")
    if isinstance(value, int):
        size = value
    elif isinstance(value, float):
        if not value.is_integer():  # also refuses nan and inf
            raise ValueError(f"{_shown(value)} is not a whole number of bytes")
        size = int(value)
    elif isinstance(value, str):
        size = _parse_text(value)
    else:
        raise ValueError(f"{_shown(value)} is not a size")
    if size < 0:
        raise ValueError(f"{_shown(value)} is not a size >= 0")
    if size > MAX_INT:
        raise ValueError(f"{_shown(value)} is larger than {MAX_INT} bytes (8 EiB)")
    return size


def _parse_text(text: str) -> int:
    import decimal  # only a size written as a string needs it (every spec load would pay its import otherwise)

    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"{_shown(text)} is not a size")
    number, unit = match.group(1), (match.group(2) or "").lower()
    power = _POWERS[unit[:1] if unit != "b" else ""]
    base = 1024 if "i" in unit else 1000
    # Exact: enough digits for the number's own and the factor's (at most 1024**5, 16 digits).
    with decimal.localcontext(decimal.Context(prec=len(number) + 20, Emax=decimal.MAX_EMAX)):
        scaled = (decimal.Decimal(number) * (base**power)).to_integral_value(rounding=decimal.ROUND_FLOOR)
        if scaled > MAX_INT:
            raise ValueError(f"{_shown(text)} is larger than {MAX_INT} bytes (8 EiB)")
        return int(scaled)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def format_size(size: int) -> str:
    """Short human form in powers of 1024: 512 -> '512B', 1536 -> '1.5KiB', 2**30 -> '1GiB' (about 3 digits)."""
    if size < 1024:
        return f"{size}B"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024 or unit == "PiB":
            break
    digits = 0 if value >= 100 else 1 if value >= 10 else 2
    text = f"{value:.{digits}f}"
    return (text.rstrip("0").rstrip(".") if "." in text else text) + unit
