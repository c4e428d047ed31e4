"""watchdog.stall_timeout's parts: the spec field, the /proc parsers, the progress arithmetic, the service's loop.

No timed test: times are injected (Progress) or virtual (AutojumpClock); readings are fakes.
"""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from runner.config.loader import load_document
from runner.config.spec import Watchdog
from runner.errors import SpecError
from runner.events import TimerExpired
from runner.watchdog.clock import AutojumpClock
from runner.watchdog.stall import Progress, Reading, StallWatch, children, cpu_ticks, flight_sign, io_bytes

HEAD = "version: 1\nname: s\nentrypoint: train.py\n"


def load(text: str) -> Any:
    return load_document(HEAD + text, source="job.yaml", base_dir="/base", environ={})[0]


def refused(text: str) -> SpecError:
    with pytest.raises(SpecError) as err:
        load(text)
    return err.value


# -- the spec ------------------------------------------------------------------------------------------------------

def test_the_default_is_on_for_5_minutes_and_turns_nothing_else_on() -> None:
    assert Watchdog().stall_timeout == 300.0
    spec = load("")
    assert spec.watchdog.stall_timeout == 300.0
    assert spec.watchdog.enabled is False and spec.watchdog.heartbeat_timeout is None
    assert spec.watchdog.progress_timeout is None


def test_null_turns_it_off_and_a_duration_sets_it() -> None:
    assert load("watchdog: {stall_timeout: null}\n").watchdog.stall_timeout is None
    assert load("watchdog: {stall_timeout: 90s}\n").watchdog.stall_timeout == 90.0
    assert load("watchdog: {stall_timeout: 2m}\n").watchdog.stall_timeout == 120.0


def test_zero_and_garbage_are_refused() -> None:
    assert [p.path for p in refused("watchdog: {stall_timeout: 0}\n").problems] == ["watchdog.stall_timeout"]
    assert [p.path for p in refused("watchdog: {stall_timeout: soon}\n").problems] == ["watchdog.stall_timeout"]


def test_it_works_with_the_watchdog_off_and_is_not_called_unused() -> None:
    """enabled: false gates the file timer; the stall detector, and the fields it uses, still apply."""
    spec = load("watchdog: {enabled: false, stall_timeout: 1m, capture_stacks: false, keep_out_culprit: false}\n")
    assert spec.watchdog.stall_timeout == 60.0 and spec.watchdog.capture_stacks is False
    err = refused("watchdog: {enabled: false, stall_timeout: null, capture_stacks: false}\n")
    assert [p.path for p in err.problems] == ["watchdog.capture_stacks"]


def test_a_written_bound_longer_than_max_run_time_is_refused_the_default_is_not() -> None:
    err = refused("watchdog: {stall_timeout: 10m, max_run_time: 5m}\n")
    (problem,) = err.problems
    assert "watchdog.stall_timeout (600 s) is not shorter than watchdog.max_run_time (300 s)" in problem.message
    assert load("watchdog: {max_run_time: 1m}\n").watchdog.stall_timeout == 300.0  # never fires: harmless


# -- /proc text -----------------------------------------------------------------------------------------------------

COMMS = st.text(st.characters(blacklist_characters="\x00\n", blacklist_categories=("Cs",)), max_size=16)
TICKS = st.integers(0, 2**40)


def stat_line(pid: int, comm: str, times: tuple[int, int, int, int]) -> str:
    """A /proc/<pid>/stat line as the kernel writes it (52 fields), with these utime, stime, cutime, cstime."""
    fields = ["S", "1", "1", "1", "0", "-1", "4194560", "100", "0", "0", "0", *map(str, times)]
    fields += ["20", "0", "3", "0", "12345", "1000000", "300"] + ["0"] * 26
    return f"{pid} ({comm}) " + " ".join(fields) + "\n"


