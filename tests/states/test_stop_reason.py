"""Who stopped the job, as each node's console says it (issue 40's user trial on simulated hosts).

Ctrl-C of the node that hosts the rendezvous stops every node (runner/rendezvous/etcd/hosted.py writes the control
key with `why`); the other nodes said `RUNNING → SHUTDOWN  stop requested (runner stop)`, though nobody ran it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import test_states as states_t

from runner.config.loader import load_spec_text
from runner.core.machine import Trigger
from runner.errors import JobClosed
from runner.events import StopRequested
from runner.observe.console import ConsoleRenderer
from runner.outcomes import Outcome
from runner.rendezvous.base import RendezvousResult
from runner.rendezvous.etcd import hosted
from runner.rendezvous.etcd.keys import JobKeys, dump
from runner.rendezvous.etcd.monitor import RoundMonitor
from runner.states import rendezvous

RESULT = RendezvousResult(round=0, node="b", group_rank=1, group_world_size=2, nproc_per_node=2, master_addr="a",
                          master_port=29500, nodes=("a", "b"))


def stop_seen(control: object) -> StopRequested:
    """The StopRequested a round's monitor passes on for a control key holding `control`."""
    seen: list[StopRequested] = []
    events: asyncio.Queue[object] = asyncio.Queue()
    monitor = RoundMonitor(None, None, RESULT, 2, events)  # type: ignore[arg-type]
    monitor.stops = seen.append
    monitor._on_control(control)  # the control key's meaning, without an etcd
    (stop,) = seen
    return stop


def test_a_stop_the_hosting_node_wrote_says_so() -> None:
    stop = stop_seen({"state": "stopping", "graceful": False, "by": "a", "why": "the hosting node was stopped"})
    assert stop == StopRequested(0, graceful=False, reason="stop requested by node a: the hosting node was stopped")


def test_runner_stop_keeps_its_plain_reason() -> None:
    """`runner stop` writes no `why`: the reason stays empty, and RUNNING says `stop requested (runner stop)`."""
    assert stop_seen({"state": "stopping", "graceful": True, "time": 1.0}) == StopRequested(0, graceful=True)


def test_the_hosting_node_says_on_its_console_that_it_stops_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its own console said only `stop requested (signal 2)`: nothing told the user the other nodes stop too."""
    said: list[dict[str, Any]] = []

    class Recorder:
        def info(self, event: str, **fields: Any) -> None:
            said.append({"event": event, "level": "info", "timestamp": "2026-01-02T03:04:05Z", **fields})

        def bind(self, **_: Any) -> Recorder:
            return self

    async def written(*_: object) -> None:
        return None

    spec = load_spec_text("version: 1\nname: j\nentrypoint: {script: t.py}\nnodes: 2\n"
                          "rendezvous: {backend: etcd, hosted: true, endpoints: ['a:29400']}\n")
    monkeypatch.setattr(hosted, "write_control", written)
    backend = hosted.HostedRendezvous(spec, "a", advertise_addr="a", log=Recorder())  # type: ignore[arg-type]
    control: list[object] = []

    class Session:  # the control key, without an etcd
        async def call(self, _op: object) -> object:
            return SimpleNamespace(value=dump(control[-1])) if control else None

    monkeypatch.setattr(type(backend._inner), "session", property(lambda _: Session()))
    asyncio.run(backend._stop_others())  # this node's own stop (a signal): it asks the others and says so
    (event,) = said
    line = ConsoleRenderer(colors=False)(None, "info", event)
    assert line.endswith(" this node hosts the rendezvous, which stops with it: every other node of the job is "
                         "asked to stop too"), line
    control.append({"state": "stopping", "graceful": True, "time": 1.0})  # `runner stop` asked every node already
    asyncio.run(backend._stop_others())
    assert len(said) == 1  # nothing more to say


# --- a member waiting for its next round when the job is stopped ---

def test_a_member_stopped_in_its_next_rounds_wait_ends_as_its_peers_do(tmp_path: Path) -> None:
    """Seen on two hosts: node a waited for b in round 2 (attempt 2) when `runner stop` came; it said `job 'ddp1'
    stopped after 3 attempts ...; exit code 3` where every running node of the job ends 143. A node that arrives at
    a closed job (attempt 0) still exits 3."""
    for attempt, code in ((2, 143), (0, 3)):
        (tmp_path / str(attempt)).mkdir()
        ctx = states_t.make_ctx(tmp_path / str(attempt), states_t.FakeRendezvous(
            round_error=JobClosed("states", "stopping")))
        ctx.run.attempt = attempt
        step = states_t.run(rendezvous.handle(ctx))
        assert (step.trigger, step.outcome, step.exit_code) == (Trigger.job_closed, Outcome.STOPPED, code)
    (tmp_path / "ended").mkdir()
    ended = states_t.make_ctx(tmp_path / "ended", states_t.FakeRendezvous(round_error=JobClosed("states", "failed")))
    ended.run.attempt = 2
    assert states_t.run(rendezvous.handle(ended)).exit_code == 3  # the job's end, not a stop


def test_a_closed_job_names_the_node_that_stopped_it() -> None:
    keys = JobKeys("/runner", "ddp1")
    with pytest.raises(JobClosed) as caught:
        keys.check_open(dump({"state": "stopping", "graceful": False, "by": "a", "why": "the hosting node was stopped"}))
    assert caught.value.message == "job 'ddp1' is closed (stopped by node a: the hosting node was stopped); not joining"
    with pytest.raises(JobClosed) as plain:
        keys.check_open(dump({"state": "stopping", "graceful": True, "time": 1.0}))
    assert plain.value.message == "job 'ddp1' is closed (stopped by runner stop); not joining"
