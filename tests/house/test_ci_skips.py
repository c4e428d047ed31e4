"""CI cannot skip its way to green (tests/ci_skips.py): under CI=true a skip is a failure unless ALLOWED lists it.

A tiny suite, run by a real pytest in a subprocess with tests/conftest.py as its plugin (the hook the suite runs under),
skips in each way a test can (need() in the test and in a fixture, a needs() mark, a raw pytest.skip, a skipif mark,
importorskip, an allowed need()) and xfails once: with CI unset every skip is a skip; with CI=true each is a failure
but the allowed one, and the xfail stays an xfail. The registry: every skip in tests/ goes through tests/ci_skips.py,
and every ALLOWED entry is used and says why.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from ci_skips import ALLOWED, on_ci
from conftest import ROOT

TESTS = ROOT / "tests"
ALLOWED_KEY = next(iter(ALLOWED))

TINY = textwrap.dedent(f"""\
    import pytest
    from ci_skips import need, needs

    @pytest.fixture
    def missing_thing():
        need("no thing here (a fixture)")

    def test_need_in_the_test():
        need("no slurmd here")

    def test_need_in_a_fixture(missing_thing):
        pass

    @needs("no chromium here")
    def test_needs_mark():
        pass

    def test_raw_skip():
        pytest.skip("a raw skip")

    @pytest.mark.skipif(True, reason="a raw skipif mark")
    def test_raw_skipif():
        pass

    def test_importorskip():
        pytest.importorskip("no_such_module_anywhere")

    def test_allowed():
        need("the machine is as CI's is", allow={ALLOWED_KEY!r})

    def test_nothing_missing():
        need(None)

    def test_xfail():
        pytest.xfail("a known bug")
    """)


def outcomes(tmp_path: Path, ci: str | None) -> dict[str, str]:
    """Run TINY under a real pytest with tests/conftest.py as a plugin; each test's outcome from its JUnit XML."""
    (tmp_path / "test_tiny.py").write_text(TINY)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(TESTS)])
    xml = tmp_path / "junit.xml"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider", "-rs",
                           f"--junitxml={xml}", "test_tiny.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert xml.exists(), done.stdout + done.stderr
    found = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in {"skipped", "failure", "error"}]
        skipped = case.find("skipped")
        if skipped is not None and skipped.get("type") == "pytest.xfail":
            kinds = ["xfailed"]
        found[case.get("name", "")] = {"failure": "failed", "error": "failed"}.get(kinds[0], kinds[0]) if kinds \
            else "passed"
    found["output"] = done.stdout
    return found


def test_without_ci_every_skip_is_a_skip_with_its_reason(tmp_path: Path) -> None:
    got = outcomes(tmp_path, None)
    out = got.pop("output")
    assert got == {"test_need_in_the_test": "skipped", "test_need_in_a_fixture": "skipped",
                   "test_needs_mark": "skipped", "test_raw_skip": "skipped", "test_raw_skipif": "skipped",
                   "test_importorskip": "skipped", "test_allowed": "skipped", "test_nothing_missing": "passed",
                   "test_xfail": "xfailed"}, out
    assert "SKIPPED [1] test_tiny.py:9: no slurmd here" in out  # -rs: the reason, at the caller's line
    assert "no thing here (a fixture)" in out


@pytest.mark.parametrize("ci", ["true", "1"])
def test_under_ci_a_skip_fails_unless_it_is_allowed(tmp_path: Path, ci: str) -> None:
    got = outcomes(tmp_path, ci)
    out = got.pop("output")
    assert got == {"test_need_in_the_test": "failed", "test_need_in_a_fixture": "failed",
                   "test_needs_mark": "failed", "test_raw_skip": "failed", "test_raw_skipif": "failed",
                   "test_importorskip": "failed", "test_allowed": "skipped", "test_nothing_missing": "passed",
                   "test_xfail": "xfailed"}, out
    assert "skipped under CI=true, where the machine must provide this: no slurmd here" in out
    assert "ALLOWED in tests/ci_skips.py" in out
    assert "CI may skip this too: " in out  # the allowed skip says why


def test_ci_false_is_not_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "false")
    assert not on_ci()
    monkeypatch.setenv("CI", "true")
    assert on_ci()
    monkeypatch.delenv("CI")
    assert not on_ci()


SKIP_CALL = re.compile(r"pytest\.skip\(|pytest\.mark\.skip\b|\.skipif\(|importorskip\(")


def test_every_skip_in_the_suite_goes_through_ci_skips() -> None:
    """A new skip elsewhere (pytest.skip, a skip or skipif mark, importorskip) would skip on CI unnoticed by the
    allowlist's review: it must be need() or needs() of tests/ci_skips.py (this file's own TINY is the exception)."""
    mine = Path(__file__).resolve()
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in sorted([*TESTS.rglob("*.py"), *(ROOT / "runner" / "testing").rglob("*.py")])
             if path.resolve() not in {mine, TESTS / "ci_skips.py"}
             for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
             if SKIP_CALL.search(line.split("#", 1)[0])]
    assert found == [], "skip through tests/ci_skips.py's need()/needs() instead:\n" + "\n".join(found)


def test_every_allowed_skip_says_why_and_is_used() -> None:
    """ALLOWED stays short and true: each entry has its reason, and some test names it (a stale one is removed)."""
    text = "\n".join(p.read_text(errors="replace") for p in TESTS.rglob("test_*.py")
                     if p.resolve() != Path(__file__).resolve())
    for key, why in ALLOWED.items():
        assert len(why) > 40, f"ALLOWED[{key!r}] must say why CI may skip it"
        assert f'allow="{key}"' in text, f"ALLOWED[{key!r}] is used by no test: remove it"
