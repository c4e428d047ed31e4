"""The state machine: every edge of the table, reachability, the driver loop, the Mermaid graph."""

from __future__ import annotations

import asyncio

import pytest

from runner.machine import TRANSITIONS, JobState, Trigger, build_machine, drive, mermaid

LIVE = [s for s in JobState if s is not JobState.SHUTDOWN]


def edges() -> list[tuple[JobState, Trigger, JobState]]:
    """Every (source, trigger, destination) the table allows."""
    out = []
    for trigger, sources, dest in TRANSITIONS:
        for src in LIVE if sources == "*" else sources:
            out.append((src, trigger, dest))
    return out


def machine_at(state: JobState):
    """A fresh machine moved to `state`, and the list its transition callback fills."""
    seen: list[tuple[JobState, JobState, Trigger]] = []
    model, machine = build_machine(lambda s, d, t: seen.append((s, d, t)))
    machine.set_state(state)
    return model, seen


@pytest.mark.parametrize(("src", "trigger", "dst"), edges(), ids=lambda x: getattr(x, "value", str(x)))
def test_every_edge_moves_and_reports_once(src, trigger, dst):
    """Firing a trigger the table allows moves to its destination and calls the callback exactly once."""
    model, seen = machine_at(src)
    asyncio.run(model.trigger(trigger.value))
    assert model.state is dst
    assert seen == [(src, dst, trigger)]


@pytest.mark.parametrize("src", list(JobState), ids=lambda s: s.value)
def test_triggers_outside_the_table_are_refused(src):
    """A trigger with no edge from the current state raises and leaves the state alone."""
    allowed = {t for s, t, _ in edges() if s is src}
    model, seen = machine_at(src)
    for trigger in set(Trigger) - allowed:
        with pytest.raises(Exception):  # noqa: B017 - transitions raises MachineError
            asyncio.run(model.trigger(trigger.value))
        assert model.state is src
    assert seen == []


def test_every_live_state_has_a_way_out_and_shutdown_is_terminal():
    """Each non-terminal state has an outgoing edge; SHUTDOWN has none."""
    sources = {s for s, _, _ in edges()}
    assert set(LIVE) <= sources
    assert JobState.SHUTDOWN not in sources


def test_every_trigger_is_used():
    """No trigger is declared without an edge."""
    assert {t for _, t, _ in edges()} == set(Trigger)


def test_every_state_is_reachable_from_init():
    """Walking the table from INIT reaches every state."""
    reached, frontier = {JobState.INIT}, [JobState.INIT]
    while frontier:
        s = frontier.pop()
        for src, _, dst in edges():
            if src is s and dst not in reached:
                reached.add(dst)
                frontier.append(dst)
    assert reached == set(JobState)


def test_stop_requested_from_every_live_state():
    """Whatever the agent is doing, a stop request leads to SHUTDOWN."""
    for src in LIVE:
        model, _ = machine_at(src)
        asyncio.run(model.trigger(Trigger.stop_requested.value))
        assert model.state is JobState.SHUTDOWN


def test_driver_runs_handlers_until_shutdown_then_shutdown_once():
    """drive() fires what each handler returns, re-runs a handler that returns None, and runs SHUTDOWN's once."""
    calls: list[str] = []
    script = iter([None, Trigger.rendezvous_complete])

    async def init(ctx):
        calls.append("INIT")
        return Trigger.initialized

    async def rdzv(ctx):
        calls.append("RENDEZVOUS")
        return next(script)

    async def running(ctx):
        calls.append("RUNNING")
        return Trigger.workers_succeeded

    async def shutdown(ctx):
        calls.append("SHUTDOWN")

    model, _ = build_machine(lambda *a: None)
    handlers = {JobState.INIT: init, JobState.RENDEZVOUS: rdzv, JobState.RUNNING: running, JobState.SHUTDOWN: shutdown}
    final = asyncio.run(drive(model, handlers, ctx=None))
    assert final is JobState.SHUTDOWN
    assert calls == ["INIT", "RENDEZVOUS", "RENDEZVOUS", "RUNNING", "SHUTDOWN"]


def test_mermaid_lists_every_edge():
    """`runner graph` output has one line per edge plus start and end."""
    text = mermaid()
    assert text.startswith("stateDiagram-v2")
    for src, trigger, dst in edges():
        assert f"{src.value} --> {dst.value}: {trigger.value}" in text
