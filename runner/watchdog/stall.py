"""A hang found with no change to the script: no rank of this node made progress for `watchdog.stall_timeout`.

On by default (300 s), with the watchdog itself off: nothing is given to the workers, nothing is asked of the script.
Every few seconds (a quarter of the bound, at most SAMPLE_S) the agent reads, for each running worker of its node,
what the worker already exposes:

- the CPU time of its whole process tree (/proc/<pid>/stat utime+stime+cutime+cstime of the worker and of every
  descendant, found through /proc/<pid>/task/<tid>/children: data-loader workers included, and the children they
  reaped);
- the bytes its tree read and wrote (/proc/<pid>/io rchar+wchar: files, pipes and sockets, so a collective that moves
  data counts as much as a checkpoint being written);
- its heartbeat file (RUNNER_HEARTBEAT_FILE: a touch or a new step) where the script has one;
- its flight recorder (a new collective entered or one completed), read only for a job that has been still for half
  the bound (a dump costs the worker a little CPU: that sample is taken again after the read, so the read itself
  never counts).

A rank made progress in a sample's interval when its CPU time grew by at least CPU_SHARE of the interval (5% of
one core), its I/O by at least IO_BYTES, or its heartbeat or flight recorder changed. Measured on 2 CPUs with
torch 2.x: a rank blocked in a gloo all_reduce or barrier, with the flight-recorder server waiting in accept(), uses
6-8 clock ticks (60-80 ms) of CPU in 30 s, about 0.2-0.3% of a core, and does no I/O (docs/hangs.md). The node is
still when no rank of it made progress for the whole bound; with several nodes, the job stalls when no other node
published progress within the bound either (`progress_at` in each node's status: a node whose ranks wait for another
node's checkpoint is not hung). The hang then goes the heartbeat's way (runner/watchdog/service.py): every rank's
flight recorder is read and the culprit named (runner/hangs.py), the stacks taken, the first running worker SIGKILLed
through its pidfd, and a TimerExpired (scope "stall") fails the attempt, for the restart policy to decide.

The arithmetic (`Progress`) is pure: readings and times come in, nothing is read or timed inside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import structlog

from runner.events import TimerExpired
from runner.hangs import Culprit, read_dump
from runner.rundir.layout import stacks_file
from runner.system.soft_io import warn_once
from runner.watchdog.clock import Clock, SystemClock
from runner.watchdog.flight import QUERY_TIMEOUT_S, FlightRecorder, query
from runner.watchdog.heartbeat import signature
from runner.watchdog.stacks import capture_stacks
from runner.workers.group import Worker, WorkerGroup

SAMPLE_S = 5.0  # at most this long between two samples
MIN_SAMPLE_S = 0.05
CPU_SHARE = 0.05  # of one core over the interval: a blocked gloo wait uses about 0.2%
MIN_CPU_TICKS = 3  # never less than this many clock ticks (short intervals: a tick is 10 ms)
IO_BYTES = 64 << 10  # read + written over the interval (a log line a second is a few KiB a minute)
MAX_TREE = 4096  # processes read per worker's tree, at most
TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

FlightSign = tuple[int, int, int]  # (calls, calls done, the newest call's creation time in ns)


# -- /proc text ---------------------------------------------------------------------------------------------------

def cpu_ticks(stat: str) -> int | None:
    """The sum utime + stime + cutime + cstime (clock ticks) of one /proc/<pid>/stat line; None when it is not one.

    comm (the second field) may hold spaces and parentheses: the fields are counted after the last ')'.
    """
    head, sep, tail = stat.rpartition(")")
    fields = tail.split()
    if not sep or " (" not in head or len(fields) < 15:
        return None
    values = [count(fields[i]) for i in (11, 12, 13, 14)]
    return sum(v for v in values if v is not None) if all(v is not None for v in values) else None


def io_bytes(text: str) -> int | None:
    """The sum rchar + wchar of one /proc/<pid>/io text (bytes read and written, files and sockets); None: none."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("rchar", "wchar") and (number := count(value.strip())) is not None:
            found[key.strip()] = number
    return sum(found.values()) if found else None


def children(text: str) -> list[int]:
    """The pids of one /proc/<pid>/task/<tid>/children text (space-separated); anything else is left out."""
    return [pid for word in text.split() if (pid := count(word))]


