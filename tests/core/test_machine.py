"""The state machine: a hand-written list of the edges we mean to have, the restart policy's guarded edges in
order, reachability, the driver loop and the Mermaid graph."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from runner.config.spec import Budgets
from runner.core.machine import (
    TRANSITIONS,
    GroupState,
    Guard,
    Step,
    Trigger,
    build_machine,
    drive,
    edges,
    mermaid,
)
from runner.core.restart_policy import GUARDS, gather, settle
from runner.diagnosis.failure import Failure
from runner.errors import RendezvousError
from runner.outcomes import FailureClass, FailureKind
from runner.rendezvous.base import RoundCharge

S, T, G = GroupState, Trigger, Guard
LIVE = [s for s in GroupState if s is not S.SHUTDOWN]

# Written by hand from the design (docs/architecture.md), NOT derived from TRANSITIONS: the table must match it.
EXPECTED = {
    (S.INIT, T.initialized, S.RENDEZVOUS, None),
    (S.INIT, T.fatal, S.SHUTDOWN, None),
    (S.RENDEZVOUS, T.fatal, S.SHUTDOWN, None),
    (S.RESTARTING, T.fatal, S.SHUTDOWN, None),
    (S.RENDEZVOUS, T.rendezvous_complete, S.RUNNING, None),
    (S.RENDEZVOUS, T.rendezvous_timeout, S.FAILED, None),
    (S.RENDEZVOUS, T.job_closed, S.SHUTDOWN, None),
    (S.RUNNING, T.workers_succeeded, S.SHUTDOWN, None),
    (S.RUNNING, T.worker_failed, S.FAILED, None),
    (S.RUNNING, T.timer_expired, S.FAILED, None),
    (S.RUNNING, T.peer_lost, S.FAILED, None),
    (S.RUNNING, T.deadline_reached, S.SHUTDOWN, None),
    (S.RUNNING, T.guard_lost, S.SHUTDOWN, None),
    (S.RUNNING, T.fenced, S.SHUTDOWN, None),
    (S.RUNNING, T.membership_changed, S.RESTARTING, None),
    (S.FAILED, T.give_up, S.SHUTDOWN, G.stopping),
    (S.FAILED, T.give_up, S.SHUTDOWN, G.class_spent),
    (S.FAILED, T.give_up, S.SHUTDOWN, G.crash_loop),
    (S.FAILED, T.non_retryable, S.SHUTDOWN, G.non_retryable_exit),
    (S.FAILED, T.retry, S.RESTARTING, G.restart_charged),
    (S.FAILED, T.give_up, S.SHUTDOWN, None),
    (S.RESTARTING, T.restarted, S.RENDEZVOUS, None),
    (S.RESTARTING, T.worker_replaced, S.RUNNING, None),
    *((s, T.stop_requested, S.SHUTDOWN, None) for s in LIVE),
}
# The order in which FAILED's guards are tried: a stop beats everything, a spent class or a crash loop stops before
# any charge, the budgets are charged last.
POLICY_ORDER = [G.stopping, G.class_spent, G.crash_loop, G.non_retryable_exit, G.restart_charged, None]


def test_the_table_is_exactly_the_designed_edges():
    assert set(edges()) == EXPECTED
    assert len(edges()) == len(EXPECTED)


def test_policy_guards_are_tried_in_the_designed_order():
    assert [e.when for e in TRANSITIONS if e.fired_by is T.decide] == POLICY_ORDER


class Budget:
    """A rendezvous stand-in with a restart budget (only charge_restart is used by the policy)."""

    def __init__(self, left: int) -> None:
        self.left, self.used, self.calls = left, 0, []

    async def charge_restart(self, max_restarts: int, failure_class: FailureClass | None = None,
                             class_limit: int | None = None, *, charged: bool = True) -> RoundCharge:
        self.calls.append(max_restarts)
        if self.left < 0:
            raise RendezvousError("etcd unreachable")
        if self.left <= 0 or self.used >= max_restarts:
            return RoundCharge(None, failure_class, charged, "n0")
        self.left -= 1
        self.used += 1
        return RoundCharge(self.used, failure_class, charged, "n0")


def failed_ctx(*, kind="worker", exit_code=1, stop=None, budget=1, non_retryable=(), crash_loop=3, earlier=()):
    """A hand-written stand-in for Context with what the guards read (`earlier`: failures before this one)."""
    failure = Failure(kind=FailureKind(kind), reason="rank 0 exited with code 1", attempt=len(earlier),
                      exit_code=exit_code, traceback=TRACEBACK if kind == "worker" else "")
    spec = SimpleNamespace(restart=SimpleNamespace(max_restarts=3, non_retryable_exit_codes=tuple(non_retryable),
                                                   budgets=Budgets(), crash_loop=crash_loop))
    run = SimpleNamespace(failure=failure, failures=[*earlier, failure], restarts=0, charge=None)
    return SimpleNamespace(run=run, spec=spec, stop=stop, rendezvous=Budget(budget))


TRACEBACK = 'Traceback (most recent call last):\n  File "train.py", line 9, in step\n    boom()\nValueError: bad 0x7f'
LOOP = tuple(Failure(kind=FailureKind.WORKER, reason="rank 0 exited with code 1", attempt=a, exit_code=1,
                     traceback=TRACEBACK) for a in (0, 1))


def decide(ctx) -> tuple[GroupState, Step]:
    """What FAILED and the driver do: gather the charge, fire `decide`, settle the edge taken."""
    model, machine = build_machine(GUARDS)
    machine.set_state(S.FAILED)

    async def go():
        await gather(ctx)
        assert await model.trigger(T.decide.value, facts=ctx)
        return await settle(ctx, model.taken)

    step = asyncio.run(go())
    return model.state, step


@pytest.mark.parametrize(
    ("ctx_args", "dst", "trigger", "exit_code", "charged"),
    [
        ({}, S.RESTARTING, T.retry, None, 1),
        ({"budget": 0}, S.SHUTDOWN, T.give_up, 1, 0),
        ({"non_retryable": (1,)}, S.SHUTDOWN, T.non_retryable, 1, 0),
        ({"kind": "rendezvous", "exit_code": None}, S.SHUTDOWN, T.give_up, 3, 0),
        ({"stop": object(), "non_retryable": (1,)}, S.SHUTDOWN, T.give_up, 1, 0),
        ({"budget": -1}, S.SHUTDOWN, T.give_up, 3, 0),
        ({"earlier": LOOP}, S.SHUTDOWN, T.give_up, 1, 0),
        ({"earlier": LOOP, "crash_loop": 0}, S.RESTARTING, T.retry, None, 1),
        ({"kind": "watchdog", "exit_code": None}, S.RESTARTING, T.retry, None, 1),
    ],
    ids=["retry", "budget-spent", "non-retryable", "infrastructure", "stopping-first", "budget-unreachable",
         "crash-loop", "crash-loop-off", "hang"],
)
def test_restart_policy_edges(ctx_args, dst, trigger, exit_code, charged):
    ctx = failed_ctx(**ctx_args)
    state, step = decide(ctx)
    assert state is dst
    assert step.trigger is trigger
    assert step.exit_code == exit_code
    assert ctx.rendezvous.used == charged  # the budget is charged only when the restart happens
    assert step.reason


def test_a_retry_says_which_restart_it_is():
    ctx = failed_ctx(budget=3)
    _, step = decide(ctx)
    assert step.reason == "restart 1 of 3"
    assert ctx.run.restarts == 1


@pytest.mark.parametrize("ctx_args", [{}, {"budget": 0}, {"earlier": LOOP}, {"kind": "rendezvous", "exit_code": None},
                                      {"stop": object()}, {"budget": -1}],
                         ids=["plain", "budget-0", "crash-loop", "rendezvous", "stop", "budget-spent"])  # stable ids: xdist
def test_guards_only_read(ctx_args):
    """Every guard, asked in any state of the failure, neither calls the rendezvous nor changes the context."""
    ctx = failed_ctx(**ctx_args)
    before = repr(ctx)
    for guard in GUARDS.values():
        guard(ctx)
    assert ctx.rendezvous.calls == []
    assert repr(ctx) == before


@pytest.mark.parametrize(("ctx_args", "refused"), [
    ({"earlier": LOOP}, True),  # a crash loop: the other nodes are told through the round's charge
    ({"kind": "rendezvous", "exit_code": None}, False),  # infrastructure: decided with no etcd call at all
    ({"non_retryable": (1,)}, False),
], ids=["crash-loop", "infrastructure", "non-retryable"])
def test_a_give_up_acts_after_the_edge_is_taken(ctx_args, refused):
    ctx = failed_ctx(**ctx_args)
    state, _ = decide(ctx)
    assert state is S.SHUTDOWN
    assert ctx.rendezvous.calls == ([0] if refused else [])


@pytest.mark.parametrize("src", list(GroupState), ids=lambda s: s.value)
def test_triggers_outside_the_table_are_refused(src):
    """A trigger with no edge from the current state raises and leaves the state alone."""
    allowed = {e.fired_by or e.trigger for e in TRANSITIONS if src in e.sources}
    model, machine = build_machine(GUARDS)
    machine.set_state(src)
    for trigger in set(Trigger) - allowed:
        with pytest.raises(Exception):  # noqa: B017 - transitions raises MachineError
            asyncio.run(model.trigger(trigger.value, facts=None))
        assert model.state is src


def test_driver_runs_handlers_until_shutdown_then_shutdown_once():
    """drive() fires what each handler returns, re-runs a handler that returns None, and runs SHUTDOWN's once."""
    calls: list[str] = []
    seen: list[tuple[GroupState, GroupState, Trigger, str]] = []
    script = iter([None, Step(T.rendezvous_complete, "round 0")])

    async def init(ctx):
        calls.append("INIT")
        return Step(T.initialized)

    async def rdzv(ctx):
        calls.append("RENDEZVOUS")
        return next(script)

    async def running(ctx):
        calls.append("RUNNING")
        return Step(T.workers_succeeded, "all done")

    async def shutdown(ctx):
        calls.append("SHUTDOWN")

    async def on_transition(src, dst, edge, step):
        seen.append((src, dst, edge.trigger, step.reason))

    model, _ = build_machine(GUARDS)
    handlers = {S.INIT: init, S.RENDEZVOUS: rdzv, S.RUNNING: running, S.SHUTDOWN: shutdown}
    asyncio.run(drive(model, handlers, None, on_transition, settle))
    assert model.state is S.SHUTDOWN
    assert calls == ["INIT", "RENDEZVOUS", "RENDEZVOUS", "RUNNING", "SHUTDOWN"]
    assert seen == [
        (S.INIT, S.RENDEZVOUS, T.initialized, ""),
        (S.RENDEZVOUS, S.RUNNING, T.rendezvous_complete, "round 0"),
        (S.RUNNING, S.SHUTDOWN, T.workers_succeeded, "all done"),
    ]


def test_mermaid_lists_every_edge():
    text = mermaid()
    assert text.startswith("stateDiagram-v2")
    for src, trigger, dst, when in edges():
        label = trigger.value + (f" [{when.name}]" if when else "")
        assert f"{src.value} --> {dst.value}: {label}" in text
