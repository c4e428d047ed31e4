"""Timeouts of different layers whose order cannot work are refused, naming both fields and the fix
(runner/config/timeout_order.py, docs/spec.md "Timeouts that must be shorter than others").

For every rule and any pair of durations the loader refuses exactly when the order is wrong, and never raises
anything but a SpecError; `runner validate` and `runner run` say so with exit 2.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import ROOT, Job
from hypothesis import given, settings
from hypothesis import strategies as st

from runner.config import load_spec_text
from runner.config.durations import parse_duration
from runner.config.spec import JobSpec
from runner.config.timeout_order import (
    HEARTBEAT,
    LAST_CALL,
    ORDERS,
    PROGRESS,
    SLURM_GRACE,
    SLURM_LEAD,
    STALL,
    Order,
)
from runner.config.yaml_source import dotted
from runner.errors import SpecError

HEAD = "name: t\nentrypoint: train.py\n"
# Per rule: the spec around its two durations, {a} the one that must be shorter, {b} the other. Nothing else in it
# is wrong, so the rule's problem is the only one there can be.
SPECS: dict[Order, str] = {
    LAST_CALL: "nodes: 1:2\nrendezvous: {{backend: etcd, endpoints: ['10.0.0.5:2379'], last_call: {a}, "
               "join_timeout: {b}}}\n",
    HEARTBEAT: "watchdog: {{heartbeat_timeout: {a}, max_run_time: {b}}}\n",
    PROGRESS: "watchdog: {{progress_timeout: {a}, max_run_time: {b}}}\n",
    STALL: "watchdog: {{stall_timeout: {a}, max_run_time: {b}}}\n",
    SLURM_GRACE: "shutdown: {{grace_period: {a}}}\ncluster: {{slurm: {{signal_lead: {b}}}}}\n",
    SLURM_LEAD: "shutdown: {{grace_period: 0.001}}\ncluster: {{slurm: {{signal_lead: {a}, time_limit: {b}}}}}\n",
}
ORDER_ERROR = "is not shorter than"


def load(text: str) -> JobSpec:
    return load_spec_text(HEAD + text, source="job.yaml", base_dir="/base", environ={})


def order_problems(text: str) -> list[str]:
    """'path: message — fix' of every problem the loader finds ([] when the spec loads)."""
    try:
        load(text)
    except SpecError as e:
        return [f"{p.path}: {p.message} — {p.fix}" for p in e.problems]
    return []


def durations(low: float) -> st.SearchStrategy[str]:
    """A duration as a spec may write it: seconds as a number, or a whole number of ms, s or m (>= low s)."""
    return st.one_of(
        st.floats(min_value=low, max_value=1e7, allow_nan=False, allow_infinity=False).map(repr),
        st.integers(min_value=max(1, round(low * 1000)), max_value=10**9).map(lambda n: f"{n}ms"),
        st.integers(min_value=max(1, round(low)), max_value=10**6).map(lambda n: f"{n}s"),
        st.integers(min_value=max(1, round(low / 60)), max_value=10**5).map(lambda n: f"{n}m"),
    )


def pair(low: float) -> st.SearchStrategy[tuple[str, str]]:
    """Two durations, often equal (the boundary: equal is refused)."""
    return durations(low).flatmap(lambda a: st.tuples(st.just(a), st.one_of(st.just(a), durations(low))))


def test_every_rule_has_a_spec_here() -> None:
    assert set(SPECS) == set(ORDERS)


@pytest.mark.parametrize("order", ORDERS, ids=lambda o: dotted(o.shorter))
@settings(max_examples=60, deadline=None)
@given(values=pair(1.0))
def test_any_pair_is_refused_exactly_when_the_order_is_wrong(order: Order, values: tuple[str, str]) -> None:
    a, b = values
    problems = order_problems(SPECS[order].format(a=a, b=b))
    if parse_duration(a) >= parse_duration(b):
        assert len(problems) == 1, problems
        (problem,) = problems
        assert ORDER_ERROR in problem
        assert dotted(order.shorter) in problem and dotted(order.longer) in problem  # both fields named
        assert problem.endswith(f"— {order.fix}")
    else:
        assert problems == []


def test_defaults_and_the_fixed_size_and_unset_cases_pass() -> None:
    """The defaults break no rule; a rule reads only what the spec uses (a fixed size reads no last_call; a spec
    with no cluster.slurm is not checked against the template's lead; a null timeout is not compared)."""
    spec = load("")
    assert not [o for o in ORDERS if o.broken(spec)]
    fixed = "nodes: 2\nrendezvous: {backend: etcd, endpoints: ['10.0.0.5:2379'], last_call: 30s, join_timeout: 10s}\n"
    assert order_problems(fixed) == []
    assert order_problems("shutdown: {grace_period: 10m}\n") == []
    assert order_problems("watchdog: {max_run_time: 1s}\n") == []
    assert LAST_CALL.broken(replace(spec, rendezvous=replace(spec.rendezvous, last_call=600.0)))


def test_the_suite_and_the_examples_own_specs_stay_valid() -> None:
    """What the multi-node tests and the shipped examples write (lease_ttl 3 s < connect_timeout 20 s, last_call
    1 s < join_timeout 90 s; ...) breaks no rule."""
    for path in sorted((ROOT / "examples" / "jobs").glob("*.yaml")):
        spec = load_spec_text(path.read_text(), source=str(path), base_dir=str(path.parent), environ={})
        assert not [o for o in ORDERS if o.broken(spec)], path
    suite = ("nodes: 1:2\nrendezvous: {backend: etcd, endpoints: ['10.0.0.5:2379'], last_call: 1s, lease_ttl: 3s, "
             "join_timeout: 90s, connect_timeout: 20s}\n")
    assert order_problems(suite) == []


def test_the_template_refuses_with_the_same_words_on_a_spec_without_cluster(tmp_path: Path) -> None:
    from runner.config.clusters.slurm import check

    spec = load("shutdown: {grace_period: 5m}\n")
    with pytest.raises(SpecError) as caught:
        check(spec, "job.yaml")
    (problem,) = caught.value.problems
    assert problem.path == "cluster.slurm.signal_lead"
    assert "shutdown.grace_period (300 s) is not shorter than cluster.slurm.signal_lead (120 s)" in problem.message


def test_docs_table_lists_every_rule() -> None:
    text = (ROOT / "docs" / "spec.md").read_text(encoding="utf-8")
    section = text.split("### Timeouts that must be shorter than others", 1)[1].split("Not refused", 1)[0]
    rows = re.findall(r"^\| `([a-z_.]+)` \| `([a-z_.]+)` \|", section, re.MULTILINE)
    assert sorted(rows) == sorted((dotted(o.shorter), dotted(o.longer)) for o in ORDERS)


@pytest.mark.parametrize("command", ["validate", "run"])
def test_validate_and_run_refuse_with_both_fields_and_the_fix(tmp_path: Path, command: str) -> None:
    """The issue's case: last_call 30 s beside join_timeout 10 s on an elastic job. Exit 2, no traceback; `run`
    refuses before anything starts (no logs folder)."""
    job = Job(tmp_path, """\
        name: order
        entrypoint: train.py
        nodes: 1:2
        rendezvous:
          backend: etcd
          endpoints: ["10.0.0.5:2379"]
          join_timeout: 10s
          last_call: 30s
        logs: {dir: logs}
        """)
    (tmp_path / "train.py").write_text("")
    res = job.cli(command)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert ("job.yaml:8:14: rendezvous.last_call: rendezvous.last_call (30 s) is not shorter than "
            "rendezvous.join_timeout (10 s)") in res.stderr, res.stderr
    assert "— lower rendezvous.last_call below rendezvous.join_timeout, or raise rendezvous.join_timeout" in res.stderr
    assert not (tmp_path / "logs").exists()
