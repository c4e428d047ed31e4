"""Signals as a scheduler sends them: the real runner, real workers. Each stop signal ends the job and is forwarded
to the workers; the handled set comes from shutdown.signals_to_handle."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest
from conftest import alive, wait_for
from hypothesis import given
from hypothesis import strategies as st
from torchft_mark import needs_torchft

from runner.events import StopRequested
from runner.system import signals
from runner.system.stop_scope import StopScope

ESCAPE_JOB = """
version: 1
name: sig
entrypoint:
  script: {script}
  args: ["--dir", "${{OUT}}", "--signals"]
nproc_per_node: 2
logs: {{dir: "${{LOGS}}"}}
shutdown: {{grace_period: 20s{extra}}}
"""


def escape_job(job, extra: str = ""):
    from fixtures.workers.plans import ESCAPE

    return job(ESCAPE_JOB.format(script=ESCAPE, extra=extra))


def ranks(j) -> list[dict[str, int]]:
    return [json.loads((j.out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT])
def test_scheduler_signals_stop_the_job_and_reach_the_workers(job, sig: signal.Signals) -> None:
    """SIGHUP / SIGQUIT to the runner: every worker gets that signal, the runner exits 128+N, nothing is left."""
    j = escape_job(job)
    proc = j.start()
    wait_for(lambda: all((j.out / f"rank{r}.json").exists() for r in (0, 1)), what="workers to start")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err
    for r, info in enumerate(ranks(j)):
        assert (j.out / f"rank{r}.signals").read_text() == f"{sig.name}\n"
        assert not alive(info["pid"]) and not alive(info["escapee"])


@pytest.mark.integration
def test_unhandled_signal_kills_the_agent_and_the_guard_cleans_up(job) -> None:
    """With signals_to_handle: [SIGTERM], SIGHUP ends the agent by its default action; the guard then kills every
    worker and the workers' setsid() grandchildren."""
    j = escape_job(job, ", signals_to_handle: [SIGTERM]")
    inherited = signal.signal(signal.SIGHUP, signal.SIG_DFL)  # under nohup the agent would inherit SIG_IGN
    try:
        proc = j.start()
    finally:
        signal.signal(signal.SIGHUP, inherited)
    wait_for(lambda: all((j.out / f"rank{r}.json").exists() for r in (0, 1)), what="workers to start")
    proc.send_signal(signal.SIGHUP)
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGHUP
    pids = [p for info in ranks(j) for p in (info["pid"], info["escapee"])]
    wait_for(lambda: not any(alive(p) for p in pids), what="the guard to kill every job process")


@pytest.mark.integration
def test_agent_sigkilled_leaves_nothing(job) -> None:
    """SIGKILL the real runner: its workers and their setsid() grandchildren die (the guard)."""
    j = escape_job(job)
    proc = j.start()
    wait_for(lambda: all((j.out / f"rank{r}.json").exists() for r in (0, 1)), what="workers to start")
    proc.kill()
    proc.communicate(timeout=60)
    pids = [p for info in ranks(j) for p in (info["pid"], info["escapee"])]
    wait_for(lambda: not any(alive(p) for p in pids), what="the guard to kill every job process")


def test_every_handled_signal_becomes_a_stop_request_carrying_it() -> None:
    """install(): each named signal is recorded in the stop scope at once and delivered on the queue as
    StopRequested(signum); a second one sets hurry."""
    async def main() -> tuple[list[StopRequested], list[StopRequested], bool, tuple[signal.Signals, ...]]:
        events: asyncio.Queue[object] = asyncio.Queue()
        scope = StopScope(events)  # type: ignore[arg-type]
        hurry = asyncio.Event()
        handled = signals.install(scope, hurry, names=("SIGHUP", "SIGQUIT"))
        try:
            signal.raise_signal(signal.SIGHUP)
            signal.raise_signal(signal.SIGQUIT)
            at_once = list(scope.received)  # no loop turn yet: the handler itself recorded them
            got = [await asyncio.wait_for(events.get(), 10) for _ in range(2)]
        finally:
            signals.uninstall(handled)
        return at_once, got, hurry.is_set(), handled  # type: ignore[return-value]

    at_once, got, hurried, handled = asyncio.run(main())
    assert [e.signum for e in at_once] == [signal.SIGHUP, signal.SIGQUIT]
    assert got == at_once
    assert not any(e.graceful for e in got)
    assert hurried
    assert handled == (signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR2)


def test_a_stop_reaches_every_inner_scope_with_its_cause() -> None:
    """A replica group's scope sits inside the job's: a signal reaches it at once; the job's own stop (pass_down)
    reaches only the groups, with its reason and no signal."""
    async def main() -> tuple[StopScope, StopScope, list[object]]:
        job = StopScope(asyncio.Queue())
        group_events: asyncio.Queue[object] = asyncio.Queue()
        group = job.inside(group_events)  # type: ignore[arg-type]
        job.note(StopRequested(signal.SIGTERM, graceful=True))
        job.pass_down(StopRequested(0, graceful=False, reason="too few groups"))
        return job, group, [group_events.get_nowait() for _ in range(group_events.qsize())]

    job, group, queued = asyncio.run(main())
    assert job.stopping() is None and job.requested() == StopRequested(signal.SIGTERM, graceful=True)
    assert group.stopping() == StopRequested(0, graceful=False, reason="too few groups")
    assert queued == [StopRequested(0, graceful=False, reason="too few groups")]  # note() alone delivers nothing


