"""Benchmark worker: sleep 2 s, then write this process's own CPU seconds to $BENCH_OUT/cpu-<pid>.

The agent-overhead benchmark subtracts these from the launcher's wait4 rusage to get the agent's own CPU.
BENCH_TORCH=1: import torch first (as a training script does), so the memory of a real worker is measured.
"""

import os
import resource
import time

if os.environ.get("BENCH_TORCH") == "1":
    import torch  # noqa: F401 - what a real worker holds

time.sleep(float(os.environ.get("BENCH_SLEEP", "2")))
ru = resource.getrusage(resource.RUSAGE_SELF)
out = os.environ.get("BENCH_OUT")
if out:
    with open(os.path.join(out, f"cpu-{os.getpid()}"), "w", encoding="ascii") as f:
        f.write(repr(ru.ru_utime + ru.ru_stime))
