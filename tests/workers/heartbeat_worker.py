"""Touches $RUNNER_HEARTBEAT_FILE --beats times (0.1 s apart), then goes silent forever (a hang)."""

import os
import sys
import time
from pathlib import Path

beats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
path = Path(os.environ["RUNNER_HEARTBEAT_FILE"])
for _ in range(beats):
    path.touch()
    time.sleep(0.1)
print("going silent", flush=True)
while True:
    time.sleep(1)
