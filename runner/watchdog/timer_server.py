"""File-timer server for torch's FileTimerClient, embedded in the agent's event loop: one FIFO per worker.

Each local rank gets its own channel, `<run dir>/timer/rank_<local rank>.fifo`, passed to that worker
(and inherited by its children) as TORCHELASTIC_TIMER_FILE. The wire format is torch's (runner/watchdog/wire.py).
A channel belongs to one worker, so a writer that garbles its stream harms only its own channel, and a
request is accepted only when the pid it names is the channel's worker or one of its descendants.

Unlike torch's server, an expiry never kills the agent: the worker's stacks are captured (py-spy, see
runner/watchdog/stacks.py), the requested signal is sent to the worker only, and `on_expiry` gets an
`Expiry` so the agent's restart policy decides what happens next.

Event-driven: a channel is read when readable (loop.add_reader; one bounded read per wake-up so a flood
cannot starve the loop) and one loop.call_at handle is armed for the earliest deadline. Client deadlines
are wall-clock; they are converted to the monotonic clock when received, so later wall-clock steps do not
move them. Bounded under abuse: at most `max_scopes` scopes per worker, heap entries compacted, refused
requests counted per kind and logged in one summary per `summary_interval`, not one line each; a request refused
for the pid it names (pid 1, the agent, its guard, a process not of the job, another rank's worker, a worker over
its cap) is also a `timer_request_refused` warning naming the pid, rate-limited per pid (runner/watchdog/refusals.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import math
import os
import stat
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from runner.errors import RunnerError
from runner.rundir.layout import timer_dir, timer_fifo
from runner.system.soft_io import describe
from runner.watchdog.clock import Clock, SystemClock
from runner.watchdog.refusals import INTERVAL_S, RefusalLog, who
from runner.watchdog.stacks import capture_stacks
from runner.watchdog.wire import Rejection, RequestReader, TimerRequest

MAX_SCOPES_PER_WORKER = 1024  # torch code uses a handful; more is a leak or an attack
READ_BYTES = 65536  # one read per wake-up per channel: a full default pipe, ~600 requests
_EARLY_TOLERANCE_S = 1e-3  # call_at may fire a hair early; never expire earlier than this
_COMPACT_SLACK = 64  # rebuild the heap when stale entries outnumber live ones by this much


@dataclass(frozen=True)
class Expiry:
    """A worker's scope expired. deadline and signalled_at are wall-clock values; overdue = their difference."""

    local_rank: int
    pid: int
    scope: str
    deadline: float
    signalled_at: float
    signal: int  # the signal sent, 0 if none was (the client asked for signal <= 0)
    stacks: str  # py-spy dump taken before the signal, "" when unavailable
    timeout_s: float  # how long the worker gave the scope

    @property
    def reason(self) -> str:
        """One line for humans."""
        return f"watchdog: scope '{self.scope}' on pid {self.pid} expired after {self.timeout_s:.1f} s"


@dataclass(frozen=True)
class ServerStats:
    """What the server has seen since it started (counters never reset)."""

    accepted: int
    rejected: dict[str, int]  # Rejection kind -> count, over every channel
    timers: int  # live scopes
    heap: int  # scheduled entries (live plus stale, bounded by compaction)
    buffered: int  # bytes held for partial lines, over every channel


@dataclass
class _Timer:
    local_rank: int
    deadline_mono: float
    deadline_wall: float
    timeout_s: float  # how long the worker gave the scope (deadline - receipt time)
    signal: int
    seq: int  # matches the heap entry that schedules this timer (lazy deletion)


@dataclass
class _Batch:
    """What one read's requests share: the clocks when it was read, and owner() answers."""

    wall: float
    mono: float
    owners: dict[int, int | None] = field(default_factory=dict)


@dataclass
class _Channel:
    local_rank: int
    path: Path
    rfd: int
    wfd: int  # our own writer: the reader never sees EOF when clients close
    reader: RequestReader = field(default_factory=RequestReader)
    reported: Counter[Rejection] = field(default_factory=Counter)  # rejections already in a summary


