"""The agent's threads never take a process signal: every stop signal lands on the main thread.

Why: the kernel gives a signal sent to the process to any thread that does not block it. Python runs the handler
in the main thread in any case, but only after the C handler ran in the thread the kernel chose. When that is a
helper thread (the to_thread pool, a console tee, a health probe, grpc's), the main thread may go on meanwhile and
see the workers' exits the same signal caused before the handler recorded the stop: a job stopped by SIGTERM sent
to its process group then reads as succeeded (workers that saved and exited 0) or as failed and restarted.
With every other thread blocking them, a pending stop signal is taken by the main thread itself, before it returns
to the event loop: the stop is recorded before any exit is seen (runner/system/stop_scope.py).

A thread inherits its creator's signal mask, so threads are created with the signals blocked: `start(thread)` for
a thread of ours, `SignalFreeExecutor` for asyncio's default executor, `kept_from_new_threads()` around code that
makes threads we do not control (grpc's, made when the first channel opens). The main thread blocks them only
for that moment: a signal that arrives then is delivered to it as soon as it unblocks.

Invariant (tests/system/test_thread_signals.py): while the agent runs, every thread but the main one blocks
`ASYNC_SIGNALS`.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

# Raised by the faulting thread itself (they must stay deliverable to it), and the two no thread can block.
SYNCHRONOUS = frozenset({
    signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGTRAP, signal.SIGSYS, signal.SIGABRT,
    signal.SIGKILL, signal.SIGSTOP,
})
ASYNC_SIGNALS = frozenset(signal.valid_signals()) - SYNCHRONOUS


@contextlib.contextmanager
def kept_from_new_threads() -> Iterator[None]:
    """Threads created inside the block (from this thread) block `ASYNC_SIGNALS` for life."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, ASYNC_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def start(thread: threading.Thread) -> None:
    """`thread.start()`, the new thread blocking `ASYNC_SIGNALS`."""
    with kept_from_new_threads():
        thread.start()


class SignalFreeExecutor(ThreadPoolExecutor):
    """A thread pool whose threads block `ASYNC_SIGNALS` (the pool makes them in `submit`, in the caller's thread)."""

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """ThreadPoolExecutor.submit, any thread it makes for the call blocking `ASYNC_SIGNALS`."""
        with kept_from_new_threads():
            return super().submit(fn, *args, **kwargs)
