"""Benchmark worker (no torch): write time.time() at start to $BENCH_OUT/start-<RANK>-<restart count>, then
sleep $BENCH_SLEEP seconds (default 0) and exit 0. Multi-node benchmarks read the stamps."""

import os
import time

stamp = time.time()
out = os.environ["BENCH_OUT"]
name = f"start-{os.environ['RANK']}-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}-{os.getpid()}"
with open(os.path.join(out, name + ".tmp"), "w", encoding="ascii") as f:
    f.write(repr(stamp))
os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))
time.sleep(float(os.environ.get("BENCH_SLEEP", "0")))
