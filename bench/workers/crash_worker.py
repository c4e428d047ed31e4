"""Benchmark worker for restart latency (no torch). Its first statement takes the start time.

Attempt 0: the last rank sleeps $BENCH_CRASH_AFTER s, writes time.time() to $BENCH_OUT/crash and os._exit(1);
the other ranks sleep (until the launcher stops them). Attempt >= 1: every rank exits 0 at once.
Every start writes $BENCH_OUT/start-<attempt>-<rank> = the time of the first statement.
With $BENCH_CALIBRATE set it only writes its start time there (bare interpreter start-up calibration).
"""

import time

T0 = time.time()

import os


def stamp(path: str, t: float) -> None:
    """Write `t` to `path`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, repr(t).encode())
    os.close(fd)


if os.environ.get("BENCH_CALIBRATE"):
    stamp(os.environ["BENCH_CALIBRATE"], T0)
    raise SystemExit(0)
out = os.environ["BENCH_OUT"]
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
rank = int(os.environ["RANK"])
stamp(os.path.join(out, f"start-{attempt}-{rank}"), T0)
if attempt == 0:
    if rank == int(os.environ["WORLD_SIZE"]) - 1:
        time.sleep(float(os.environ.get("BENCH_CRASH_AFTER", "1")))
        stamp(os.path.join(out, "crash"), time.time())
        os._exit(1)
    time.sleep(120)
