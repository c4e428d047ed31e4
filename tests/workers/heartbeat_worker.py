"""Heartbeat test worker (no torch, so it starts at once).

usage: heartbeat_worker.py [BEATS]      touch $RUNNER_HEARTBEAT_FILE BEATS times (0.1 s apart), then go silent
                                        forever (a hang)
       heartbeat_worker.py tick SECONDS touch the file once (the first heartbeat: from then on the worker is
                                        timed), then re-arm a report-only timer scope every 0.2 s for SECONDS on
                                        $TORCHELASTIC_TIMER_FILE (the bytes torch's FileTimerClient writes: one
                                        open, one write, one close), then exit 0
"""

import json
import os
import sys
import time
from pathlib import Path


def tick(seconds: float) -> None:
    path = os.environ["TORCHELASTIC_TIMER_FILE"]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        doc = {"version": 1, "pid": os.getpid(), "scope_id": "tick", "expiration_time": time.time() + 60, "signal": 0}
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, json.dumps(doc).encode() + b"\n")
        finally:
            os.close(fd)
        time.sleep(0.2)


if len(sys.argv) > 2 and sys.argv[1] == "tick":
    Path(os.environ["RUNNER_HEARTBEAT_FILE"]).touch()
    tick(float(sys.argv[2]))
    sys.exit(0)
beats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
hb = Path(os.environ["RUNNER_HEARTBEAT_FILE"])
for _ in range(beats):
    hb.touch()
    time.sleep(0.1)
print("going silent", flush=True)
while True:
    time.sleep(1)
