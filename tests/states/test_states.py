"""Each state handler on its own, with a real Context and hand-written fakes for the rendezvous (no workers run)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from pathlib import Path

import pytest
from ci_skips import need

from runner.agent.assembly import assemble
from runner.config import load_spec_text
from runner.config.spec import Nodes
from runner.core.context import Charge, Context, JobInputs
from runner.core.group_state import GroupState
from runner.core.machine import Step, Trigger
from runner.diagnosis.failure import Failure
from runner.errors import JobClosed, RendezvousError, RendezvousTimeout
from runner.events import Fenced, GuardLost, MembershipChanged, StopRequested, TimerExpired, WorkerExited
from runner.hangs import Finding, Verdict
from runner.outcomes import FailureClass, FailureKind, Outcome
from runner.rendezvous.base import RendezvousResult, RoundCharge
from runner.states import failed, init, rendezvous, restarting, running, shutdown

SPEC = """
version: 1
name: states
entrypoint: {command: ["true"]}
nproc_per_node: 2
restart: {max_restarts: 2, backoff: {initial: 30s, max: 30s}}
"""


class FakeRendezvous:
    """Hand-written stand-in: scripted results or errors, records what the agent told it."""

    def __init__(self, *, open_error: Exception | None = None, hang_open: bool = False,
                 round_error: Exception | None = None, close_error: Exception | None = None) -> None:
        self.open_error, self.hang_open, self.round_error, self.close_error = open_error, hang_open, round_error, close_error
        self.published: list[dict] = []
        self.closed: list[str] = []
        self.charges: list[tuple[FailureClass | None, bool]] = []  # (failure class, charged) of each charge_restart
        self.marks: list = []  # what the node ledger was told (note_node)
        self.mending = False  # what recovering() says (a hosted founder going on alone)
        self.told: list[str] = []  # "stopping" each time the agent told it that it stops, in order with the workers'

    async def stopping(self) -> None:
        self.told.append("stopping")

    def recovering(self) -> bool:
        return self.mending

    def on_stop(self, sink) -> None:
        self.stop_sink = sink

    async def open(self, events) -> None:
        if self.hang_open:
            await asyncio.Event().wait()  # an etcd that never answers
        if self.open_error:
            raise self.open_error

    async def next_round(self, attempt: int) -> RendezvousResult:
        if self.round_error:
            raise self.round_error
        return RendezvousResult(round=attempt, node="n0", group_rank=0, group_world_size=1, nproc_per_node=2,
                                master_addr="127.0.0.1", master_port=29500, nodes=("n0",))

    async def charge_restart(self, max_restarts: int, failure_class: FailureClass | None = None,
                             class_limit: int | None = None, *, charged: bool = True,
                             defer: float = 0.0) -> RoundCharge:
        self.charges.append((failure_class, charged))
        return RoundCharge(1, failure_class, charged, "n0")

    async def publish(self, state: dict) -> None:
        self.published.append(state)

    async def note_node(self, mark) -> None:
        self.marks.append(mark)

    async def node_ledger(self) -> dict:
        return {}

    async def progress_of_nodes(self) -> dict:
        return {}

    async def share_hang(self, local, *, timeout: float):
        return local

    async def close(self, outcome: str, *, alone: bool = False) -> None:
        if self.close_error:
            raise self.close_error
        self.closed.append(outcome)


class Log:
    """A structlog-shaped logger that keeps what it was told."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict]] = []

    def __getattr__(self, level: str):
        return lambda event, **kw: self.lines.append((level, event, kw))


class Machine:
    """The machine's state as the handlers' services see it (the driver moves it; here, the test)."""

    state = GroupState.INIT


