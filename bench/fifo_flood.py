"""The watchdog under a flood: does the agent still notice a worker's exit quickly, and does its memory stay flat?

An agent-side runner.watchdog.timer_server.FileTimerServer runs in this process's asyncio loop, with one FIFO
per writer, as in a real run. WRITERS real processes flood it for SECONDS at RATE requests/s in total, each on
its own channel, making exactly the syscalls torch's FileTimerClient makes per request (open O_WRONLY|O_NONBLOCK,
one write of one JSON line, close; plain Python so that starting them does not cost a torch import): re-arms
of 8 scopes 60 s ahead, report only. Every JUNK_EVERY-th write is abuse instead, in turn: a non-JSON line, a
line left without its newline (a writer dying mid-request), and a request naming a pid the runner does not own.

Meanwhile a victim process is started every 0.3 s; it sleeps 0.2 s, writes time.time() to a file and exits.
The agent notices exits the way runner/workers/group.py does: a pidfd registered with loop.add_reader. Latency
= time.time() in that callback - the victim's last time.time() (same host clock). The same is measured for
BASELINE seconds before the flood. The agent's RSS (/proc/self/status VmRSS) is read before the flood, every
0.25 s during it, and after it.

    python bench/fifo_flood.py [--writers 4] [--rate 6000] [--seconds 10] [--junk-every 10] [--baseline 3]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import structlog
from structlog.testing import CapturingLogger

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runner.watchdog.timer_server import FileTimerServer

WRITER = r"""
import json, os, sys, time
path, rate, seconds, junk_every = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
pid = os.getpid()
junk = [b"not json\n", b'{"version": 1, "pid": ',
        json.dumps({"version": 1, "pid": 1, "scope_id": "x", "expiration_time": time.time() + 60,
                    "signal": 9}).encode() + b"\n"]
