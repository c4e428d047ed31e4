"""Fuzzing the spec loader: arbitrary bytes, mutated valid specs and random spec-shaped documents each end in a
JobSpec or a SpecError (nothing else escapes), every problem located and worded, and never a hang.

A hang is caught with signal.alarm (HANG_S, far above the real cost: this detects hangs, it is no timing target).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.config.loader import load_document
from runner.config.source_file import decode
from runner.config.spec import JobSpec
from runner.errors import SpecError

ROOT = Path(__file__).resolve().parents[2]
SEEDS = [p.read_text() for p in sorted([*ROOT.glob("examples/jobs/*.yaml"), *ROOT.glob("tests/fixtures/specs/*.yaml")])]
HANG_S = 5
ENVIRON = {"DATA_DIR": "/data", "RUNNER_ETCD_ENDPOINTS": "127.0.0.1:2379", "EMPTY": ""}
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Pieces of YAML (and of our own syntax) that reach the parser's and loader's corners.
TOKENS = ["&a ", "*a", "<<: *a", "<<: [*a, *a]", "!!int ", "!!binary ", "!!set ", "!x ", "! ", "? ", "- ", ": ",
          "[", "]", "{", "}", ",", "'", '"', "\\0", "\x00", "\t", "\ufeff", "\n", "\n  ", "#", "---\n", "...\n",
          "${X}", "${X:-2}", "$${", "${", ".inf", ".nan", "1e+999", "99999999999999999999", "0x1F", "1:4", "~",
          "null", "yes", "on", "{rank[0]}", "{node:d}", "2020-01-01", "|\n  ", ">-\n  ", "%YAML 1.1\n"]


@contextmanager
def hang_alarm() -> Iterator[None]:
    def expired(signum: int, frame: FrameType | None) -> None:
        raise AssertionError(f"the loader ran for more than {HANG_S} s: a hang")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(HANG_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def load_or_refuse(text: str) -> JobSpec | SpecError:
    """The loader's verdict; anything but JobSpec or SpecError fails the test (pytest shows the traceback)."""
    with hang_alarm():
        try:
            return load_document(text, source="fuzz.yaml", base_dir=ROOT / "examples" / "jobs", environ=ENVIRON)[0]
        except SpecError as err:
            return err


def check(verdict: JobSpec | SpecError) -> None:
    if isinstance(verdict, JobSpec):
        assert verdict.name and verdict.nproc_per_node >= 1
        return
    assert verdict.problems, "a SpecError must say what is wrong"
    for problem in verdict.problems:
        assert problem.message
        assert problem.render("fuzz.yaml").startswith("fuzz.yaml")
        assert len(problem.message) < 2000  # values are cut in messages, never pasted whole


@FUZZ
@given(st.binary(max_size=2000))
def test_arbitrary_bytes(data: bytes) -> None:
    try:
        text = decode("fuzz.yaml", data)
    except SpecError as err:
        check(err)
        return
    check(load_or_refuse(text))


@st.composite
def mutated(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(text)))
        action = draw(st.sampled_from(["insert", "delete", "duplicate", "text"]))
        if action == "insert":
            text = text[:at] + draw(st.sampled_from(TOKENS)) + text[at:]
        elif action == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 20)):]
        elif action == "duplicate":
            lines = text.splitlines(keepends=True)
            i = draw(st.integers(0, max(0, len(lines) - 1)))
            text = "".join(lines[: i + 1] + lines[i:])
        else:
            text = text[:at] + draw(st.text(max_size=8)) + text[at:]
    return text


@FUZZ
@given(mutated())
def test_mutated_valid_specs(text: str) -> None:
    check(load_or_refuse(text))


FIELDS = ["name", "entrypoint", "env", "cwd", "nodes", "nproc_per_node", "rendezvous", "restart", "shutdown", "logs",
          "watchdog", "metrics", "cluster", "version", "script", "module", "command", "args", "python", "backend",
          "endpoints", "lease_ttl", "join_timeout", "backoff", "initial", "max", "min", "multiplier", "jitter",
          "signal", "signals_to_handle", "grace_period", "prefix", "dir", "enabled", "port", "slurm", "time_limit"]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=12),
                    st.sampled_from(["30s", "1h30m", "1:4", "SIGTERM", "etcd", "local", "train.py", "{rank}",
                                     "127.0.0.1:2379", "${X:-3}", "-1", "0"]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.sampled_from(FIELDS), inner, max_size=5), max_leaves=20)


@FUZZ
@given(st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=8), st.booleans())
def test_random_spec_shaped_documents(data: dict[str, object], complete: bool) -> None:
    if complete:
        data = {"name": "job", "entrypoint": "hello.py", **data}
    text = yaml.safe_dump(data, allow_unicode=True)
    check(load_or_refuse(text))
