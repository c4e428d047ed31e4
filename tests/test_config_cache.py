"""The validation cache: off by default (nothing written anywhere), explicit with RUNNER_CACHE_DIR, keyed on the
exact typed content so that two specs that print alike never share a verdict, and only trusted in a private folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from runner.config import valid_cache

ROOT = Path(__file__).resolve().parents[1]
HELLO = ROOT / "examples" / "jobs" / "hello.yaml"
# Loads a spec in a fresh interpreter and says whether jsonschema had to be imported (i.e. the cache missed).
PROBE = ("import sys; from runner.config import load_spec; load_spec(sys.argv[1]); "
         "print('validated' if 'jsonschema' in sys.modules else 'cached')")


def fresh_load(spec: Path, home: Path, cache: Path | None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in (valid_cache.ENV, "XDG_CACHE_HOME")}
    env["HOME"] = str(home)
    if cache is not None:
        env[valid_cache.ENV] = str(cache)
    result = subprocess.run([sys.executable, "-c", PROBE, str(spec)], capture_output=True, text=True, env=env,
                            cwd=ROOT, timeout=120, check=True)
    return result.stdout.strip()


def test_validating_writes_nothing_unless_asked(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    assert fresh_load(HELLO, home, None) == "validated"
    assert fresh_load(HELLO, home, None) == "validated"
    assert list(home.rglob("*")) == []


def test_with_a_cache_dir_a_second_load_skips_jsonschema(tmp_path: Path) -> None:
    home, cache = tmp_path / "home", tmp_path / "cache"
    home.mkdir()
    assert fresh_load(HELLO, home, cache) == "validated"
    assert len(list(cache.iterdir())) == 1
    assert fresh_load(HELLO, home, cache) == "cached"
    assert list(home.rglob("*")) == []


def test_a_spec_that_prints_like_a_cached_one_is_still_validated(tmp_path: Path) -> None:
    home, cache = tmp_path / "home", tmp_path / "cache"
    home.mkdir()
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("name: job\nentrypoint: hello.py\nrestart: {max_restarts: 2}\n")
    bad.write_text("name: job\nentrypoint: hello.py\nrestart: {max_restarts: '2'}\n")  # the same when printed
    assert fresh_load(good, home, cache) == "validated"
    env = dict(os.environ, HOME=str(home), **{valid_cache.ENV: str(cache)})
    result = subprocess.run([sys.executable, "-m", "runner", "validate", str(bad)], capture_output=True, text=True,
                            env=env, timeout=120, check=False)
    assert result.returncode == 2 and "expected an integer, found the string '2'" in result.stderr


def test_a_shared_or_foreign_cache_folder_is_not_trusted(tmp_path: Path, monkeypatch: Any) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv(valid_cache.ENV, str(cache))
    key = valid_cache.key("schema", {"a": 1})
    valid_cache.remember(key)
    assert valid_cache.seen(key)
    cache.chmod(0o777)  # anyone could plant a marker
    assert not valid_cache.seen(key)
    cache.chmod(0o700)
    (cache / str(key)).unlink()
    (cache / str(key)).symlink_to(tmp_path)  # a marker must be a regular file
    assert not valid_cache.seen(key)


def test_without_a_cache_dir_nothing_is_seen_or_written(monkeypatch: Any) -> None:
    monkeypatch.delenv(valid_cache.ENV, raising=False)
    key = valid_cache.key("schema", {"a": 1})
    valid_cache.remember(key)
    assert valid_cache.folder() is None and not valid_cache.seen(key)


def test_only_plain_spec_data_has_a_key() -> None:
    assert valid_cache.key("s", {"a": b"bytes"}) is None
    assert valid_cache.key("s", {1: "int key"}) is None
    assert valid_cache.key("s", {"a": (1, 2)}) is None


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8))
DATA = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                                         max_size=4), max_leaves=12)


def typed(value: Any) -> Any:
    """A form in which equal means 'the same typed content, in the same order' (1, 1.0 and True differ)."""
    if isinstance(value, dict):
        return ("dict", tuple((k, typed(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("list", tuple(typed(v) for v in value))
    return (type(value).__name__, value.hex() if isinstance(value, float) else value)


@settings(max_examples=300, deadline=None)
@given(DATA, DATA)
def test_keys_are_equal_exactly_when_the_typed_content_is(a: Any, b: Any) -> None:
    assert (valid_cache.key("schema", a) == valid_cache.key("schema", b)) == (typed(a) == typed(b))


def test_values_that_print_alike_have_different_keys() -> None:
    alike = [1, 1.0, "1", True, [1], {"1": None}, "s1:1", None, "null", "None"]
    keys = [valid_cache.key("schema", {"v": value}) for value in alike]
    assert len(set(keys)) == len(alike)
