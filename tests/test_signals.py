"""Signals as a scheduler sends them: the real runner, real workers. Each stop signal ends the job and is forwarded
to the workers; the handled set comes from shutdown.signals_to_handle."""

from __future__ import annotations

import asyncio
import json
import signal

import pytest
from conftest import alive, wait_for
from hypothesis import given
from hypothesis import strategies as st

from runner.events import StopRequested
from runner.system import signals

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
    from workers.plans import ESCAPE

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
    proc = j.start()
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
    """install(): each named signal puts StopRequested(signum) on the queue; a second one sets hurry."""
    async def main() -> tuple[list[StopRequested], bool, tuple[signal.Signals, ...]]:
        events: asyncio.Queue[object] = asyncio.Queue()
        hurry = asyncio.Event()
        handled = signals.install(events, hurry, names=("SIGHUP", "SIGQUIT"))
        try:
            signal.raise_signal(signal.SIGHUP)
            signal.raise_signal(signal.SIGQUIT)
            got = [await asyncio.wait_for(events.get(), 10) for _ in range(2)]
        finally:
            for s in handled:
                asyncio.get_running_loop().remove_signal_handler(s)
        return got, hurry.is_set(), handled  # type: ignore[return-value]

    got, hurried, handled = asyncio.run(main())
    assert [e.signum for e in got] == [signal.SIGHUP, signal.SIGQUIT]
    assert not any(e.graceful for e in got)
    assert hurried
    assert handled == (signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR2)


@given(st.lists(st.sampled_from(["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1"]), min_size=1))
def test_torchelastic_env_lists_each_signal_once_in_order(names: list[str]) -> None:
    """TORCHELASTIC_SIGNALS_TO_HANDLE: the names, comma-separated, first occurrence order."""
    value = signals.torchelastic_env(names)["TORCHELASTIC_SIGNALS_TO_HANDLE"]
    assert value.split(",") == list(dict.fromkeys(names))


def test_default_matches_torchrun() -> None:
    """The default set is torchrun's: SIGTERM, SIGINT, SIGHUP, SIGQUIT."""
    assert signals.torchelastic_env() == {"TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT"}
