"""The suite's one way to skip, and why CI cannot skip its way to green (issue 39, point 3).

A test that cannot run here because the machine lacks something (root, network namespaces for simulated hosts,
slurmd/slurmctld, chromium, a writable cgroup, py-spy, a tmpfs mount, the etcd binary, torchft...) calls
`need(why_not)` (or is marked `needs(why_not)`), where `why_not` is None when the machine has it and else the
reason. Outside CI that is an ordinary skip, with its reason (pyproject.toml's `-rs` prints every one). Under
`CI=true` (.ci/run sets it) it is a failure: CI is a known machine (root, apt's slurm-wlm, munge, openssl and
chromium, the `test` extra's etcd, py-spy and torchft), so a skip there is a promise the suite did not keep.

The only skips CI may hit are those in ALLOWED, each with the reason CI may legitimately hit it; a test names its
entry with `need(why_not, allow=KEY)`. tests/conftest.py's pytest_runtest_makereport hook turns every other skip
under CI=true into a failure too (a raw pytest.skip, a skipif mark, importorskip), and tests/house/test_ci_skips.py checks
that every skip in tests/ goes through here and that every ALLOWED entry is used.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

# The skips CI may hit, by key: each with why it is legitimate there. Keep it short; a new entry needs a reason that
# holds on the CI machine (root, the apt packages of .ci/run, the `test` extra).
ALLOWED: dict[str, str] = {
    "root-writes-read-only": (
        "CI runs as root, and root writes into a read-only directory anyway: tests/states/test_states.py's read-only run dir "
        "cannot be made there. As root the same fallback (the report written elsewhere) is covered on a full tmpfs: "
        "tests/agent/test_faults_agent.py and tests/system/test_full_disk.py"
    ),
}

FIX = "tests/ci_skips.py"


def on_ci() -> bool:
    """True under CI=true (also 1 or yes): skips of what CI provides fail."""
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


ALLOWED_MARK = "ci_allowed"  # set on the skip exception of an ALLOWED skip: the hook leaves it a skip


def ci_failure(why: str) -> str:
    """The message of a skip turned into a failure under CI=true."""
    return (f"skipped under CI=true, where the machine must provide this: {why}\n"
            f"Fix CI's machine (.ci/run), or, if CI may legitimately skip it, add an entry with the reason to "
            f"ALLOWED in {FIX} and pass allow=KEY to need()")


def need(why_not: str | None, allow: str | None = None) -> None:
    """Go on when `why_not` is None; else skip with it as the reason, or, under CI=true, fail (unless `allow` names
    an ALLOWED entry: then skip there too)."""
    __tracebackhide__ = True  # the skip's location is the caller's
    if why_not is None:
        return
    if allow is not None:
        if allow not in ALLOWED:
            pytest.fail(f"need(allow={allow!r}): no such entry in {FIX}'s ALLOWED")
        skip = pytest.skip.Exception(f"{why_not} (CI may skip this too: {ALLOWED[allow]})")
        setattr(skip, ALLOWED_MARK, allow)
        raise skip
    if on_ci():
        pytest.fail(ci_failure(why_not), pytrace=False)
    pytest.skip(why_not)


def needs(why_not: str | None) -> pytest.MarkDecorator:
    """need() as a mark, for a whole test, class or module: a skipif mark with `why_not` as the reason (under CI=true,
    the hook in tests/conftest.py fails it)."""
    return pytest.mark.skipif(why_not is not None, reason=why_not or "")


def verdict_under_ci(report: pytest.TestReport, call: pytest.CallInfo[Any]) -> pytest.TestReport:
    """Under CI=true, a skipped test whose skip is not an ALLOWED one becomes a failure (every skip, however it was
    made: need(), a skipif mark, a raw pytest.skip, importorskip). xfail is left alone."""
    if not on_ci() or not report.skipped or hasattr(report, "wasxfail"):
        return report
    if call.excinfo is not None and getattr(call.excinfo.value, ALLOWED_MARK, None) in ALLOWED:
        return report
    if isinstance(report.longrepr, tuple):  # (path, line, "Skipped: reason")
        path, line, text = report.longrepr
        why = f"{text.removeprefix('Skipped: ')} ({path}:{line})"
    else:
        why = str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = ci_failure(why)
    return report