def count(word: str) -> int | None:
    """A decimal count as the kernel writes it (ASCII digits only), else None."""
    return int(word) if word.isascii() and word.isdigit() else None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(65536)
    except OSError:
        return None


def tree(pid: int, limit: int = MAX_TREE) -> Iterator[int]:
    """`pid` and its descendants (each task's children), at most `limit` of them, each once."""
    seen: set[int] = set()
    todo = [pid]
    while todo and len(seen) < limit:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        yield p
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tasks:
            text = _read(f"/proc/{p}/task/{tid}/children")
            if text:
                todo.extend(children(text))


@dataclass(frozen=True)
class Reading:
    """What one rank exposed at one sample (None: could not be read)."""

    cpu: int | None = None  # clock ticks of its whole process tree
    io: int | None = None  # bytes read and written by its whole process tree
    beat: object = None  # its heartbeat file's signature (None: no file)
    calls: FlightSign | None = None  # its flight recorder (None: not read this time)


def read_tree(pid: int, heartbeat: Path | None) -> Reading:
    """The reading of the worker `pid` and its descendants (a process gone meanwhile is left out)."""
    cpu = io = None
    for p in tree(pid):
        stat = _read(f"/proc/{p}/stat")
        ticks = cpu_ticks(stat) if stat is not None else None
        if ticks is not None:
            cpu = (cpu or 0) + ticks
        text = _read(f"/proc/{p}/io")
        moved = io_bytes(text) if text is not None else None
        if moved is not None:
            io = (io or 0) + moved
    return Reading(cpu, io, signature(heartbeat) if heartbeat is not None else None)


# -- the arithmetic -----------------------------------------------------------------------------------------------

@dataclass
class _Rank:
    last: Reading
    calls: FlightSign | None = None  # the last flight-recorder reading (read only now and then)


class Progress:
    """Which ranks moved between two samples, and how long the whole node has been still.

    `update(now, readings)` compares each rank's reading with its previous one; a rank seen for the first time
    (a new worker) counts as moving. Counters that went down (a child exited unreaped) are only a new baseline.
    """

    def __init__(self, bound: float, *, ticks_per_s: float = TICKS_PER_S, cpu_share: float = CPU_SHARE,
                 min_ticks: int = MIN_CPU_TICKS, io_bytes: int = IO_BYTES) -> None:
        self.bound = bound
        self.ticks_per_s, self.cpu_share, self.min_ticks, self.io_bytes = ticks_per_s, cpu_share, min_ticks, io_bytes
        self._ranks: dict[int, _Rank] = {}
        self._at: float | None = None  # the previous sample
        self.moved_at: float | None = None  # the last sample at which a rank had moved (or the start)

    def start(self, now: float, readings: Mapping[int, Reading]) -> None:
        """A new set of workers: their readings now are the baseline, and the node counts as moving now."""
        self._ranks = {r: _Rank(reading, reading.calls) for r, reading in readings.items()}
        self._at = self.moved_at = now

    def cpu_needed(self, seconds: float) -> float:
        """Clock ticks a rank's tree must use over `seconds` to count as moving."""
        return max(self.min_ticks, self.cpu_share * seconds * self.ticks_per_s)

    def moved(self, before: _Rank, now: Reading, seconds: float) -> str | None:
        """What moved between `before` and `now` (None: nothing beyond the thresholds)."""
        last = before.last
        if now.cpu is not None and last.cpu is not None and now.cpu - last.cpu >= self.cpu_needed(seconds):
            return "cpu"
        if now.io is not None and last.io is not None and now.io - last.io >= self.io_bytes:
            return "io"
        if now.beat != last.beat and now.beat is not None:
            return "heartbeat"
        if now.calls is not None and before.calls is not None and now.calls != before.calls:
            return "collectives"
        return None

    def update(self, now: float, readings: Mapping[int, Reading]) -> dict[int, str]:
        """Take one sample: the ranks that moved since the previous one, and what moved."""
        if self._at is None:
            self.start(now, readings)
            return {}
        seconds = max(now - self._at, 0.0)
        moved: dict[int, str] = {}
        for rank, reading in readings.items():
            before = self._ranks.get(rank)
            if before is None:
                moved[rank] = "started"
                self._ranks[rank] = _Rank(reading, reading.calls)
                continue
            what = self.moved(before, reading, seconds)
            if what is not None:
                moved[rank] = what
            before.last = reading
            if reading.calls is not None:
                before.calls = reading.calls
        for rank in set(self._ranks) - set(readings):
            del self._ranks[rank]
        self._at = now
        if moved:
            self.moved_at = now
        return moved

    def rebase(self, now: float, rank: int, reading: Reading) -> bool:
        """`rank`'s flight recorder read, and its counters taken again after the read (which made it work).

        Whether its collectives moved since the last read (a rank entered or completed one): then the node moved now.
        """
        known = self._ranks.get(rank)
        if known is None:
            return False
        known.last = Reading(reading.cpu, reading.io, known.last.beat)
        moved = reading.calls is not None and known.calls is not None and reading.calls != known.calls
        if reading.calls is not None:
            known.calls = reading.calls
        if moved:
            self.moved_at = now
        return moved

    def still_for(self, now: float) -> float:
        """Seconds since a rank last moved (0 before the first sample)."""
        return 0.0 if self.moved_at is None else max(now - self.moved_at, 0.0)

    def stalled(self, now: float) -> bool:
        """No rank moved for the whole bound."""
        return self.moved_at is not None and self.still_for(now) >= self.bound


