"""The invariants every state table of the house keeps, tested once over both: the group's machine (INIT ... SHUTDOWN,
runner/core/machine.py) and the job's (STARTING ... ENDED, runner/core/job_machine.py). Each table's own edges, guards
and orders are tested beside it (tests/core/test_machine.py, tests/core/test_job_machine.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any

import pytest

from runner.core.job_machine import JobPhase, job_edges
from runner.core.machine import GroupState, edges

Edges = Callable[[], Iterable[tuple[Any, Any, Any, Any]]]

TABLES = [
    pytest.param(edges, GroupState, GroupState.INIT, GroupState.SHUTDOWN, id="group"),
    pytest.param(job_edges, JobPhase, JobPhase.STARTING, JobPhase.ENDED, id="job"),
]


@pytest.mark.parametrize(("table", "states", "start", "end"), TABLES)
def test_every_live_state_has_a_way_out_and_the_end_is_terminal_and_reached(table: Edges, states: type[Enum],
                                                                            start: Enum, end: Enum) -> None:
    sources = {s for s, _, _, _ in table()}
    assert set(states) - {end} <= sources
    assert end not in sources
    assert {d for _, _, d, _ in table() if d is end}


@pytest.mark.parametrize(("table", "states", "start", "end"), TABLES)
def test_every_state_is_reachable_from_the_start(table: Edges, states: type[Enum], start: Enum, end: Enum) -> None:
    reached, frontier = {start}, [start]
    while frontier:
        s = frontier.pop()
        for src, _, dst, _ in table():
            if src is s and dst not in reached:
                reached.add(dst)
                frontier.append(dst)
    assert reached == set(states)