@given(st.integers(1, 2**22), COMMS, st.tuples(TICKS, TICKS, TICKS, TICKS))
def test_cpu_ticks_sums_the_four_times_whatever_the_command_name(pid: int, comm: str, times: Any) -> None:
    assert cpu_ticks(stat_line(pid, comm, times)) == sum(times)


@given(st.one_of(st.text(max_size=300),
                st.builds(lambda pid, comm, rest: f"{pid} ({comm}) {rest}", st.integers(0, 2**22), COMMS,
                          st.lists(st.one_of(st.integers(-5, 2**40).map(str), st.text(max_size=4)), max_size=30)
                          .map(" ".join))))
def test_cpu_ticks_of_any_text_is_a_count_or_none(text: str) -> None:
    """A line cut short, with words that are not counts, or negative ones: never an error, never a negative."""
    found = cpu_ticks(text)
    assert found is None or found >= 0


def test_cpu_ticks_of_a_cut_line_is_none() -> None:
    assert cpu_ticks("123 (python) S 1 1 1") is None
    assert cpu_ticks("") is None


@given(st.integers(0, 2**50), st.integers(0, 2**50), st.integers(0, 2**40))
def test_io_bytes_reads_rchar_and_wchar(rchar: int, wchar: int, other: int) -> None:
    text = (f"rchar: {rchar}\nwchar: {wchar}\nsyscr: {other}\nsyscw: {other}\nread_bytes: {other}\n"
            f"write_bytes: {other}\ncancelled_write_bytes: 0\n")
    assert io_bytes(text) == rchar + wchar


@given(st.one_of(st.text(max_size=300),
                st.lists(st.tuples(st.sampled_from(["rchar", "wchar", "syscr", "x"]),
                                   st.one_of(st.integers(-(2**40), 2**40).map(str), st.text(max_size=5))),
                         max_size=8).map(lambda kv: "".join(f"{k}: {v}\n" for k, v in kv))))
def test_io_bytes_of_any_text_is_a_count_or_none(text: str) -> None:
    found = io_bytes(text)
    assert found is None or found >= 0


@given(st.lists(st.integers(1, 2**22), max_size=20))
def test_children_reads_the_pids(pids: list[int]) -> None:
    assert children(" ".join(map(str, pids)) + " ") == pids


@given(st.text(max_size=200))
def test_children_of_any_text_are_positive_pids(text: str) -> None:
    assert all(isinstance(p, int) and p > 0 for p in children(text))


def test_flight_sign_counts_calls_and_completions() -> None:
    entry = {"collective_seq_id": 1, "pg_id": 0, "profiling_name": "gloo:all_reduce", "input_sizes": [[10]],
             "time_created_ns": 5, "retired": True, "state": "completed"}
    waiting = dict(entry, collective_seq_id=2, time_created_ns=9, retired=False, state="scheduled")
    body = ('{"entries": [' + ", ".join(map(_json, (entry, waiting))) + "]}").encode()
    assert flight_sign(body) == (2, 1, 9)
    assert flight_sign(b'{"version": "2.10", "pg_config": {}}') is None  # the recorder is off
    assert flight_sign(b"not json") == (0, 0, 0)


def _json(value: object) -> str:
    import json

    return json.dumps(value)


# -- the arithmetic -------------------------------------------------------------------------------------------------

IDLE_TICKS_PER_S = 7 / 30  # measured: a rank blocked in a gloo all_reduce or barrier (docs/hangs.md)


def idle(cpu: int, *, beat: object = None) -> Reading:
    return Reading(cpu=cpu, io=1000, beat=beat)


def test_ranks_blocked_in_gloo_stall_after_exactly_the_bound() -> None:
    """Two ranks using what a blocked gloo wait uses: never moving; stalled once the bound has passed."""
    p = Progress(300.0)
    p.start(0.0, {0: idle(100), 1: idle(200)})
    for i in range(1, 60):
        now = i * 5.0
        ticks = round(now * IDLE_TICKS_PER_S)
        assert p.update(now, {0: idle(100 + ticks), 1: idle(200 + ticks)}) == {}
        assert not p.stalled(now)
    assert p.update(300.0, {0: idle(170), 1: idle(270)}) == {}
    assert p.stalled(300.0) and p.still_for(300.0) == 300.0