# -- the service --------------------------------------------------------------------------------------------------

class EventSink(Protocol):
    """Where TimerExpired goes: the agent's event queue."""

    def put_nowait(self, item: TimerExpired, /) -> None:
        """Queue one event without waiting."""
        ...


def flight_sign(body: bytes) -> FlightSign | None:
    """(calls, calls done, newest creation) of one flight-recorder dump; None when it holds no records."""
    calls = read_dump(body)
    if calls is None:
        return None
    return (len(calls), sum(1 for c in calls if c.done), max((c.created_ns for c in calls), default=0))


class StallWatch:
    """Samples the current workers of this node; on a stall, names the culprit and fails the attempt."""

    def __init__(self, bound: float, *, events: EventSink, log: structlog.typing.FilteringBoundLogger,
                 group: Callable[[], WorkerGroup | None], node: str = "", recorder: FlightRecorder | None = None,
                 capture: bool = True, clock: Clock | None = None,
                 sample: Callable[[Worker], Reading] | None = None,
                 elsewhere: Callable[[], Awaitable[float]] | None = None) -> None:
        """Watch the workers `group()` gives; `elsewhere` (several nodes) tells how long ago another node moved.

        `elsewhere`: seconds since a rank of another node of the job last moved (inf: none known); asked before
        acting, so that a node whose ranks wait for another node's busy rank (a checkpoint) is never stalled.
        """
        self.bound = bound
        self.elsewhere = elsewhere
        self._waiting_on: float | None = None  # the other nodes' last progress this node's stall waits behind
        self.events, self.log, self.group, self.node = events, log, group, node
        self.recorder, self.capture = recorder, capture
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.interval = min(max(bound / 4, MIN_SAMPLE_S), SAMPLE_S)
        self.progress = Progress(bound)
        self._sample = sample if sample is not None else _sample
        self._pids: tuple[int, ...] = ()  # the workers being watched
        self._fired: tuple[int, ...] | None = None  # the workers a stall was reported for (not watched again)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Sample from now on (call on the agent's event loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop sampling; a kill in flight is cancelled."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must never take the agent down: the job runs on, unwatched
                self.log.exception("stall_check_failed")

    def workers(self) -> list[Worker]:
        """The current attempt's running workers (none while it is being stopped or replaced)."""
        group = self.group()
        if group is None or group.stopping:
            return []
        return sorted(group.running(), key=lambda w: w.plan.local_rank)

    async def check(self) -> None:
        """One sample of every running worker; report a stall once per set of workers."""
        workers = self.workers()
        pids = tuple(w.pid for w in workers)
        now = self.clock.monotonic()
        if not workers:
            self._pids = ()
            return
        readings = {w.plan.local_rank: self._sample(w) for w in workers}
        if pids != self._pids:  # a new attempt (or a worker replaced, or one finished): a fresh baseline
            self._pids, self._waiting_on = pids, None
            self.progress.start(now, readings)
            return
        if pids == self._fired:
            return
        moved = self.progress.update(now, readings)
        if moved:
            self._waiting_on = None
            return
        still = self.progress.still_for(now)
        if self.recorder is not None and self.recorder.entries and still >= self.bound / 2:
            if await self.flight_moved(workers):
                return
            still = self.progress.still_for(self.clock.monotonic())
        if self.progress.stalled(self.clock.monotonic()):
            if self.elsewhere is not None and (age := await self.elsewhere()) < self.bound:
                if self._waiting_on is None:
                    self.log.info("stall_elsewhere_moving", still_s=round(still, 1),
                                  other_node_moved_s_ago=round(age, 1),
                                  detail="this node's ranks are still, another node's move: not a hang (yet)")
                self._waiting_on = age
                return
            self._fired = pids
            await self.stalled(workers, still)

    def moved_at_wall(self) -> float | None:
        """When a rank of this node last moved, in epoch seconds (None: no workers watched).

        What the node publishes (`progress_at`) for the other nodes' detectors.
        """
        if not self._pids or self.progress.moved_at is None:
            return None
        return time.time() - self.progress.still_for(self.clock.monotonic())

    async def flight_moved(self, workers: list[Worker]) -> bool:
        """Read every rank's flight recorder: whether a rank entered or completed a collective since the last read."""
        assert self.recorder is not None
        socks = {w.plan.local_rank: self.recorder.socket(w.plan.local_rank) for w in workers}
        bodies = await asyncio.gather(*(_dump(socks[w.plan.local_rank]) for w in workers))
        moved = False
        now = self.clock.monotonic()
        for w, body in zip(workers, bodies, strict=True):
            sign = flight_sign(body) if body is not None else None
            again = self._sample(w)  # the dump cost the worker some CPU: that is not its progress
            moved = self.progress.rebase(now, w.plan.local_rank, Reading(again.cpu, again.io, None, sign)) or moved
        return moved

    async def stalled(self, workers: list[Worker], still: float) -> None:
        """No rank moved for the bound: name the culprit, take the stacks, SIGKILL one worker, fail the attempt."""
        ranks = [w.plan.rank for w in workers]
        self.log.warning("stall", still_s=round(still, 1), bound_s=self.bound, ranks=ranks)
        found: Culprit | None = None
        if self.recorder is not None:
            found = await self.recorder.named(workers)
        worker = next((w for w in workers if not w.exited.done()), None)
        if worker is None:
            return
        stacks = await capture_stacks(worker.pid, log=self.log) if self.capture else ""
        if worker.exited.done():  # not reaped before exited is set: until then the pid is still our worker's
            return
        if not worker.send_signal(signal.SIGKILL):  # through its pidfd: never a recycled pid
            return
        where = f" of node {self.node}" if self.node else ""
        reason = (f"watchdog: no rank{where} made progress for {still:.1f} s (stall_timeout {self.bound:g} s): "
                  f"no CPU time, I/O, heartbeat or collective in rank(s) {_ranks(ranks)}")
        if stacks:
            _keep(stacks_file(worker.plan.log_dir), stacks)
        self.events.put_nowait(TimerExpired(worker.plan.local_rank, worker.plan.rank, worker.pid, "stall",
                                            still - self.bound, stacks, reason, found))


def _keep(path: Path, stacks: str) -> None:
    try:
        path.write_text(stacks, encoding="utf-8")
    except OSError as e:  # a full or read-only logs disk: the failure (report.json) keeps them too
        warn_once("stacks_write_failed", path, e)


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks) if len(ranks) <= 8 else f"{ranks[0]}-{ranks[-1]}"


def _sample(worker: Worker) -> Reading:
    return read_tree(worker.pid, Path(worker.plan.heartbeat_file) if worker.plan.heartbeat_file else None)


async def _dump(path: str) -> bytes | None:
    """One rank's flight-recorder dump, or None (no server, no answer within the bound, an error)."""
    if not path:
        return None
    try:
        return await asyncio.wait_for(query(path), QUERY_TIMEOUT_S)
    except (OSError, ValueError, TimeoutError):
        return None