sent = full = 0
start = time.monotonic()
while (now := time.monotonic()) < start + seconds:
    for _ in range(int((now - start) * rate) - sent):
        if junk_every and sent % junk_every == junk_every - 1:
            line = junk[(sent // junk_every) % len(junk)]
        else:
            line = json.dumps({"version": 1, "pid": pid, "scope_id": f"step{sent % 8}",
                               "expiration_time": time.time() + 60, "signal": 0}).encode() + b"\n"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        except BlockingIOError:
            full += 1  # the pipe was full: torch's client would raise in the worker
        sent += 1
    time.sleep(0.002)
print(sent, full, flush=True)
"""

VICTIM = r"""
import os, sys, time
time.sleep(float(sys.argv[1]))
with open(sys.argv[2], "w") as f:
    f.write(repr(time.time()))
os._exit(0)
"""


def rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def run_delay_ms() -> float:
    """Time this process's (single) thread has spent runnable but waiting for a CPU (/proc/self/schedstat)."""
    with open("/proc/self/schedstat", encoding="ascii") as f:
        return int(f.read().split()[1]) / 1e6


async def notice(proc: subprocess.Popen[bytes], stamp: Path) -> float:
    """Wait for proc's exit via a pidfd on the loop (as WorkerGroup does); exit -> notice in ms."""
    loop = asyncio.get_running_loop()
    pidfd = os.pidfd_open(proc.pid)
    seen: asyncio.Future[float] = loop.create_future()
    loop.add_reader(pidfd, lambda: seen.done() or seen.set_result(time.time()))
    try:
        noticed = await asyncio.wait_for(seen, 30)
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        proc.wait()
    return (noticed - float(stamp.read_text())) * 1000


async def victims(tmp: Path, seconds: float) -> list[tuple[float, float]]:
    """A victim every 0.3 s for `seconds`; per victim (exit -> notice ms, ms the agent waited for a CPU meanwhile)."""
    out: list[tuple[float, float]] = []
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    n = 0
    while loop.time() < end:
        n += 1
        stamp = tmp / f"victim{n}"
        proc = subprocess.Popen([sys.executable, "-c", VICTIM, "0.2", str(stamp)])
        waited = run_delay_ms()
        latency = await notice(proc, stamp)
        out.append((latency, run_delay_ms() - waited))
        await asyncio.sleep(0.1)
    return out


async def sample_rss(into: list[int]) -> None:
    while True:
        into.append(rss_kib())
        await asyncio.sleep(0.25)


def ms(samples: list[tuple[float, float]]) -> str:
    values = [lat for lat, _ in samples]
    q = statistics.quantiles(values, n=20, method="inclusive") if len(values) > 1 else values * 19
    lat, waited = max(samples)
    return (
        f"median {statistics.median(values):6.1f}  p95 {q[18]:6.1f}  max {lat:6.1f}  ({len(values)} exits; "
        f"during the slowest the agent waited {waited:.1f} ms for a CPU)"
    )


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        owned: dict[int, int] = {}
        capture = CapturingLogger()
        log = structlog.wrap_logger(
            capture, wrapper_class=structlog.make_filtering_bound_logger(logging.INFO), processors=[]
        ).bind()  # a concrete logger, as the agent's (not a lazy proxy that rebinds on every call)
        server = FileTimerServer(tmp / "run", owner=owned.get, on_expiry=lambda e: None, capture_stacks=False, log=log)
        await server.start()
        channels = [server.channel(r) for r in range(args.writers)]
        try:
            baseline = await victims(tmp, args.baseline) if args.baseline > 0 else []
            rss_before = rss_kib()
            cpu_before = resource.getrusage(resource.RUSAGE_SELF)
            load_before = os.getloadavg()[0]
            writers = []
            for rank, path in enumerate(channels):
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-c", WRITER, path, str(args.rate / args.writers), str(args.seconds),
                    str(args.junk_every), stdout=asyncio.subprocess.PIPE,
                )  # fmt: skip
                owned[proc.pid] = rank
                writers.append(proc)
            rss: list[int] = []
            sampler = asyncio.create_task(sample_rss(rss))
            started = time.monotonic()
            flood = await victims(tmp, args.seconds - 0.5)
            results = [(await w.communicate())[0].split() for w in writers]
            elapsed = time.monotonic() - started
            sampler.cancel()
            cpu_after = resource.getrusage(resource.RUSAGE_SELF)
            await asyncio.sleep(0.2)  # let the server read what is left
            rss_after = rss_kib()
            stats = server.stats()
        finally:
            await server.stop()
    sent = sum(int(r[0]) for r in results)
    full = sum(int(r[1]) for r in results)
    cpu = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime)
    summaries = [c for c in capture.calls if c.kwargs.get("event") == "timer_requests_rejected"]
    print(
        f"flood: {args.writers} writer processes, {args.rate:.0f} req/s for {args.seconds:.0f} s, "
        f"every {args.junk_every}th write abusive"
    )
    print(
        f"  written {sent} ({sent / elapsed:.0f}/s), pipe full {full}; accepted {stats.accepted}, "
        f"rejected {sum(stats.rejected.values())} {stats.rejected}"
    )
    print(f"  rejection log lines: {len(summaries)} (periodic summaries, one line per channel; none per request)")
    print(
        f"  agent CPU during the flood: {cpu:.2f} s over {elapsed:.1f} s; host: {os.cpu_count()} CPUs, "
        f"load average {load_before:.1f} before the flood"
    )
    if baseline:
        print(f"exit -> notice, ms, idle:  {ms(baseline)}")
    print(f"exit -> notice, ms, flood: {ms(flood)}")
    print(
        f"agent RSS KiB: before {rss_before}, after 1 s of flood {rss[min(4, len(rss) - 1)]}, "
        f"max during {max(rss)}, after {rss_after} (after - before {rss_after - rss_before:+d})"
    )
    print(f"server after: timers {stats.timers}, heap entries {stats.heap}, buffered bytes {stats.buffered}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--rate", type=float, default=6000.0, help="requests per second, all writers together")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--junk-every", type=int, default=10, help="every Nth write is abuse (0: none)")
    parser.add_argument("--baseline", type=float, default=3.0, help="seconds of exit notices before the flood")
    asyncio.run(main(parser.parse_args()))