def make_ctx(tmp_path: Path, rdzv: FakeRendezvous | None = None, machine: Machine | None = None) -> Context:
    """A real context (inputs and the agent's services) around a fake rendezvous and a logger that keeps lines."""
    spec = load_spec_text(SPEC, source=str(tmp_path / "job.yaml"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    machine = machine or Machine()
    inputs = JobInputs(spec, "n0", run_dir, time.monotonic())
    return assemble(inputs, rdzv or FakeRendezvous(), Log(), lambda: machine.state)


def run(coro):
    return asyncio.run(coro)


def test_init_is_fatal_with_exit_3_when_the_rendezvous_cannot_open(tmp_path):
    ctx = make_ctx(tmp_path, FakeRendezvous(open_error=RendezvousError("etcd unreachable", "start etcd")))

    async def go():
        return await init.handle(ctx)

    step = run(go())
    assert step == Step(Trigger.fatal, "etcd unreachable", Outcome.ERROR, 3)
    assert ctx.run.failure.kind is FailureKind.RENDEZVOUS
    assert json.loads((ctx.inputs.run_dir / "spec.json").read_text())["name"] == "states"


def test_init_honours_a_stop_while_the_rendezvous_hangs(tmp_path):
    ctx = make_ctx(tmp_path, FakeRendezvous(hang_open=True))

    async def go():
        asyncio.get_running_loop().call_later(0.05, ctx.events.put_nowait, StopRequested(15, graceful=False))
        return await asyncio.wait_for(init.handle(ctx), 10)

    step = run(go())
    assert step.trigger is Trigger.stop_requested
    assert ctx.stop == StopRequested(15, graceful=False)


@pytest.mark.parametrize(
    ("error", "trigger", "outcome", "kind"),
    [
        (JobClosed("states", "stopping"), Trigger.job_closed, Outcome.STOPPED, None),
        (RendezvousTimeout("states", 5.0, 1, 2), Trigger.rendezvous_timeout, None, FailureKind.RENDEZVOUS),
        (RendezvousError("lost etcd"), Trigger.fatal, Outcome.ERROR, FailureKind.RENDEZVOUS),
    ],
    ids=["closed", "timeout", "error"],
)
def test_rendezvous_turns_each_error_into_its_edge(tmp_path, error, trigger, outcome, kind):
    ctx = make_ctx(tmp_path, FakeRendezvous(round_error=error))
    step = run(rendezvous.handle(ctx))
    assert step.trigger is trigger
    assert step.outcome is outcome
    assert (ctx.run.failure.kind if ctx.run.failure else None) is kind
    if "closed" in error.message:
        assert "runner reset" in error.fix


def test_rendezvous_success_plans_the_workers(tmp_path):
    ctx = make_ctx(tmp_path)
    step = run(rendezvous.handle(ctx))
    assert step.trigger is Trigger.rendezvous_complete
    assert "world size 2" in step.reason
    assert [w.rank for w in ctx.run.plan.workers] == [0, 1]


class FakeWorker:
    def __init__(self, pid: int, local_rank: int) -> None:
        self.pid = pid
        self.plan = type("Plan", (), {"log_dir": f"/logs/rank_{local_rank}"})()


class FakeGroup:
    """Two current workers with known pids (no processes)."""

    def __init__(self) -> None:
        self.workers = {0: FakeWorker(1000, 0), 1: FakeWorker(1001, 1)}


def test_running_ignores_exits_and_timer_expiries_of_earlier_workers(tmp_path):
    """Issue 8.6a: a timer expiry queued during one attempt must not fail the next."""
    ctx = make_ctx(tmp_path)
    ctx.run.group = FakeGroup()
    stale_timer = TimerExpired(local_rank=1, rank=1, pid=999, scope="step", overdue_s=1.0, reason="old attempt")
    stale_exit = WorkerExited(local_rank=0, rank=0, pid=998, exit_code=1, attempt=0)
    assert run(running.on_event(ctx, stale_timer)) is None
    assert run(running.on_event(ctx, stale_exit)) is None
    assert ctx.run.failure is None
    current = TimerExpired(local_rank=1, rank=1, pid=1001, scope="step", overdue_s=1.0, reason="hung")
    step = run(running.on_event(ctx, current))
    assert step.trigger is Trigger.timer_expired
    assert ctx.run.failure.kind is FailureKind.WATCHDOG


def test_restarting_drops_what_the_old_workers_queued_but_keeps_stops(tmp_path):
    ctx = make_ctx(tmp_path)
    ctx.run.group = FakeGroup()
    stop = StopRequested(2, graceful=False)
    ctx.events.put_nowait(TimerExpired(local_rank=0, rank=0, pid=5, scope="s", overdue_s=0, reason="old"))
    ctx.events.put_nowait(stop)
    restarting.drop_stale(ctx)
    assert ctx.events.qsize() == 1
    assert ctx.events.get_nowait() is stop


def test_failed_keeps_the_failure_and_lets_the_policy_decide(tmp_path):
    ctx = make_ctx(tmp_path)
    ctx.run.failure = Failure(kind=FailureKind.WORKER, reason="rank 1 exited with code 1", attempt=0, rank=1, exit_code=1)
    step = run(failed.handle(ctx))
    assert step.trigger is Trigger.decide
    assert ctx.run.failures == [ctx.run.failure]
    # no guard before the budget holds: the restart is charged before `decide`
    assert ctx.run.charge == Charge(RoundCharge(1, FailureClass.EXCEPTION, charged=True, by="n0"))
    saved = json.loads((ctx.inputs.run_dir / "attempt_0" / "failure.json").read_text())
    assert saved["kind"] == "worker"
    assert saved["exit_code"] == 1


@pytest.mark.parametrize(("graceful", "outcome", "code"), [(True, Outcome.FAILED, 1), (False, None, None)])
def test_a_stop_during_the_backoff_ends_the_job_at_once(tmp_path, graceful, outcome, code):
    """Graceful: no restart, the failed attempt's result stands (exit 1). Otherwise a plain stop (SHUTDOWN: 128+N)."""
    ctx = make_ctx(tmp_path)
    ctx.run.restarts = 2  # the second restart backs off 30 s
    ctx.run.failure = Failure(kind=FailureKind.WORKER, reason="boom", attempt=0, exit_code=1)

    async def go():
        asyncio.get_running_loop().call_later(0.05, ctx.events.put_nowait, StopRequested(12, graceful=graceful))
        return await asyncio.wait_for(restarting.handle(ctx), 10)

    step = run(go())
    assert step.trigger is Trigger.stop_requested
    assert step.outcome is outcome
    assert step.exit_code == code
    assert ctx.run.attempt == 0


def test_shutdown_after_a_stop_exits_128_plus_the_signal_and_writes_the_report(tmp_path):
    rdzv = FakeRendezvous()
    machine = Machine()
    ctx = make_ctx(tmp_path, rdzv, machine)
    ctx.stop = StopRequested(2, graceful=False)
    machine.state = GroupState.SHUTDOWN  # the driver runs SHUTDOWN's handler once the machine is there
    run(shutdown.handle(ctx))
    assert (ctx.outcome, ctx.exit_code) == (Outcome.STOPPED, 130)
    report = json.loads((ctx.inputs.run_dir / "report.json").read_text())
    assert report["outcome"] == "stopped"
    assert report["exit_code"] == 130
    assert rdzv.closed == ["stopped"]
    assert rdzv.published[-1]["state"] == "SHUTDOWN"


class StoppingGroup:
    """Workers whose stop is noted in `told` (the rendezvous's fake notes its own there too)."""

    def __init__(self, told: list[str]) -> None:
        self.told = told
        self.lost_bytes: dict[int, int] = {}  # the report asks what the log files refused

    async def stop(self, signum, grace: float, hurry) -> None:
        self.told.append("workers stopped")


@pytest.mark.parametrize(("signum", "told"), [(15, ["stopping", "workers stopped"]), (0, ["workers stopped"])])
def test_a_signal_of_its_own_is_told_to_the_rendezvous_before_the_workers_stop(tmp_path, signum, told):
    """A hosting node stopped by a signal asks the others to stop before its workers do (Rendezvous.stopping):
    CI saw its peer read it as lost first. A stop that came through the rendezvous (signum 0) is not told back."""
    rdzv = FakeRendezvous()
    machine = Machine()
    ctx = make_ctx(tmp_path, rdzv, machine)
    ctx.run.group = StoppingGroup(rdzv.told)
    ctx.stop = StopRequested(signum, graceful=False)
    machine.state = GroupState.SHUTDOWN
    run(shutdown.handle(ctx))
    assert rdzv.told == told


def test_shutdown_keeps_the_workers_result_when_the_rendezvous_fails(tmp_path):
    """Issue 9.4: etcd unreachable when the workers finish is a warning, never the job's result."""
    ctx = make_ctx(tmp_path, FakeRendezvous(close_error=RendezvousError("etcd unreachable")))
    ctx.outcome, ctx.exit_code = Outcome.SUCCEEDED, 0
    run(shutdown.handle(ctx))
    assert (ctx.outcome, ctx.exit_code) == (Outcome.SUCCEEDED, 0)
    report = json.loads((ctx.inputs.run_dir / "report.json").read_text())
    assert report["outcome"] == "succeeded"
    assert "rendezvous_close_failed" in report["warnings"]


def test_shutdown_writes_the_report_elsewhere_when_the_run_dir_is_read_only(tmp_path, monkeypatch):
    need("root writes into read-only directories; the tmpfs test covers root" if os.geteuid() == 0 else None,
         allow="root-writes-read-only")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ctx = make_ctx(tmp_path)
    ctx.outcome = Outcome.SUCCEEDED
    ctx.inputs.run_dir.chmod(0o500)
    try:
        run(shutdown.handle(ctx))
    finally:
        ctx.inputs.run_dir.chmod(0o700)
    assert ctx.report_path is not None
    assert ctx.report_path.parent != ctx.inputs.run_dir
    assert json.loads(ctx.report_path.read_text())["outcome"] == "succeeded"


def test_running_stops_the_job_when_the_guard_is_lost(tmp_path):
    """No shepherd, no guarantee that workers die with the agent: stop them now, exit 3, say why."""
    ctx = make_ctx(tmp_path)
    step = run(running.on_event(ctx, GuardLost("fork failed")))
    assert step.trigger is Trigger.guard_lost
    assert (step.outcome, step.exit_code) == (Outcome.ERROR, 3)
    assert "fork failed" in step.reason
    assert ctx.run.failure.kind is FailureKind.GUARD


def test_running_stops_the_job_when_this_node_is_fenced_and_shutdown_cuts_the_grace(tmp_path):
    """Cut off from etcd and every peer: stop now, exit 3, the fence's reason; SHUTDOWN's grace is a sixth of the
    lease TTL at most, so the workers are gone before the lease lapses (runner/rendezvous/etcd/fence.py)."""
    ctx = make_ctx(tmp_path)
    step = run(running.on_event(ctx, Fenced("cut off: etcd has not renewed this node's lease")))
    assert step.trigger is Trigger.fenced
    assert (step.outcome, step.exit_code) == (Outcome.FAILED, 3)
    assert ctx.run.failure.kind is FailureKind.FENCED and "cut off" in ctx.run.failure.reason
    assert shutdown.grace_period(ctx) == min(ctx.spec.shutdown.grace_period, ctx.spec.rendezvous.lease_ttl / 6)
    ctx.run.failure = None
    assert shutdown.grace_period(ctx) == ctx.spec.shutdown.grace_period


def test_a_membership_change_claims_the_round_uncharged_before_the_workers_stop(tmp_path):
    """A node waiting to join: RUNNING claims the round's charge, uncharged, before its step stops the workers, so a
    peer whose worker fails on the broken collective finds the round claimed and is not charged either."""
    rdzv = FakeRendezvous()
    ctx = make_ctx(tmp_path, rdzv)
    step = run(running.on_event(ctx, MembershipChanged(waiting=("n9",))))
    assert step.trigger is Trigger.membership_changed and "n9" in step.reason
    assert rdzv.charges == [(None, False)]
    assert ctx.run.failure is None


def test_a_fixed_master_port_is_the_rounds_port_on_the_local_backend():
    """torchrun's --master-port (rendezvous.master_port) is what the round reports, every attempt."""
    from runner.rendezvous.local import LocalRendezvous

    rdzv = LocalRendezvous("n0", 2, "127.0.0.1", master_port=29511)
    assert [run(rdzv.next_round(a)).master_port for a in (0, 1)] == [29511, 29511]
    free = LocalRendezvous("n0", 2, "127.0.0.1")
    first, second = (run(free.next_round(a)).master_port for a in (0, 1))
    assert first != second  # a fresh port every attempt otherwise


class ExitedWorker(FakeWorker):
    """A worker whose exit the group has already seen (its future is done)."""

    def __init__(self, pid: int, local_rank: int, code: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(pid, local_rank)
        self.exited = loop.create_future()
        self.exited.set_result(code)


class ExitedGroup:
    """Both workers exited at the same moment: rank 0 with 0, rank 1 with 3 (its event not processed yet)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.workers = {0: ExitedWorker(1000, 0, 0, loop), 1: ExitedWorker(1001, 1, 3, loop)}
        self.first_failed: int | None = None

    def running(self) -> list[ExitedWorker]:
        return []

    async def settle(self, failed: ExitedWorker, _within: float) -> ExitedWorker:
        self.first_failed = 1  # nobody else runs: the failed worker (rank 1) is the root cause
        return failed

    def stderr_tail(self, _local_rank: int) -> str:
        return ""


def test_a_success_seen_first_does_not_hide_a_failure_that_exited_at_the_same_moment(tmp_path):
    """Both exits are in before RUNNING handles the first (rank 0: 0): that is no success; rank 1's exit decides."""
    ctx = make_ctx(tmp_path)

    async def both() -> tuple[object, object]:
        ctx.run.group = ExitedGroup(asyncio.get_running_loop())
        first = await running.on_event(ctx, WorkerExited(local_rank=0, rank=0, pid=1000, exit_code=0, attempt=0))
        second = await running.on_event(ctx, WorkerExited(local_rank=1, rank=1, pid=1001, exit_code=3, attempt=0))
        return first, second

    first, second = asyncio.run(both())
    assert first is None
    assert second.trigger is Trigger.worker_failed
    assert ctx.run.failure.rank == 1


class BothOk(ExitedGroup):
    """Both workers exited 0 at the same moment."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.workers = {0: ExitedWorker(1000, 0, 0, loop), 1: ExitedWorker(1001, 1, 0, loop)}


def test_a_success_logs_the_exits_still_queued_behind_it(tmp_path):
    """Both exits are in when RUNNING handles the first: the attempt succeeds on it, and the second worker's exit,
    which RUNNING will never handle, is logged all the same (runner report shows it ok, not stopped)."""
    ctx = make_ctx(tmp_path)
    other = StopRequested(2, graceful=True)

    async def both() -> object:
        ctx.run.group = BothOk(asyncio.get_running_loop())
        ctx.events.put_nowait(WorkerExited(local_rank=1, rank=1, pid=1001, exit_code=0, attempt=0))
        ctx.events.put_nowait(WorkerExited(local_rank=0, rank=0, pid=999, exit_code=1, attempt=0))  # stale
        ctx.events.put_nowait(other)
        return await running.on_event(ctx, WorkerExited(local_rank=0, rank=0, pid=1000, exit_code=0, attempt=0))

    step = asyncio.run(both())
    assert step.trigger is Trigger.workers_succeeded
    exits = [kw for _, event, kw in ctx.log.lines if event == "worker_exited"]
    assert exits == [{"rank": 0, "pid": 1000, "exit_code": 0}, {"rank": 1, "pid": 1001, "exit_code": 0}]
    assert ctx.events.qsize() == 2  # the stale exit and the stop request stay for the states after


@pytest.mark.parametrize(("nodes", "members", "level"), [((2, 2), 2, "info"), ((1, 1), 1, "info"), ((2, 4), 2, "warning")])
def test_a_culprit_kept_in_is_warned_about_only_where_the_job_could_have_gone_on_without_it(
        tmp_path, nodes, members, level):
    """The hang's only culprit is on this node, but the round without it would fall below nodes.min: it stays in.
    A fixed-size job (or a round of one) can never do otherwise: that is the job's shape, said once in agent.jsonl
    (info), not warned after every hang (issue 40: repeated on fixed two-node jobs). An elastic job at its minimum
    is warned about."""
    ctx = make_ctx(tmp_path)
    ctx.inputs = dataclasses.replace(ctx.inputs, spec=dataclasses.replace(ctx.spec, nodes=Nodes(*nodes)))
    names = tuple(f"n{i}" for i in range(members))
    ctx.run.result = RendezvousResult(0, "n0", 0, members, 2, "127.0.0.1", 1, nodes=names)
    verdict = Verdict(Finding.NEVER_ENTERED, culprits=((1, "n0"),))
    assert failed.kept_out(ctx, verdict) == ""
    said = [(lvl, event) for lvl, event, _ in ctx.log.lines if event == "culprit_kept_in"]
    assert said == [(level, "culprit_kept_in")]


@pytest.mark.parametrize(("mending", "news_after", "found"), [
    (True, 0.4, True),  # the store mends past the usual wait: the news it then carries is waited for
    (False, 0.4, False),  # nothing mends: the usual wait (PEER_SETTLE_S + lease_ttl) and no longer
    (True, 2.0, False),  # mending for ever: at most connect_timeout more
])
def test_the_wait_for_a_lost_peers_news_goes_on_while_the_rendezvous_mends_its_store(
        tmp_path, monkeypatch, mending, news_after, found):
    """A rank died of a closed connection; the peer's loss is heard only once a hosted founder went on alone and let
    the lost node go (CI: 0.6 s after lease_ttl + 3 s, and the gloo collateral was charged as a restart)."""
    from runner.events import PeerLost
    rdzv = FakeRendezvous()
    rdzv.mending = mending
    ctx = make_ctx(tmp_path, rdzv)
    rendezvous_spec = dataclasses.replace(ctx.spec.rendezvous, lease_ttl=0.2, connect_timeout=1.0)
    ctx.inputs = dataclasses.replace(ctx.inputs, spec=dataclasses.replace(ctx.spec, rendezvous=rendezvous_spec))
    ctx.run.result = RendezvousResult(0, "n0", 0, 2, 1, "127.0.0.1", 1, nodes=("n0", "n1"))
    monkeypatch.setattr(running, "PEER_SETTLE_S", 0.0)  # the usual wait: lease_ttl, 0.2 s

    async def go():
        loop = asyncio.get_running_loop()
        loop.call_later(news_after, ctx.events.put_nowait, PeerLost("n1", "lease expired"))
        return await running.peer_news(ctx)

    heard = run(go())
    assert (heard is not None) is found, heard
    if found:
        assert heard.node == "n1"