def test_one_busy_rank_keeps_the_node_moving() -> None:
    p = Progress(10.0)
    p.start(0.0, {0: idle(0), 1: idle(0)})
    cpu = 0
    for i in range(1, 20):
        cpu += 250  # a core's worth: 5 s at 100 ticks/s... and much more than 5% of it
        assert p.update(i * 5.0, {0: idle(cpu), 1: idle(0)}) == {0: "cpu"}
        assert not p.stalled(i * 5.0)


def test_the_cpu_threshold_is_five_percent_of_a_core_over_the_interval() -> None:
    p = Progress(10.0, ticks_per_s=100)
    p.start(0.0, {0: idle(0)})
    assert p.update(5.0, {0: idle(24)}) == {}  # 24 ticks in 5 s: under 5% (25)
    assert p.update(10.0, {0: idle(24 + 25)}) == {0: "cpu"}
    p2 = Progress(1.0, ticks_per_s=100)
    p2.start(0.0, {0: idle(0)})
    assert p2.update(0.25, {0: idle(2)}) == {}  # a short interval: never under MIN_CPU_TICKS (3)
    assert p2.update(0.5, {0: idle(5)}) == {0: "cpu"}


def test_io_heartbeat_and_collectives_each_count() -> None:
    p = Progress(10.0)
    p.start(0.0, {0: Reading(0, 0, None), 1: Reading(0, 0, None)})
    assert p.update(5.0, {0: Reading(0, 64 << 10, None), 1: Reading(0, 0, None)}) == {0: "io"}
    assert p.update(10.0, {0: Reading(0, (64 << 10) + 100, None), 1: Reading(0, 0, None)}) == {}  # a log line
    assert p.update(15.0, {0: Reading(0, (64 << 10) + 100, None), 1: Reading(0, 0, (1, 0, 5, 5))}) == {1: "heartbeat"}
    assert p.moved_at == 15.0
    assert not p.rebase(17.0, 0, Reading(0, 0, None, (4, 3, 100)))  # the first read: a baseline only
    assert p.rebase(19.0, 0, Reading(0, 0, None, (4, 4, 100)))  # a completion
    assert p.moved_at == 19.0
    assert not p.rebase(21.0, 0, Reading(0, 0, None, (4, 4, 100)))
    assert p.moved_at == 19.0


def test_a_rebase_after_a_dump_does_not_count_the_dump_as_progress() -> None:
    p = Progress(10.0)
    p.start(0.0, {0: idle(0)})
    p.rebase(4.0, 0, Reading(500, 1000, None, None))  # the dump cost 500 ticks: now the baseline
    assert p.update(5.0, {0: idle(501)}) == {}


def test_a_counter_that_went_down_is_a_new_baseline_not_progress() -> None:
    p = Progress(10.0)
    p.start(0.0, {0: idle(1000)})
    assert p.update(5.0, {0: idle(10)}) == {}  # a data-loader worker exited unreaped: its ticks left the tree
    assert p.update(10.0, {0: idle(12)}) == {}
    assert p.stalled(10.0)


def test_a_new_rank_counts_as_moving_and_a_gone_one_is_forgotten() -> None:
    p = Progress(10.0)
    p.start(0.0, {0: idle(0)})
    assert p.update(9.0, {0: idle(0), 1: idle(0)}) == {1: "started"}
    assert p.update(18.0, {1: idle(0)}) == {}
    assert not p.stalled(18.0) and p.stalled(19.0)


