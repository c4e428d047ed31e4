"""Parsers of kernel text: /proc/<pid>/stat (a comm may hold anything) and the cgroup v2 mount of this process."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.system.cgroup import own_cgroup_dir
from runner.system.procs import parse_stat

TAIL = "S 1 2 3 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 100"


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0\n"), max_size=15),
       st.integers(1, 2**22))
def test_stat_comm_with_spaces_and_parentheses(comm: str, pid: int) -> None:
    """Whatever the command name holds, pid, state, ppid, pgid, sid and start time are read right."""
    s = parse_stat(f"{pid} ({comm}) {TAIL}")
    assert (s.pid, s.comm, s.state, s.ppid, s.pgid, s.sid, s.start_time) == (pid, comm, "S", 1, 2, 3, 98765)


@given(st.text(max_size=200))
def test_stat_garbage_is_a_value_error(text: str) -> None:
    """Anything else raises ValueError, never something unexpected."""
    try:
        parse_stat(text)
    except ValueError:
        pass


HYBRID = """\
35 24 0:30 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
UNIFIED = "30 24 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
NAMESPACED = "30 24 0:26 /system.slice/docker-1.scope /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"


@pytest.mark.parametrize(("mountinfo", "cgroup", "expected"), [
    (HYBRID, "0::/\n4:memory:/x\n", "/sys/fs/cgroup/unified"),
    (UNIFIED, "0::/user.slice/session-1.scope\n", "/sys/fs/cgroup/user.slice/session-1.scope"),
    (NAMESPACED, "0::/system.slice/docker-1.scope/app\n", "/sys/fs/cgroup/app"),
    ("35 24 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n", "4:memory:/\n", None),
    (UNIFIED, "0::/gone (deleted)\n", None),
])
def test_own_cgroup_dir(mountinfo: str, cgroup: str, expected: str | None) -> None:
    """Pure v2, hybrid (v2 at .../unified), a namespaced mount root, v1 only (None), a deleted cgroup (None)."""
    got = own_cgroup_dir(mountinfo, cgroup)
    assert got == (Path(expected) if expected else None)


@given(st.text(max_size=300), st.text(max_size=100))
def test_own_cgroup_dir_never_fails(mountinfo: str, cgroup: str) -> None:
    """Any text gives a Path or None."""
    assert own_cgroup_dir(mountinfo, cgroup) is None or isinstance(own_cgroup_dir(mountinfo, cgroup), Path)
