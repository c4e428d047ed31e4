"""Worker for tests/test_timer*.py and bench/timer_latency.py: talks to a timer server with torch's client.

usage: timer_worker.py MODE [SECONDS]   (FIFO path from $TORCHELASTIC_TIMER_FILE)
Waits for a line on stdin before sending anything (so the test can register the pid first).
  idle      print "ready", then hang (sends nothing)
  hang      acquire 'train_step' (SIGTERM, deadline now+SECONDS), print "acquired", then hang
  release   acquire 'train_step' (SIGTERM, now+SECONDS) and release it, then acquire 'probe'
            (signal 0: report only, now+2*SECONDS), print "released", then hang
  report    acquire 'probe' (signal 0, deadline now+SECONDS), print "acquired", then hang
  latency   install a SIGTERM handler that prints the delivery time, acquire 'train_step'
            (SIGTERM, now+SECONDS), print "deadline <t>", then hang until signalled
  spoof     (under the runner, LOCAL_RANK set) print "timer file <path>", arm 'spoof' (SIGKILL, already
            expired) in its own name on the NEXT local rank's FIFO, arm 'own' (report only, now+60) on its
            own, sleep SECONDS and exit 0: a server that accepts the spoof kills it
"""

from __future__ import annotations

import os
import signal
import sys
import time
from types import FrameType

from torch.distributed.elastic.timer.file_based_local_timer import FileTimerClient


def stuck_in_collective() -> None:
    """The frame the stack-capture test looks for."""
    while True:
        time.sleep(0.05)


def on_term(signum: int, frame: FrameType | None) -> None:
    print(f"signalled {time.time()!r}", flush=True)
    os._exit(0)


def spoof(path: str, seconds: float) -> None:
    """Write on another rank's channel, then live: see the module docstring."""
    rank, size = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    print(f"timer file {path}", flush=True)
    other = path.replace(f"rank_{rank}.fifo", f"rank_{(rank + 1) % size}.fifo")
    FileTimerClient(other, signal=signal.SIGKILL).acquire("spoof", time.time() - 1)
    FileTimerClient(path, signal=0).acquire("own", time.time() + 60)
    time.sleep(seconds)
    raise SystemExit(0)


def main() -> None:
    mode = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    path = os.environ["TORCHELASTIC_TIMER_FILE"]
    killer = FileTimerClient(path, signal=signal.SIGTERM)
    reporter = FileTimerClient(path, signal=0)
    sys.stdin.readline()
    if mode == "idle":
        print("ready", flush=True)
    elif mode == "hang":
        killer.acquire("train_step", time.time() + seconds)
        print("acquired", flush=True)
    elif mode == "release":
        killer.acquire("train_step", time.time() + seconds)
        killer.release("train_step")
        reporter.acquire("probe", time.time() + 2 * seconds)
        print("released", flush=True)
    elif mode == "report":
        reporter.acquire("probe", time.time() + seconds)
        print("acquired", flush=True)
    elif mode == "latency":
        signal.signal(signal.SIGTERM, on_term)
        deadline = time.time() + seconds
        killer.acquire("train_step", deadline)
        print(f"deadline {deadline!r}", flush=True)
    elif mode == "spoof":
        spoof(path, seconds)
    else:
        raise SystemExit(f"unknown mode {mode}")
    stuck_in_collective()


if __name__ == "__main__":
    main()
