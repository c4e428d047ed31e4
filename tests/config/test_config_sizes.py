"""Sizes (runner/config/sizes.py): the parser, its schema pattern, and the short form the reasons use."""

from __future__ import annotations

import decimal
import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.config.limits import MAX_INT
from runner.config.sizes import SIZE_PATTERN, format_size, parse_size

SCHEMA = json.loads((Path(__file__).parents[2] / "runner" / "job.schema.json").read_text())
SCHEMA_PATTERN = SCHEMA["$defs"]["size"]["anyOf"][1]["pattern"]
FACTORS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "ki": 1024, "kib": 1024,
    "m": 1000**2, "mb": 1000**2, "mi": 1024**2, "mib": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gi": 1024**3, "gib": 1024**3,
    "t": 1000**4, "tb": 1000**4, "ti": 1024**4, "tib": 1024**4,
    "p": 1000**5, "pb": 1000**5, "pi": 1024**5, "pib": 1024**5,
}  # fmt: skip


def test_the_schema_holds_the_parsers_pattern() -> None:
    """One pattern: the schema's is the module's."""
    assert SCHEMA_PATTERN == SIZE_PATTERN


@pytest.mark.parametrize(
    ("text", "size"),
    [("1GiB", 1 << 30), ("1.5G", 1_500_000_000), ("100MB", 100_000_000), ("4096", 4096), (" 2 kib ", 2048),
     ("0.3kB", 300), (".5Ki", 512), ("1b", 1), ("512Mi", 512 << 20), ("1.", 1), ("0", 0), ("7PiB", 7 << 50),
     ("1.9B", 1), ("0.0000001KiB", 0)],
)
def test_good_sizes(text: str, size: int) -> None:
    """Units of 1000 and 1024, any case, spaces around; rounded down to a whole byte."""
    assert parse_size(text) == size
    assert re.search(SIZE_PATTERN, text)


@pytest.mark.parametrize("text", ["", "GiB", "1e3", "-1", "1 GiBs", "1Gb/s", "1.2.3", "1 0", "1KK", "1iB", "ten"])
def test_bad_sizes(text: str) -> None:
    """What the pattern refuses, the parser refuses, with the value in the message."""
    assert not re.search(SIZE_PATTERN, text)
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


@pytest.mark.parametrize("value", [True, None, [1], -1, 1.5, float("nan"), float("inf"), MAX_INT + 1, "9999999PiB"])
def test_bad_values(value: object) -> None:
    """Booleans, non-scalars, negatives, fractions of a byte as numbers, and more than 64 bits are refused."""
    with pytest.raises(ValueError, match=r"size|bytes"):
        parse_size(value)  # type: ignore[arg-type]


def test_numbers_are_bytes() -> None:
    """A YAML number is bytes; a float that is a whole number too (JSON Schema calls 2.0 an integer)."""
    assert parse_size(1024) == 1024
    assert parse_size(2.0) == 2
    assert parse_size(MAX_INT) == MAX_INT


@given(st.text(alphabet=" \t0123456789.bBkKmMgGtTpPiIeE-x", max_size=14) | st.text(max_size=10))
def test_pattern_and_parser_agree_on_any_text(text: str) -> None:
    """Whatever the schema accepts, the parser reads (or says it is too large); whatever it refuses, so does the parser."""
    accepted = re.search(SIZE_PATTERN, text) is not None
    try:
        parse_size(text)
    except ValueError as e:
        assert not accepted or "larger than" in str(e)
    else:
        assert accepted


@given(st.integers(0, MAX_INT), st.sampled_from(["", "B", "b", " B"]))
def test_whole_bytes_round_trip(size: int, unit: str) -> None:
    """Any 64-bit byte count, written with or without B, reads back exactly."""
    assert parse_size(f"{size}{unit}") == size


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.sampled_from(sorted(FACTORS)), st.booleans(),
       st.sampled_from(["", " "]))
def test_decimal_sizes_are_exact(whole: int, fraction: int, unit: str, upper: bool, space: str) -> None:
    """N.F UNIT is floor(N.F * factor), computed exactly (no float rounding), in any case."""
    text = f"{whole}.{fraction}{space}{unit.upper() if upper else unit}"
    expected = int((decimal.Decimal(f"{whole}.{fraction}") * FACTORS[unit]).to_integral_value(decimal.ROUND_FLOOR))
    if expected > MAX_INT:
        with pytest.raises(ValueError, match="larger than"):
            parse_size(text)
    else:
        assert parse_size(text) == expected


@given(st.integers(0, MAX_INT))
def test_format_size_reads_back_close(size: int) -> None:
    """The short form is a size string, within 0.5% of the size (a 64-bit size may round up past 64 bits)."""
    text = format_size(size)
    assert re.search(SIZE_PATTERN, text)
    number, unit = re.fullmatch(r"([0-9.]+)([A-Za-z]+)", text).groups()  # type: ignore[union-attr]
    shown = decimal.Decimal(number) * FACTORS[unit.lower()]
    assert abs(shown - size) <= max(1, size * decimal.Decimal("0.005"))


@pytest.mark.parametrize(("size", "text"), [(0, "0B"), (1023, "1023B"), (1024, "1KiB"), (1536, "1.5KiB"),
                                            (1 << 30, "1GiB"), (10**12, "931GiB"), (5 * (1 << 50), "5PiB"),
                                            (150 << 40, "150TiB"), (100 << 20, "100MiB")])
def test_format_size(size: int, text: str) -> None:
    """Powers of 1024, about three digits."""
    assert format_size(size) == text
