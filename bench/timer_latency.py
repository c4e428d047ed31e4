"""Deadline -> signal latency and idle CPU: runner.watchdog.timer_server.FileTimerServer vs torch's FileTimerServer.

Both servers get the same worker (tests/fixtures/workers/timer_worker.py, torch's FileTimerClient): it installs a
SIGTERM handler, arms 'train_step' for now+DELAY with SIGTERM and prints the deadline; the handler prints
time.time() when the signal arrives. Latency = arrival - deadline (same host clock).
torch's server runs in its own process (max_interval=0.1, as torch's LocalElasticAgent uses) because it
kills itself after reaping a worker; a fresh one is started per run.
torch's loop is phase-locked to the last request it read (it checks every ~max_interval after it), so a
delay that is a multiple of 0.1 s would flatter it: each run's delay is DELAY + uniform(0, 0.1) s, from
a seeded generator, the same sequence for every server.

    python bench/timer_latency.py [--runs 10] [--delay 0.5] [--idle-seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runner.watchdog.timer_server import FileTimerServer

WORKER = ROOT / "tests" / "fixtures" / "workers" / "timer_worker.py"
WAIT_S = 120.0
TORCH_SERVER = """
import sys, time
from torch.distributed.elastic.timer.file_based_local_timer import FileTimerServer
server = FileTimerServer(sys.argv[1], run_id="bench", max_interval=0.1, daemon=True)
server.start()
print("ready", flush=True)
time.sleep(3600)
"""


async def spawn(args: list[str], fifo: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, *args, env={**os.environ, "TORCHELASTIC_TIMER_FILE": fifo},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip


async def reap(*procs: asyncio.subprocess.Process) -> None:
    for proc in procs:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def readline(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdout is not None
    return (await asyncio.wait_for(proc.stdout.readline(), WAIT_S)).decode().strip()


def delays(base: float, runs: int) -> list[float]:
    rng = random.Random(4)
    return [base + rng.uniform(0.0, 0.1) for _ in range(runs)]


async def one_latency(fifo: str, delay: float, owned: dict[int, int] | None) -> float:
    """Start a latency worker, return (signal arrival - deadline) in ms."""
    worker = await spawn([str(WORKER), "latency", str(delay)], fifo)
    try:
        if owned is not None:
            owned[worker.pid] = 0
        assert worker.stdin is not None
        worker.stdin.write(b"go\n")
        deadline = float((await readline(worker)).split()[1])
        arrived = float((await readline(worker)).split()[1])
        return (arrived - deadline) * 1000
    finally:
        await reap(worker)


async def ours(run_dir: Path, runs: int, delay: float, *, stacks: bool) -> list[float]:
    owned: dict[int, int] = {}
    server = FileTimerServer(run_dir, owner=owned.get, on_expiry=lambda e: None, capture_stacks=stacks, log=_Quiet())
    await server.start()
    try:
        return [await one_latency(server.channel(0), d, owned) for d in delays(delay, runs)]
    finally:
        await server.stop()


async def start_torch_server(fifo: str) -> asyncio.subprocess.Process:
    server = await spawn(["-c", TORCH_SERVER, fifo], fifo)
    assert await readline(server) == "ready"
    return server


async def torch_latency(tmp: Path, runs: int, delay: float) -> list[float]:
    fifo = str(tmp / "torch.fifo")
    out = []
    for d in delays(delay, runs):
        server = await start_torch_server(fifo)
        try:
            out.append(await one_latency(fifo, d, None))
        finally:
            await reap(server)  # it normally killed itself already
    return out


async def idle_cpu_ours(run_dir: Path, seconds: float) -> float:
    """CPU seconds this process spends over `seconds` with our server holding one far-future timer."""
    owned: dict[int, int] = {}
    server = FileTimerServer(run_dir, owner=owned.get, on_expiry=lambda e: None, log=_Quiet())
    await server.start()
    worker = await spawn([str(WORKER), "hang", "3600"], server.channel(0))
    try:
        owned[worker.pid] = 0
        assert worker.stdin is not None
        worker.stdin.write(b"go\n")
        await readline(worker)
        while server.last_activity(0) is None:
            await asyncio.sleep(0.05)
        before = _cpu_self()
        await asyncio.sleep(seconds)
        return _cpu_self() - before
    finally:
        await reap(worker)
        await server.stop()


async def idle_cpu_torch(tmp: Path, seconds: float) -> float:
    """CPU seconds torch's server process spends over `seconds` holding one far-future timer."""
    fifo = str(tmp / "torch-idle.fifo")
    server = await start_torch_server(fifo)
    worker = await spawn([str(WORKER), "hang", "3600"], fifo)
    try:
        assert worker.stdin is not None
        worker.stdin.write(b"go\n")
        await readline(worker)
        await asyncio.sleep(1.0)  # let it register the request
        before = _cpu_proc(server.pid)
        await asyncio.sleep(seconds)
        return _cpu_proc(server.pid) - before
    finally:
        await reap(worker, server)


def _cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cpu_proc(pid: int) -> float:
    """CPU seconds of every thread of pid (schedstat is in ns; /proc/PID/stat only counts 10 ms ticks)."""
    tasks = list(Path(f"/proc/{pid}/task").glob("*/schedstat"))
    if tasks:
        return sum(int(t.read_text().split()[0]) for t in tasks) / 1e9
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class _Quiet:
    """Logger that drops everything (the bench prints its own table)."""

    def __getattr__(self, name: str) -> object:
        return lambda *args, **kwargs: None


def row(name: str, ms: list[float], ref: float) -> str:
    med = statistics.median(ms)
    return f"{name:<34}{len(ms):>5}{med:>10.1f}{min(ms):>9.1f}{max(ms):>9.1f}{ref / med:>10.1f}x"


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        torch_ms = await torch_latency(tmp, args.runs, args.delay)
        plain = await ours(tmp / "a", args.runs, args.delay, stacks=False)
        spy = await ours(tmp / "b", args.runs, args.delay, stacks=True)
        cpu_ours = await idle_cpu_ours(tmp / "c", args.idle_seconds)
        cpu_torch = await idle_cpu_torch(tmp, args.idle_seconds)
    ref = statistics.median(torch_ms)
    print(f"deadline -> signal delivered, ms (delay {args.delay}-{args.delay + 0.1} s, {args.runs} runs each)")
    print(f"{'server':<34}{'runs':>5}{'median':>10}{'min':>9}{'max':>9}{'speedup':>11}")
    print(row("torch FileTimerServer (0.1 s)", torch_ms, ref))
    print(row("runner, no stack capture", plain, ref))
    print(row("runner, py-spy stacks first", spy, ref))
    ratio = f"{cpu_torch / cpu_ours:.0f}x less" if cpu_ours > 0 else "n/a (0 measured)"
    print(
        f"idle CPU over {args.idle_seconds:.0f} s, one armed far-future timer: runner {cpu_ours * 1000:.1f} ms, "
        f"torch {cpu_torch * 1000:.1f} ms ({ratio})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--delay", type=float, default=0.5, help="seconds from acquire to deadline")
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    asyncio.run(main(parser.parse_args()))