def test_a_scope_made_after_a_stop_is_stopped_too() -> None:
    """A stop that reached the job while its groups were being made reaches the groups made after it."""
    async def main() -> tuple[StopScope, list[object]]:
        job = StopScope(asyncio.Queue())
        job.request(StopRequested(signal.SIGINT, graceful=False))
        events: asyncio.Queue[object] = asyncio.Queue()
        group = job.inside(events)  # type: ignore[arg-type]
        return group, [events.get_nowait() for _ in range(events.qsize())]

    group, queued = asyncio.run(main())
    assert group.stopping() == StopRequested(signal.SIGINT, graceful=False)
    assert queued == [StopRequested(signal.SIGINT, graceful=False)]


@given(st.lists(st.sampled_from(["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1"]), min_size=1))
def test_torchelastic_env_lists_each_signal_once_in_order(names: list[str]) -> None:
    """TORCHELASTIC_SIGNALS_TO_HANDLE: the names, comma-separated, first occurrence order."""
    value = signals.torchelastic_env(names)["TORCHELASTIC_SIGNALS_TO_HANDLE"]
    assert value.split(",") == list(dict.fromkeys(names))


def test_default_matches_torchrun() -> None:
    """The default set is torchrun's: SIGTERM, SIGINT, SIGHUP, SIGQUIT."""
    assert signals.torchelastic_env() == {"TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT"}


GROUP_SIGNAL_WORKER = """
import json, os, signal, sys, time
out, code = sys.argv[1], int(sys.argv[2])
def on_term(signum, frame):
    sys.exit(code)  # a handler that saved and stopped (0), or one that reports an error (1)
signal.signal(signal.SIGTERM, on_term)
me = os.environ.get("REPLICA_GROUP_ID", os.environ["RANK"])  # one worker per group, or two ranks
with open(os.path.join(out, f"rank{me}.json.tmp"), "w") as f:  # then renamed: the test reads it once it exists
    json.dump({"pid": os.getpid()}, f)
os.replace(os.path.join(out, f"rank{me}.json.tmp"), os.path.join(out, f"rank{me}.json"))
while True:
    time.sleep(0.2)
"""


def zombie_or_gone(pid: int) -> bool:
    """The process has exited (a zombie its stopped parent has not reaped yet, or gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True




@pytest.mark.integration
@pytest.mark.parametrize(("code", "groups"), [
    (0, False), (1, False),
    pytest.param(0, True, marks=needs_torchft),
])
def test_a_signal_that_reaches_the_workers_too_stops_the_job(job, code: int, groups: bool) -> None:
    """SIGTERM sent to the agent and its workers at once (a Slurm step, a terminal's process group): the workers may
    exit before the agent runs its handler. Made certain here by SIGSTOPping the agent meanwhile: it then sees the
    exits before the signal. The job is stopped (128+15), not succeeded (code 0) nor failed and restarted (code 1);
    with replica groups too (the job's stop scope holds each group's: the signal is recorded in every one at once)."""
    shape = "replica_groups: {count: 2, nproc_per_node: 1}" if groups else "nproc_per_node: 2"
    j = job(f"""
        version: 1
        name: groupsig
        entrypoint: {{script: worker.py, args: ["${{OUT}}", "{code}"]}}
        {shape}
        restart: {{max_restarts: 3}}
        logs: {{dir: "${{LOGS}}"}}
        """)
    (j.tmp / "worker.py").write_text(GROUP_SIGNAL_WORKER)
    proc = j.start()
    wait_for(lambda: all((j.out / f"rank{r}.json").exists() for r in (0, 1)), what="workers to start")
    pids = [json.loads((j.out / f"rank{r}.json").read_text())["pid"] for r in (0, 1)]
    proc.send_signal(signal.SIGSTOP)
    try:
        proc.send_signal(signal.SIGTERM)
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        wait_for(lambda: all(zombie_or_gone(p) for p in pids), what="both workers to exit")
    finally:
        proc.send_signal(signal.SIGCONT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    report = json.loads((j.run_dir() / "report.json").read_text())
    assert (report["outcome"], report["restarts"], report["failures"]) == ("stopped", 0, [])
    triggers = [e[1] for e in j.edges()]
    assert "workers_succeeded" not in triggers and "worker_failed" not in triggers, triggers
    assert triggers.count("stop_requested") == (2 if groups else 1), triggers


def test_a_stop_a_group_sees_goes_to_the_job_once_and_reaches_every_group() -> None:
    """`runner stop` through etcd is seen by each group's rendezvous: given to the job's scope (outermost), it is
    recorded once by the job and delivered once to each group."""
    async def main() -> tuple[StopScope, list[StopScope], list[list[object]]]:
        job = StopScope(asyncio.Queue())
        queues: list[asyncio.Queue[object]] = [asyncio.Queue(), asyncio.Queue()]
        groups = [job.inside(q) for q in queues]  # type: ignore[arg-type]
        stop = StopRequested(0, graceful=False)
        for g in groups:  # each group's monitor hands it on
            assert g.outermost() is job
            g.outermost().request_once(stop)
        return job, groups, [[q.get_nowait() for _ in range(q.qsize())] for q in queues]

    job, groups, queued = asyncio.run(main())
    assert job.received == [StopRequested(0, graceful=False)] and job.stopping() is not None
    assert all(g.stopping() == StopRequested(0, graceful=False) for g in groups)
    assert queued == [[StopRequested(0, graceful=False)]] * 2
