"""File-timer server speaking torch's FileTimerClient wire format, embedded in the agent's event loop.

Workers (torch.distributed.elastic.timer.FileTimerClient) open the FIFO at `path` O_WRONLY|O_NONBLOCK
per request and write one JSON line (FileTimerRequest.to_json):
    {"version": 1, "pid": int, "scope_id": str, "expiration_time": float (time.time()), "signal": int}
`expiration_time < 0` releases the scope. Unlike torch's server, an expiry never kills the agent: the
worker's stacks are captured (py-spy, see runner/watchdog/stacks.py), the requested signal is sent to the worker
only, and `on_expiry` gets an `Expiry` so the agent's restart policy decides what happens next.

Event-driven: the FIFO is read when readable (loop.add_reader) and one loop.call_at handle is armed for
the earliest deadline. Client deadlines are wall-clock; they are converted to the loop's monotonic clock
when received, so later wall-clock steps do not move them.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import math
import os
import select
import signal
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from runner.errors import RunnerError
from runner.watchdog.stacks import capture_stacks

WIRE_VERSION = 1
MAX_LINE = select.PIPE_BUF  # the client refuses to send more; longer lines are discarded
MAX_HORIZON_S = 366 * 24 * 3600.0  # a deadline further ahead than this is treated as garbage
MAX_SCOPE_CHARS = 1024
_READS_PER_WAKE = 64  # bound one reader callback so a flood cannot starve the loop
_EARLY_TOLERANCE_S = 1e-3  # call_at may fire a hair early; never expire earlier than this


@dataclass(frozen=True)
class TimerRequest:
    """One validated line from a client. expiration_time < 0 means release."""

    pid: int
    scope: str
    expiration_time: float  # time.time() based
    signal: int  # <= 0: report only, do not signal


@dataclass(frozen=True)
class Expiry:
    """A worker's scope expired. deadline and signalled_at are time.time() values; overdue = their difference."""

    pid: int
    scope: str
    deadline: float
    signalled_at: float
    signal: int  # the signal sent, 0 if none was (the client asked for signal <= 0)
    stacks: str  # py-spy dump taken before the signal, "" when unavailable
    reason: str


def parse_request(line: bytes, now: float) -> TimerRequest:
    """Validate one wire line (without its newline). Raises ValueError naming what is wrong."""
    try:
        doc = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    version = _field(doc, "version", int)
    if version != WIRE_VERSION:
        raise ValueError(f"unsupported version {version!r} (expected {WIRE_VERSION})")
    pid = _field(doc, "pid", int)
    scope = _field(doc, "scope_id", str)
    expiration = float(_field(doc, "expiration_time", (int, float)))
    sig = _field(doc, "signal", int)
    if pid <= 0:
        raise ValueError(f"pid must be positive, got {pid}")
    if len(scope) > MAX_SCOPE_CHARS:
        raise ValueError(f"scope_id longer than {MAX_SCOPE_CHARS} characters")
    if not math.isfinite(expiration) or expiration > now + MAX_HORIZON_S:
        raise ValueError(f"expiration_time {expiration!r} is not a time.time() value within a year")
    if sig > 0 and sig not in signal.valid_signals():
        raise ValueError(f"signal {sig} is not a valid signal number")
    return TimerRequest(pid=pid, scope=scope, expiration_time=expiration, signal=sig)


def _field(doc: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    if name not in doc:
        raise ValueError(f"missing field '{name}'")
    value = doc[name]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"field '{name}' has the wrong type ({type(value).__name__})")
    return value


class LineSplitter:
    """Split a byte stream into lines; keep partial lines until their newline; drop lines over `limit`."""

    def __init__(self, limit: int = MAX_LINE) -> None:
        self._limit = limit
        self._buf = bytearray()
        self._discarding = False  # inside an over-long line: drop bytes up to its newline

    def feed(self, data: bytes) -> tuple[list[bytes], int]:
        """The complete lines in `data` (plus what was buffered) and how many over-long lines were dropped."""
        lines: list[bytes] = []
        dropped = 0
        *complete, rest = data.split(b"\n")
        for chunk in complete:
            if self._discarding:
                self._discarding = False
                continue
            line = bytes(self._buf) + chunk
            self._buf.clear()
            if len(line) > self._limit:
                dropped += 1
            else:
                lines.append(line)
        if not self._discarding:
            self._buf += rest
            if len(self._buf) > self._limit:
                self._buf.clear()
                self._discarding = True
                dropped += 1
        return lines, dropped