def test_unreadable_counters_are_not_progress() -> None:
    p = Progress(10.0)
    p.start(0.0, {0: Reading(None, None, None)})
    assert p.update(5.0, {0: Reading(10**6, 10**9, None)}) == {}  # readable again: a baseline only
    assert p.update(10.0, {0: Reading(None, None, None)}) == {}
    assert p.stalled(10.0)


# -- the service, on a virtual clock --------------------------------------------------------------------------------

@dataclass
class FakeWorker:
    local_rank: int
    pid: int
    killed: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.plan = SimpleNamespace(local_rank=self.local_rank, rank=self.local_rank, heartbeat_file="",
                                    log_dir="/nonexistent")
        self.exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def send_signal(self, sig: int) -> bool:
        self.killed.append(sig)
        return True


class FakeGroup:
    def __init__(self, workers: list[FakeWorker]) -> None:
        self.workers, self.stopping = workers, False

    def running(self) -> list[FakeWorker]:
        return [w for w in self.workers if not w.exited.done()]


def watch_for(seconds: float, cpu: dict[int, int], busy: dict[int, float]) -> tuple[list[TimerExpired], list[int]]:
    """Run a StallWatch (bound 60 s, no recorder) for `seconds` of virtual time over two fake workers whose CPU
    grows by busy[rank] ticks a second; (the events, the signals sent)."""
    clock = AutojumpClock()
    events: list[TimerExpired] = []

    class Sink:
        def put_nowait(self, item: TimerExpired) -> None:
            events.append(item)

    async def main() -> list[int]:
        workers = [FakeWorker(0, 1000), FakeWorker(1, 1001)]
        group = FakeGroup(workers)
        start = clock.monotonic()

        def sample(w: Any) -> Reading:
            elapsed = clock.monotonic() - start
            return Reading(cpu[w.plan.local_rank] + int(busy[w.plan.local_rank] * elapsed), 0, None)

        watch = StallWatch(60.0, events=Sink(), log=structlog.get_logger("test"), group=lambda: group,  # type: ignore[arg-type,return-value]
                           capture=False, clock=clock, sample=sample)
        watch.start()
        await asyncio.sleep(seconds)
        await watch.stop()
        return [s for w in workers for s in w.killed]

    killed = clock.run(main())
    return events, killed


def test_the_service_reports_a_stall_once_and_kills_one_worker_through_it() -> None:
    events, killed = watch_for(200.0, {0: 10, 1: 10}, {0: IDLE_TICKS_PER_S, 1: IDLE_TICKS_PER_S})
    (event,) = events
    assert event.scope == "stall" and event.local_rank == 0
    assert "made progress for" in event.reason and "stall_timeout 60 s" in event.reason
    assert killed == [signal.SIGKILL]
    still = float(event.reason.split("progress for ")[1].split(" s")[0])
    assert 60.0 <= still <= 60.0 + 15.0  # within the bound and one sample interval (bound/4)


def test_the_service_never_reports_a_node_with_one_busy_rank() -> None:
    events, killed = watch_for(600.0, {0: 10, 1: 10}, {0: 100.0, 1: IDLE_TICKS_PER_S})
    assert events == [] and killed == []


def test_the_sample_interval_is_a_quarter_of_the_bound_at_most_5_s() -> None:
    log: Any = structlog.get_logger("test")
    assert StallWatch(300.0, events=None, log=log, group=lambda: None).interval == 5.0  # type: ignore[arg-type]
    assert StallWatch(6.0, events=None, log=log, group=lambda: None).interval == 1.5  # type: ignore[arg-type]


def test_a_real_process_tree_is_read(tmp_path: Path) -> None:
    """This test's own process: its CPU time and I/O are counted (a sanity check of the paths read)."""
    import os

    from runner.watchdog.stall import read_tree

    before = read_tree(os.getpid(), None)
    assert before.cpu is not None and before.io is not None
    (tmp_path / "f").write_bytes(b"x" * (1 << 20))
    after = read_tree(os.getpid(), None)
    assert after.io is not None and after.io - before.io >= 1 << 20
