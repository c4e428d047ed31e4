"""runner.system.private_files: the run dir is 0700 and the agent's files 0600 whatever the umask; writes are atomic."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.system.private_files import open_private_append, private_dir, write_private


def mode(path: Path) -> int:
    """The permission bits of `path`."""
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(params=[0o022, 0o002, 0o000, 0o077])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """Run the test under this umask (restored after)."""
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def test_private_dir_is_0700_and_narrows_an_existing_one(tmp_path: Path, umask: int) -> None:
    """A new folder (with missing parents) is 0700; an existing 0755 one is narrowed to 0700."""
    new = private_dir(tmp_path / "a" / "b" / "run")
    assert new.is_dir() and mode(new) == 0o700
    old = tmp_path / "old"
    old.mkdir(mode=0o755)
    old.chmod(0o755)
    assert mode(private_dir(old)) == 0o700


def test_write_private_is_0600_and_replaces_atomically(tmp_path: Path, umask: int) -> None:
    """A new file is 0600; an existing 0644 one is replaced by a 0600 one; no temporary file is left."""
    path = tmp_path / "status.json"
    write_private(path, "one")
    assert path.read_text() == "one" and mode(path) == 0o600
    path.chmod(0o644)
    inode = path.stat().st_ino
    write_private(path, "two")
    assert path.read_text() == "two" and mode(path) == 0o600
    assert path.stat().st_ino != inode  # a rename, not a rewrite in place: readers never see half a file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]


def test_write_private_leaves_nothing_when_it_fails(tmp_path: Path) -> None:
    """A write that fails midway (text that cannot be encoded) leaves the old file and no temporary file."""
    path = tmp_path / "report.json"
    write_private(path, "old")
    with pytest.raises(UnicodeEncodeError):
        write_private(path, "bad \udcff surrogate")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
    with pytest.raises(FileNotFoundError):
        write_private(tmp_path / "missing" / "x.json", "x")


def test_open_private_append_creates_0600_and_narrows(tmp_path: Path, umask: int) -> None:
    """agent.jsonl / transitions.jsonl: created 0600, appended to, an existing 0644 file narrowed to 0600."""
    path = tmp_path / "agent.jsonl"
    with open_private_append(path) as f:
        f.write("a\n")
    assert mode(path) == 0o600
    path.chmod(0o644)
    with open_private_append(path) as f:
        f.write("b\n")
    assert path.read_text() == "a\nb\n" and mode(path) == 0o600