@dataclass
class _Timer:
    deadline_mono: float
    deadline_wall: float
    timeout_s: float  # how long the worker gave the scope (deadline - receipt time)
    signal: int
    seq: int  # matches the heap entry that schedules this timer (lazy deletion)


class FileTimerServer:
    """Receives FileTimerClient requests on a FIFO and reports expired scopes; see the module docstring.

    owner(pid) -> local rank when pid is one of this runner's workers (or a descendant), else None.
    check_interval: expiries are coalesced: two expiry wake-ups are at least this far apart, so a burst
    of expiries is handled together and a scope is reported at most this late (plus stack capture).
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        owner: Callable[[int], int | None],
        on_expiry: Callable[[Expiry], None],
        check_interval: float = 0.1,
        capture_stacks: bool = True,
        log: Any = None,
    ) -> None:
        self._dir = Path(run_dir) / "timer"
        self._fifo = self._dir / "requests.fifo"
        self._owner = owner
        self._on_expiry = on_expiry
        self._check_interval = check_interval
        self._capture = capture_stacks
        self._log = log if log is not None else structlog.get_logger("runner.watchdog.timer_server")
        self._splitter = LineSplitter()
        self._timers: dict[tuple[int, str], _Timer] = {}
        self._heap: list[tuple[float, int, tuple[int, str]]] = []
        self._seq = 0
        self._activity: dict[int, float] = {}
        self._expiring: dict[int, asyncio.Task[None]] = {}
        self._handle: asyncio.TimerHandle | None = None
        self._last_wake = -math.inf
        self._rfd = -1
        self._wfd = -1
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def path(self) -> str:
        """The FIFO path; give it to workers as TORCHELASTIC_TIMER_FILE."""
        return str(self._fifo)

    async def start(self) -> None:
        """Create the private directory and FIFO and start reading it."""
        self._loop = asyncio.get_running_loop()
        self._dir.parent.mkdir(parents=True, exist_ok=True)
        _make_private_dir(self._dir)
        with contextlib.suppress(FileNotFoundError):
            self._fifo.unlink()  # stale, from an agent that died
        os.mkfifo(self._fifo, 0o600)
        os.chmod(self._fifo, 0o600)  # mkfifo honours the umask; make the mode exact
        self._rfd = os.open(self._fifo, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        # Our own writer keeps the FIFO open, so the reader never sees EOF when clients close.
        self._wfd = os.open(self._fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self._loop.add_reader(self._rfd, self._on_readable)
        self._log.info("timer_server_started", path=self.path, check_interval=self._check_interval)

    def clear(self) -> None:
        """Forget every timer, activity record and pending expiry (the workers are being replaced)."""
        self._timers.clear()
        self._heap.clear()
        self._activity.clear()
        for task in self._expiring.values():
            task.cancel()
        self._expiring.clear()
        self._cancel_handle()

    def last_activity(self, pid: int) -> float | None:
        """time.monotonic() of the pid's last accepted request, None if it sent none since clear()."""
        return self._activity.get(pid)

    async def stop(self) -> None:
        """Stop reading, cancel pending work, remove the FIFO and its directory. Idempotent."""
        if self._loop is not None and self._rfd >= 0:
            self._loop.remove_reader(self._rfd)
        tasks = list(self._expiring.values())
        self.clear()
        await asyncio.gather(*tasks, return_exceptions=True)
        for fd in (self._rfd, self._wfd):
            if fd >= 0:
                os.close(fd)
        self._rfd = self._wfd = -1
        with contextlib.suppress(FileNotFoundError):
            self._fifo.unlink()
        with contextlib.suppress(OSError):
            self._dir.rmdir()
        self._log.info("timer_server_stopped", path=self.path)

    # -- reading requests ------------------------------------------------------------------------

    def _on_readable(self) -> None:
        try:
            for _ in range(_READS_PER_WAKE):
                try:
                    data = os.read(self._rfd, 65536)
                except BlockingIOError:
                    break
                if not data:
                    break
                lines, dropped = self._splitter.feed(data)
                if dropped:
                    self._log.warning("timer_request_malformed", reason="line longer than PIPE_BUF", count=dropped)
                for line in lines:
                    self._handle_line(line)
            self._arm()
        except Exception:
            self._log.exception("timer_reader_failed")

    def _handle_line(self, line: bytes) -> None:
        try:
            req = parse_request(line, time.time())
        except ValueError as exc:
            self._log.warning("timer_request_malformed", reason=str(exc), line=line[:200].decode(errors="replace"))
            return
        try:
            self._accept(req)
        except Exception:
            self._log.exception("timer_request_failed", pid=req.pid, scope=req.scope)

    def _accept(self, req: TimerRequest) -> None:
        if req.pid == os.getpid() or self._owner(req.pid) is None:
            self._log.warning(
                "timer_request_rejected", pid=req.pid, scope=req.scope, reason="pid is not a worker of this runner"
            )
            return
        self._activity[req.pid] = time.monotonic()
        if req.pid in self._expiring:
            return  # already being reported; its timers go away with it
        key = (req.pid, req.scope)
        if req.expiration_time < 0:
            self._timers.pop(key, None)
            self._log.debug("timer_released", pid=req.pid, scope=req.scope)
            return
        wall_now = time.time()
        deadline_mono = asyncio.get_running_loop().time() + (req.expiration_time - wall_now)
        self._seq += 1
        timeout_s = max(0.0, req.expiration_time - wall_now)
        self._timers[key] = _Timer(deadline_mono, req.expiration_time, timeout_s, req.signal, self._seq)
        heapq.heappush(self._heap, (deadline_mono, self._seq, key))
        self._log.debug("timer_acquired", pid=req.pid, scope=req.scope, timeout_s=round(timeout_s, 3))

    # -- scheduling expiries -----------------------------------------------------------------------

    def _live_head(self) -> float | None:
        """Earliest live deadline, dropping heap entries of released or replaced timers."""
        while self._heap:
            when, seq, key = self._heap[0]
            timer = self._timers.get(key)
            if timer is not None and timer.seq == seq:
                return when
            heapq.heappop(self._heap)
        return None

    def _arm(self) -> None:
        """Keep exactly one call_at handle, at the earliest deadline (no sooner than the coalescing gap)."""
        head = self._live_head()
        if head is None:
            self._cancel_handle()
            return
        when = max(head, self._last_wake + self._check_interval)
        if self._handle is not None and self._handle.when() <= when:
            return  # fires first; it re-arms
        self._cancel_handle()
        self._handle = asyncio.get_running_loop().call_at(when, self._on_wake)

    def _cancel_handle(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _on_wake(self) -> None:
        self._handle = None
        try:
            loop = asyncio.get_running_loop()
            now = loop.time()
            due: dict[int, list[tuple[str, _Timer]]] = {}
            while (head := self._live_head()) is not None and head <= now + _EARLY_TOLERANCE_S:
                _, _, key = heapq.heappop(self._heap)
                due.setdefault(key[0], []).append((key[1], self._timers[key]))
            if due:
                self._last_wake = now  # the coalescing gap starts after a wake-up that expired something
            for pid, timers in due.items():
                self._drop_pid(pid)
                self._expiring[pid] = loop.create_task(self._expire(pid, timers))
            self._arm()
        except Exception:
            self._log.exception("timer_wake_failed")

    def _drop_pid(self, pid: int) -> None:
        for key in [k for k in self._timers if k[0] == pid]:
            del self._timers[key]

    # -- reporting an expiry ------------------------------------------------------------------------

    async def _expire(self, pid: int, timers: list[tuple[str, _Timer]]) -> None:
        """Capture stacks, signal the worker, report. Like torch: the earliest scope with a signal wins."""
        timers.sort(key=lambda item: item[1].deadline_wall)
        scope, timer = next(((s, t) for s, t in timers if t.signal > 0), timers[0])
        try:
            stacks = await capture_stacks(pid, log=self._log) if self._capture else ""
            if self._owner(pid) is None:  # exited and reaped meanwhile: the pid may be someone else now
                self._log.info("timer_expired_worker_gone", pid=pid, scope=scope)
                return
            sig = max(timer.signal, 0)
            signalled_at = time.time()
            if sig and not self._send(pid, sig, scope):
                return
            self._drop_pid(pid)
            reason = f"watchdog: scope '{scope}' on pid {pid} expired after {timer.timeout_s:.1f} s"
            self._log.warning(
                "timer_expired", pid=pid, scope=scope, signal=sig,
                overdue_s=round(signalled_at - timer.deadline_wall, 3), stacks_captured=bool(stacks),
            )  # fmt: skip
            self._on_expiry(Expiry(pid, scope, timer.deadline_wall, signalled_at, sig, stacks, reason))
        except Exception:
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
