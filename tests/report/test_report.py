"""`runner report`: one self-contained HTML page of a real run, checked as HTML and in a real headless Chromium.

Chromium is Debian's `chromium` package (.ci/run installs it); the browser tests skip, saying so, without it
(and fail under CI=true: tests/ci_skips.py)."""

from __future__ import annotations

import html.parser
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from ci_skips import needs
from conftest import EXAMPLES, RUNNER
from hypothesis import given, settings
from hypothesis import strategies as st
from multinode_helpers import Cluster, probe_args, spec_text

from runner.report.page import CHAR_PX, render, timeline
from runner.report.story import read_story

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = needs("chromium not installed (apt-get install -y chromium)" if CHROMIUM is None else None)


class Page(html.parser.HTMLParser):
    """The parts of the page the tests read: elements by id, attributes of every element, the visible text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def having(self, **attrs: str) -> list[dict[str, str]]:
        return [a for _, a in self.elements if all(a.get(k.replace("_", "-")) == v for k, v in attrs.items())]


def env(tmp_path: Path) -> dict[str, str]:
    return dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))


def runner(tmp_path: Path, *args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RUNNER, *args], cwd=cwd or tmp_path, env=env(tmp_path),
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def restart_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """examples/jobs/restart.yaml for real (rank 1 crashes on attempt 0, attempt 1 succeeds); (tmp, run dir)."""
    tmp = tmp_path_factory.mktemp("restart")
    res = runner(tmp, str(EXAMPLES / "restart.yaml"))
    assert res.returncode == 0, res.stderr
    run_dir = next(d for d in (tmp / "runner-logs" / "restart").iterdir() if not d.is_symlink())
    return tmp, run_dir


def test_report_of_a_failing_then_recovering_run(restart_run: tuple[Path, Path]) -> None:
    tmp, run_dir = restart_run
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    res = runner(tmp, "report", "restart", "-o", str(elsewhere / "page.html"), cwd=elsewhere)  # by job name
    assert res.returncode == 0, res.stderr
    text = (elsewhere / "page.html").read_text()
    page = Page(text)
    assert page.having(id="outcome") and "succeeded" in text
    assert {a["data-attempt"] for a in page.having(**{"class": "attempt-row"})} == {"0", "1"}
    cause = text.split('id="root-cause">')[1].split("</div>")[0]
    assert "Recovered from" in cause and "rank 1 exited with code 1" in cause
    assert "RuntimeError: rank 1 crashed on attempt 0 (on purpose)" in cause
    workers = page.having(**{"class": "worker"})
    assert {(w["data-rank"], w["data-attempt"], w["data-how"]) for w in workers} == {
        ("0", "0", "stopped"), ("1", "0", "failed"), ("0", "1", "ok"), ("1", "1", "ok")}
    states = [a["data-state"] for a in page.having(**{"class": "state"})]
    assert states[0] == "INIT" or states[0] == "RENDEZVOUS"
    assert {"RUNNING", "FAILED", "RESTARTING", "SHUTDOWN"} <= set(states)
    assert '<span id="attempt-count">2</span> attempt(s) · 1 restart(s)' in text
    assert_labels_inside(text)
    restarts = text.split('id="restarts"')[1].split("</table>")[0]
    assert "worker_failed" in restarts and " s</td>" in restarts  # a measured recovery time
    assert 'raise RuntimeError(f"rank {rank} crashed' in text.replace("&quot;", '"').replace("&#x27;", "'")
    for reference in ("src=", "href=", "url(", "@import", "<script"):
        assert reference not in text  # self-contained: nothing to fetch
    same = runner(tmp, "report", str(run_dir))  # by run dir: written beside the run
    assert same.returncode == 0 and same.stdout.strip() == str(run_dir / "report.html")


def assert_labels_inside(text: str) -> None:
    """Every axis label of the timeline lies inside the SVG (the last one was clipped by its right edge)."""
    svg = text.split('<svg id="timeline"')[1].split("</svg>", maxsplit=1)[0]
    width = float(re.search(r'width="([\d.]+)"', svg).group(1))
    labels = re.findall(r'<text class="lbl" x="([\d.]+)"( text-anchor="end")? y="11">([^<]+)</text>', svg)
    assert len(labels) >= 2, svg[:500]
    for x, end, label in labels:
        left, right = (float(x) - CHAR_PX * len(label), float(x)) if end else (float(x), float(x) + CHAR_PX * len(label))
        assert left >= 0 and right <= width, (label, x, end, width)


def test_axis_labels_stay_inside_the_timeline_at_any_length() -> None:
    for seconds in (0.4, 3.0, 9.9, 61.0, 3599.0, 86400.0):
        story = SimpleNamespace(nodes=[], start=1000.0, end=1000.0 + seconds)  # what timeline() reads of a Story
        assert_labels_inside(timeline(story))


def test_report_refuses_what_is_not_a_run(tmp_path: Path) -> None:
    res = runner(tmp_path, "report", "never-ran")
    assert res.returncode == 2 and "no run of job 'never-ran'" in res.stderr
    res = runner(tmp_path, "report", str(tmp_path))
    assert res.returncode == 2 and "not a run dir" in res.stderr and "Traceback" not in res.stderr


def test_report_of_a_run_that_gave_up_names_the_root_cause(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("import sys\nprint('disk on fire', file=sys.stderr)\nsys.exit(5)\n")
    (tmp_path / "job.yaml").write_text("version: 1\nname: doomed\nentrypoint: {script: bad.py}\n"
                                       "restart: {max_restarts: 1, backoff: {initial: 0.1s}}\n")
    assert runner(tmp_path, str(tmp_path / "job.yaml")).returncode == 1
    res = runner(tmp_path, "report", str(tmp_path / "job.yaml"))  # by spec
    assert res.returncode == 0, res.stderr
    text = Path(res.stdout.strip()).read_text()
    cause = text.split('id="root-cause">')[1].split("</div>")[0]
    assert "Root cause" in cause and "attempt 1" in cause and "rank 0 exited with code 5" in cause
    assert "disk on fire" in text  # the stderr tail
    assert 'class="badge" id="outcome" style="background:#c62828">failed' in text


@needs_chromium
def test_report_in_a_real_browser(restart_run: tuple[Path, Path], tmp_path: Path) -> None:
    _, run_dir = restart_run
    page = tmp_path / "report.html"
    page.write_text(render(read_story([run_dir])))
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*base, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120, check=False)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert '<svg id="timeline"' in dom.stdout and 'data-attempt="1"' in dom.stdout
    assert "rank 1 exited with code 1" in dom.stdout and "Recovered from" in dom.stdout
    shot = tmp_path / "shot.png"
    done = subprocess.run([*base, f"--screenshot={shot}", "--window-size=1400,900", page.as_uri()],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000  # not a blank page


LINES = st.lists(st.one_of(
    st.text(max_size=80),
    st.builds(json.dumps, st.fixed_dictionaries({
        "event": st.sampled_from(["transition", "worker_started", "worker_exited", "failure", "other"]),
        "src": st.sampled_from(["INIT", "RUNNING", 3]), "dst": st.sampled_from(["RUNNING", "FAILED", "SHUTDOWN"]),
        "trigger": st.text(max_size=5), "attempt": st.one_of(st.integers(-2, 3), st.text(max_size=2)),
        "time": st.one_of(st.floats(0, 2e9), st.text(max_size=3)), "pid": st.integers(0, 5),
        "rank": st.one_of(st.integers(0, 2), st.none()), "exit_code": st.one_of(st.integers(-9, 2), st.none()),
        "timestamp": st.sampled_from(["2026-01-01T00:00:00Z", "nonsense", "2026-01-01T00:00:05.5Z"]),
    }))), max_size=20)


@settings(max_examples=60, deadline=None)
@given(LINES, LINES, st.one_of(st.none(), st.text(max_size=30), st.just('{"outcome": 3, "failures": [1, {}]}')))
def test_any_run_dir_content_gives_a_page(agent: list[str], transitions: list[str], report: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        (run_dir / "agent.jsonl").write_text("\n".join(agent))
        (run_dir / "transitions.jsonl").write_text("\n".join(transitions))
        if report is not None:
            (run_dir / "report.json").write_text(report)
        text = render(read_story([run_dir]))
    assert text.startswith("<!DOCTYPE html>") and text.endswith("</html>")


def test_report_merges_every_node_of_an_etcd_job(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Two nodes; rank 1 (node b) fails on attempt 0; the page shows both nodes and the root cause on b."""
    nodes: Cluster = request.getfixturevalue("cluster")
    nodes.env["XDG_STATE_HOME"] = str(nodes.tmp / "state")  # a home shared by the hosts (each has its own /tmp)
    nodes.write(spec_text(nodes.endpoint, name="merged", args=probe_args(
        nodes.out, "--sleep", "3", "--fail-rank", "1", "--fail-attempts", "1")))
    a = nodes.start("a")
    b = nodes.start("b")
    assert nodes.wait_all() == {"a": 0, "b": 0}, a.output() + b.output()
    res = runner(nodes.tmp, "report", "merged")  # by name: both nodes' runs from the shared home's index
    assert res.returncode == 0, res.stderr
    text = Path(res.stdout.strip()).read_text()
    page = Page(text)
    assert {a["data-node"] for a in page.having(**{"class": "attempt-row"})} == {"a", "b"}
    assert "2 node(s)" in text and str(a.run_dir()) in text and str(b.run_dir()) in text
    # The job's 2 attempts and 1 restart, each seen on both nodes: not 4 attempts and 2 restarts.
    assert '<span id="attempt-count">2</span> attempt(s) · 1 restart(s)' in text
    cause = text.split('id="root-cause">')[1].split("</div>")[0]
    assert "node b" in cause and "rank 1 exited with code 3" in cause, cause
    explicit = runner(tmp_path, "report", str(a.run_dir()), str(b.run_dir()), "-o", str(tmp_path / "two.html"))
    assert explicit.returncode == 0 and "rank 1 exited with code 3" in (tmp_path / "two.html").read_text()


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)
# report.json parts shaped like what the page reads, with any value possibly of another type
RECORDS = st.dictionaries(st.sampled_from(["attempt", "kind", "reason", "steps", "ledger", "failures", "group",
                                           "outcome", "ettr", "launch"]), JSONISH, max_size=6)


@given(st.lists(RECORDS, max_size=4), st.lists(RECORDS, max_size=3), RECORDS)
@settings(max_examples=60)
def test_the_page_reads_any_report_json_without_raising(failures: list, groups: list, report: dict) -> None:
    """report.json and failure.json are read as they come: any JSON in their fields gives a page, never a traceback."""
    from runner.report.ledger_page import ledger_section
    from runner.report.page import groups_table
    from runner.report.story import NodeStory, Story
    from runner.rundir.records import FailureRecord, Report

    node = NodeStory(node="n0", job="j", run_dir="/x", failures=[FailureRecord.from_dict(f) for f in failures],
                     report=Report.from_dict(report), start=1.0, end=2.0)
    story = Story([node], groups)
    story.root_cause()
    assert "</table>" in groups_table(story)
    assert isinstance(ledger_section(story), str)
