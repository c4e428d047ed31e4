"""Where the agent handles signals.

Which ones stop the job (`shutdown.signals_to_handle`: SIGTERM, SIGINT, SIGHUP and SIGQUIT by default, as torchrun's
--signals-to-handle), which one stops it gracefully, and what a second stop signal means. Everything a signal does
becomes a StopRequested in the run's stop scope (runner/system/stop_scope.py), recorded at once and then
delivered on the agent's queue, carrying the signal so SHUTDOWN can forward it to the workers
(a worker gets SIGINT as KeyboardInterrupt, as under torchrun).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Iterable

from runner.events import StopRequested
from runner.system.stop_scope import StopScope

DEFAULT_STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
GRACEFUL_SIGNAL = signal.SIGUSR2  # `runner stop --graceful` on one node: let workers finish
TORCHELASTIC_ENV = "TORCHELASTIC_SIGNALS_TO_HANDLE"


def stop_signals(names: Iterable[str] = DEFAULT_STOP_SIGNALS) -> tuple[signal.Signals, ...]:
    """The stop signals named (SIGxxx names, as the spec normalises them), in order, without duplicates."""
    return tuple(dict.fromkeys(signal.Signals[name] for name in names))


def torchelastic_env(names: Iterable[str] = DEFAULT_STOP_SIGNALS) -> dict[str, str]:
    """TORCHELASTIC_SIGNALS_TO_HANDLE for the workers' environment: 'SIGTERM,SIGINT,SIGHUP,SIGQUIT'."""
    return {TORCHELASTIC_ENV: ",".join(s.name for s in stop_signals(names))}


def install(
    scope: StopScope,
    hurry: asyncio.Event,
    on_hurry: Callable[[str], None] | None = None,
    names: Iterable[str] = DEFAULT_STOP_SIGNALS,
) -> tuple[signal.Signals, ...]:
    """Stop signals become StopRequested in `scope`; a second non-graceful one also sets `hurry` (kill now).

    The handler records the request in the scope at once (Python runs it in the main thread as soon as the signal
    arrives, before the event loop can see any worker exit the same signal caused), then hands it to the event loop,
    which delivers it on the run's queue (and each inner run's). `names`: the spec's shutdown.signals_to_handle.
    Returns every signal handled (the stop ones, then the graceful).
    """
    loop = asyncio.get_running_loop()
    seen: list[int] = []

    def delivered(stop: StopRequested) -> None:
        if not stop.graceful and any(s != GRACEFUL_SIGNAL for s in seen):
            hurry.set()
            if on_hurry is not None:
                on_hurry(signal.Signals(stop.signum).name)
        seen.append(stop.signum)
        scope.deliver(stop)

    def on_signal(signum: int, _frame: object) -> None:
        stop = StopRequested(signum=signum, graceful=signum == GRACEFUL_SIGNAL)
        scope.note(stop)
        if not loop.is_closed():
            loop.call_soon_threadsafe(delivered, stop)

    handled = (*(s for s in stop_signals(names) if s != GRACEFUL_SIGNAL), GRACEFUL_SIGNAL)
    for sig in handled:
        signal.signal(sig, on_signal)
    return handled


def uninstall(handled: Iterable[signal.Signals]) -> None:
    """Give the signals `install` handled back their default action."""
    for sig in handled:
        signal.signal(sig, signal.SIG_DFL)