class FileTimerServer:
    """Receives FileTimerClient requests on per-worker FIFOs and reports expired scopes; see the module docstring.

    One concern over 20 methods: the timer table and the FIFOs that feed it (reading, accepting, arming, expiring
    and compacting the same table of live scopes); none of them is used apart.

    owner(pid) -> local rank when pid is one of this runner's workers (or a descendant), else None.
    check_interval: expiries are coalesced: two expiry wake-ups are at least this far apart, so a burst
    of expiries is handled together and a scope is reported at most this late (plus stack capture).
    on_first_request(local_rank, monotonic time), when given, is called for the first accepted request of each
    rank's worker (again after `forget()` or `clear()`): that worker says it is ready (runner/observe/recovery.py).
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        owner: Callable[[int], int | None],
        on_expiry: Callable[[Expiry], None],
        clock: Clock | None = None,
        check_interval: float = 0.1,
        capture_stacks: bool = True,
        max_scopes: int = MAX_SCOPES_PER_WORKER,
        summary_interval: float = 10.0,
        refusal_interval: float = INTERVAL_S,
        log: structlog.typing.FilteringBoundLogger | None = None,
        on_first_request: Callable[[int, float], None] | None = None,
        before_signal: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self._dir = timer_dir(run_dir)
        self._on_first_request = on_first_request  # (local rank, monotonic time): its worker's first request
        self._before_signal = before_signal  # awaited before an expired worker is signalled (the hang's culprit)
        self._owner = owner
        self._on_expiry = on_expiry
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._check_interval = check_interval
        self._capture = capture_stacks
        self._max_scopes = max_scopes
        self._summary_interval = summary_interval
        self._log = log if log is not None else structlog.get_logger("runner.watchdog.timer_server")
        self._refusals = RefusalLog(self._log, self._clock, interval=refusal_interval)  # who tried, per pid
        self._channels: dict[int, _Channel] = {}
        self._timers: dict[int, dict[str, _Timer]] = {}  # pid -> scope -> timer
        self._scopes: Counter[int] = Counter()  # local rank -> live scopes
        self._heap: list[tuple[float, int, int, str]] = []  # (deadline_mono, seq, pid, scope)
        self._seq = 0
        self._accepted = 0
        self._activity: dict[int, float] = {}  # local rank -> monotonic time of its last accepted request
        self._expiring: dict[int, asyncio.Task[None]] = {}
        self._handle: asyncio.TimerHandle | None = None
        self._summary: asyncio.TimerHandle | None = None
        self._last_wake = -math.inf
        self._last_summary = -math.inf
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def directory(self) -> Path:
        """The private directory holding the channels."""
        return self._dir

    async def start(self) -> None:
        """Create the private directory (channels are made by `channel()`)."""
        self._loop = asyncio.get_running_loop()
        try:
            self._dir.parent.mkdir(parents=True, exist_ok=True)
            _make_private_dir(self._dir)
        except OSError as e:  # a read-only or exhausted logs disk: the FIFOs need no space, only a folder
            try:
                elsewhere = Path(tempfile.mkdtemp(prefix="runner-timer-"))  # 0700
            except OSError as again:
                msg = f"no folder for the timer FIFOs: {self._dir}: {describe(e)}; temp dir: {describe(again)}"
                raise RunnerError(msg, fix="free space in logs.dir or the temp dir, or turn the watchdog off") from e
            self._log.warning("timer_dir_elsewhere", path=str(elsewhere), error=describe(e))
            self._dir = elsewhere
        self._log.info("timer_server_started", path=str(self._dir), check_interval=self._check_interval)

    def channel(self, local_rank: int) -> str:
        """The FIFO of `local_rank`, created and read from now on; give it to that worker as TORCHELASTIC_TIMER_FILE."""
        existing = self._channels.get(local_rank)
        if existing is not None:
            return str(existing.path)
        if self._loop is None:
            raise RuntimeError("FileTimerServer.channel() before start()")
        path = timer_fifo(self._dir, local_rank)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # stale, from an agent that died
        os.mkfifo(path, 0o600)
        os.chmod(path, 0o600)  # mkfifo honours the umask; make the mode exact
        rfd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        wfd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        ch = _Channel(local_rank, path, rfd, wfd)
        self._channels[local_rank] = ch
        self._loop.add_reader(rfd, self._on_readable, ch)
        return str(path)

    def clear(self) -> None:
        """Forget every timer, activity record, partial line and pending expiry (the workers are being replaced)."""
        self._timers.clear()
        self._scopes.clear()
        self._heap.clear()
        self._activity.clear()
        for ch in self._channels.values():
            ch.reader.reset()
        for task in self._expiring.values():
            task.cancel()
        self._expiring.clear()
        self._cancel_handle()

    def forget(self, local_rank: int) -> None:
        """Forget the timers and activity of one local rank (its worker is being replaced)."""
        mine = [pid for pid, scopes in self._timers.items() if any(t.local_rank == local_rank for t in scopes.values())]
        for pid in mine:
            self._drop_pid(pid)
        self._activity.pop(local_rank, None)
        ch = self._channels.get(local_rank)
        if ch is not None:
            ch.reader.reset()
        if self._loop is not None:
            self._arm()

    def last_activity(self, local_rank: int) -> float | None:
        """Monotonic time of the rank's last accepted request, None if it sent none since clear()."""
        return self._activity.get(local_rank)

    def stats(self) -> ServerStats:
        """Counters and sizes (for tests, benchmarks and summaries)."""
        rejected: Counter[Rejection] = Counter()
        for ch in self._channels.values():
            rejected.update(ch.reader.rejected)
        return ServerStats(
            accepted=self._accepted,
            rejected={str(k): v for k, v in sorted(rejected.items())},
            timers=sum(len(s) for s in self._timers.values()),
            heap=len(self._heap),
            buffered=sum(ch.reader.buffered for ch in self._channels.values()),
        )

    async def stop(self) -> None:
        """Stop reading, cancel pending work, remove the FIFOs and their directory. Idempotent."""
        tasks = list(self._expiring.values())
        self.clear()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._channels:
            self._summarize()
        self._refusals.flush()
        if self._summary is not None:
            self._summary.cancel()
            self._summary = None
        for ch in self._channels.values():
            if self._loop is not None:
                self._loop.remove_reader(ch.rfd)
            os.close(ch.rfd)
            os.close(ch.wfd)
            with contextlib.suppress(FileNotFoundError):
                ch.path.unlink()
        self._channels.clear()
        with contextlib.suppress(OSError):
            self._dir.rmdir()
        self._log.info("timer_server_stopped", path=str(self._dir))

    # -- reading requests ------------------------------------------------------------------------

    def _on_readable(self, ch: _Channel) -> None:
        try:
            try:
                data = os.read(ch.rfd, READ_BYTES)
            except BlockingIOError:
                return
            before = ch.reader.rejected.total()
            batch = _Batch(self._clock.wall(), self._clock.monotonic())
            for req in ch.reader.feed(data, batch.wall):
                self._accept(ch, req, batch)
            if ch.reader.rejected.total() != before:
                self._schedule_summary()
            self._arm()
        except Exception:  # a reader callback must never die: log and keep serving
            self._log.exception("timer_reader_failed", local_rank=ch.local_rank)

    def _owner_of(self, pid: int, batch: _Batch) -> int | None:
        """owner(pid), looked up once per read (a flood comes from few pids); never the agent itself."""
        if pid not in batch.owners:
            batch.owners[pid] = None if pid == os.getpid() else self._owner(pid)
        return batch.owners[pid]

    def _accept(self, ch: _Channel, req: TimerRequest, batch: _Batch) -> None:
        owner = self._owner_of(req.pid, batch)
        if owner is None:
            ch.reader.reject(Rejection.FOREIGN_PID, f"pid {req.pid} is not a worker of this runner")
            self._refusals.refused(req.pid, ch.local_rank, lambda: who(req.pid))
            return
        if owner != ch.local_rank:
            ch.reader.reject(
                Rejection.OTHER_RANK, f"pid {req.pid} belongs to local rank {owner}, not channel {ch.local_rank}"
            )
            self._refusals.refused(req.pid, ch.local_rank, f"a worker of local rank {owner}, not of this channel's")
            return
        self._accepted += 1
        self._note_activity(owner, batch.mono)
        if req.pid in self._expiring:
            return  # already being reported; its timers go away with it
        scopes = self._timers.get(req.pid)
        if req.expiration_time < 0:
            if scopes is not None and scopes.pop(req.scope, None) is not None:
                self._scopes[owner] -= 1
                if not scopes:
                    del self._timers[req.pid]
            self._log.debug("timer_released", pid=req.pid, scope=req.scope)
            return
        if (scopes is None or req.scope not in scopes) and self._scopes[owner] >= self._max_scopes:
            ch.reader.reject(Rejection.SCOPE_CAP, f"local rank {owner} already holds {self._max_scopes} scopes")
            self._refusals.refused(req.pid, ch.local_rank, f"its worker already holds {self._max_scopes} scopes")
            return
        timeout_s = max(0.0, req.expiration_time - batch.wall)
        deadline_mono = batch.mono + (req.expiration_time - batch.wall)
        self._seq += 1
        if scopes is None:
            scopes = self._timers[req.pid] = {}
        if req.scope not in scopes:
            self._scopes[owner] += 1
        scopes[req.scope] = _Timer(owner, deadline_mono, req.expiration_time, timeout_s, req.signal, self._seq)
        heapq.heappush(self._heap, (deadline_mono, self._seq, req.pid, req.scope))
        self._log.debug("timer_acquired", pid=req.pid, scope=req.scope, timeout_s=timeout_s)

    def _note_activity(self, local_rank: int, at: float) -> None:
        """A request of `local_rank` was accepted at `at`; the first one (since forget/clear) is passed on."""
        first = local_rank not in self._activity
        self._activity[local_rank] = at
        if first and self._on_first_request is not None:
            self._on_first_request(local_rank, at)

    # -- summaries of refused requests -------------------------------------------------------------

    def _schedule_summary(self) -> None:
        """Log now if the last summary is old enough, else once at the end of the interval (never per request)."""
        if self._summary is not None or self._loop is None:
            return
        now = self._clock.monotonic()
        when = self._last_summary + self._summary_interval
        if now >= when:
            self._summarize()
        else:
            self._summary = self._loop.call_at(when, self._summarize)

    def _summarize(self) -> None:
        self._summary = None
        self._last_summary = self._clock.monotonic()
        for ch in self._channels.values():
            fresh = ch.reader.rejected - ch.reported
            if not fresh:
                continue
            ch.reported = Counter(ch.reader.rejected)
            self._log.warning(
                "timer_requests_rejected", local_rank=ch.local_rank, count=fresh.total(),
                kinds={str(k): v for k, v in sorted(fresh.items())}, total=ch.reader.rejected.total(),
                last=ch.reader.last_error[:200],
            )  # fmt: skip

    # -- scheduling expiries -----------------------------------------------------------------------

    def _live(self, seq: int, pid: int, scope: str) -> _Timer | None:
        timer = self._timers.get(pid, {}).get(scope)
        return timer if timer is not None and timer.seq == seq else None

    def _live_head(self) -> float | None:
        """Earliest live deadline, dropping heap entries of released or replaced timers."""
        while self._heap:
            when, seq, pid, scope = self._heap[0]
            if self._live(seq, pid, scope) is not None:
                return when
            heapq.heappop(self._heap)
        return None

    def _compact(self) -> None:
        """Rebuild the heap from live timers when stale entries (re-armed or released scopes) pile up."""
        live = sum(len(s) for s in self._timers.values())
        if len(self._heap) > 2 * live + _COMPACT_SLACK:
            self._heap = [
                (t.deadline_mono, t.seq, pid, scope)
                for pid, scopes in self._timers.items()
                for scope, t in scopes.items()
            ]
            heapq.heapify(self._heap)

    def _arm(self) -> None:
        """Keep exactly one call_at handle, at the earliest deadline (no sooner than the coalescing gap)."""
        self._compact()
        head = self._live_head()
        if head is None or self._loop is None:
            self._cancel_handle()
            return
        when = max(head, self._last_wake + self._check_interval)
        if self._handle is not None and self._handle.when() <= when:
            return  # fires first; it re-arms
        self._cancel_handle()
        self._handle = self._loop.call_at(when, self._on_wake)

    def _cancel_handle(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _on_wake(self) -> None:
        self._handle = None
        try:
            now = self._clock.monotonic()
            due: dict[int, list[tuple[str, _Timer]]] = {}
            while (head := self._live_head()) is not None and head <= now + _EARLY_TOLERANCE_S:
                _, seq, pid, scope = heapq.heappop(self._heap)
                timer = self._live(seq, pid, scope)
                assert timer is not None
                due.setdefault(pid, []).append((scope, timer))
            if due:
                self._last_wake = now  # the coalescing gap starts after a wake-up that expired something
            for pid, timers in due.items():
                self._drop_pid(pid)
                self._expiring[pid] = asyncio.get_running_loop().create_task(self._expire(pid, timers))
            self._arm()
        except Exception:  # a timer callback must never die: log and keep serving
            self._log.exception("timer_wake_failed")

    def _drop_pid(self, pid: int) -> None:
        for timer in self._timers.pop(pid, {}).values():
            self._scopes[timer.local_rank] -= 1

    # -- reporting an expiry ------------------------------------------------------------------------

    async def _expire(self, pid: int, timers: list[tuple[str, _Timer]]) -> None:
        """Capture stacks, signal the worker, report. Like torch: the earliest scope with a signal wins."""
        timers.sort(key=lambda item: item[1].deadline_wall)
        scope, timer = next(((s, t) for s, t in timers if t.signal > 0), timers[0])
        try:
            if self._before_signal is not None:
                await self._before_signal()
            stacks = await capture_stacks(pid, log=self._log) if self._capture else ""
            if self._owner(pid) != timer.local_rank:  # exited and reaped meanwhile: the pid may be someone else's
                self._log.info("timer_expired_worker_gone", pid=pid, scope=scope)
                return
            sig = max(timer.signal, 0)
            signalled_at = self._clock.wall()
            if sig and not self._send(pid, sig, scope):
                return
            self._drop_pid(pid)
            self._log.warning(
                "timer_expired", local_rank=timer.local_rank, pid=pid, scope=scope, signal=sig,
                overdue_s=round(signalled_at - timer.deadline_wall, 3), stacks_captured=bool(stacks),
            )  # fmt: skip
            self._on_expiry(
                Expiry(timer.local_rank, pid, scope, timer.deadline_wall, signalled_at, sig, stacks, timer.timeout_s)
            )
        except Exception:  # logged; the worker's exit is still seen by its pidfd
            self._log.exception("timer_expiry_failed", pid=pid, scope=scope)
        finally:
            if self._expiring.get(pid) is asyncio.current_task():
                del self._expiring[pid]

    def _send(self, pid: int, sig: int, scope: str) -> bool:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            self._log.info("timer_expired_worker_gone", pid=pid, scope=scope)
            return False
        except OSError as exc:
            self._log.error("timer_signal_failed", pid=pid, scope=scope, signal=sig, error=str(exc))
            return False
        return True


def _make_private_dir(path: Path) -> None:
    """Mkdir 0700; an existing path is reused only if it is a real directory owned by us."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise RunnerError(
                f"timer directory {path} exists and is not a directory owned by this user",
                fix="remove it, or choose another run directory",
            ) from None
    os.chmod(path, 0o700)
