"""Node loss: SIGKILL of one node's agent while 3 nodes run gloo -> the survivors' new workers past init_process_group.

Workers: bench/workers/gloo_loop.py (torch, gloo): init_process_group, a stamp, then all_reduce every 50 ms.
runner: 3 agents (nodes "2:3", etcd backend, every rendezvous and restart setting at its default: lease_ttl 10 s,
  last_call 30 s, standbys with torch preloaded), one worker each. SIGKILL the agent of node n2: its guard kills its
  worker and revokes its lease; the survivors fail (peer_lost, or their gloo all_reduce breaks first), re-form the
  round without n2 (no last_call: only members of the last round joined) and start new workers.
  Measured from the kill: the survivors' first failure transition, RUNNING again, both new workers past
  init_process_group.
torchrun (same run, side by side): 3 agents (--nnodes 2:3, c10d, the same worker); SIGKILL one agent and its worker
  (the node dies). Reported: the survivors' new workers past init_process_group within CAP seconds, or "never".

    python bench/node_loss.py [--runs 2] [--settle 8] [--cap 60] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    ROOT,
    RUNNER,
    TORCHRUN,
    Stat,
    descendants,
    kill_tree,
    machine_line,
    precompile,
    reproduce_line,
    table,
)
from runner.testing.etcd_server import EtcdServer, free_port

WORKER = ROOT / "bench" / "workers" / "gloo_loop.py"
NODES = ("n0", "n1", "n2")
VICTIM = "n2"


def stamps(out: Path, after: float = 0.0) -> list[float]:
    """When workers got past init_process_group (time.time()), those after `after` only."""
    found = []
    for p in out.glob("past-*"):
        if p.suffix != ".tmp":
            with contextlib.suppress(OSError, ValueError):
                found.append(float(p.read_text()))
    return [t for t in found if t > after]


def wait_until(cond: object, timeout: float) -> bool:
    """Poll `cond()` every 10 ms until true or `timeout` s passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def spawn(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    """A launcher in its own session, output discarded."""
    return subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def runner_spec(work: Path, endpoint: str, run: int) -> Path:
    """3-node elastic job, one gloo worker per node; rendezvous and restart settings at their defaults."""
    spec = work / "job.yaml"
    spec.write_text(textwrap.dedent(f"""\
        version: 1
        name: bench-loss-{run}-{os.getpid()}
        entrypoint: {{script: {WORKER}}}
        nodes: "2:3"
        nproc_per_node: 1
        rendezvous: {{backend: etcd, endpoints: ["{endpoint}"], master_addr: 127.0.0.1}}
        logs: {{dir: logs, tee: false, format: json}}
        """))
    return spec


def transitions(work: Path, node: str) -> list[dict[str, Any]]:
    """Every transition of `node` (logs.dir is relative to the node's cwd)."""
    found: list[dict[str, Any]] = []
    for path in (work / "nodes" / node).glob("logs/*/*/transitions.jsonl"):
        if not path.parent.is_symlink() and path.parent.name != "latest":
            found += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return found


def first_after(work: Path, node: str, after: float, triggers: tuple[str, ...]) -> tuple[float, str] | None:
    """(time, trigger) of the node's first transition among `triggers` after `after`."""
    for t in transitions(work, node):
        if t["trigger"] in triggers and t["time"] >= after:
            return t["time"], t["trigger"]
    return None


FAILED_BY = ("peer_lost", "worker_failed")


@dataclass
class Recovery:
    """One runner run, in seconds from the kill."""

    detect: float  # the last survivor's failure transition
    running: float  # the last survivor's RUNNING again
    past_init: float  # the last new worker past init_process_group
    by: list[str]  # the survivors' failure triggers


def runner_run(run: int, etcd: EtcdServer, base: Path, settle: float, cap: float) -> Recovery | None:
    """Seconds from the kill to the survivors' failure, RUNNING again and new workers past init (None: no recovery)."""
    work = base / f"runner-{run}"
    out = work / "out"
    out.mkdir(parents=True)
    spec = runner_spec(work, etcd.endpoint, run)
    subprocess.run([*RUNNER, "validate", str(spec)], check=True, capture_output=True)
    env = {**os.environ, "BENCH_OUT": str(out), "OMP_NUM_THREADS": "1"}
    procs = {}
    for n in NODES:
        (work / "nodes" / n).mkdir(parents=True)
        procs[n] = spawn([*RUNNER, str(spec), "--node", n], env, work / "nodes" / n)
    try:
        if not wait_until(lambda: len(stamps(out)) == len(NODES), 180):
            return None
        time.sleep(settle)  # the standbys import torch again; the lease keep-alives settle into their rhythm
        t_kill = time.time()
        procs[VICTIM].send_signal(signal.SIGKILL)
        survivors = [n for n in NODES if n != VICTIM]
        if not wait_until(lambda: len(stamps(out, t_kill)) == len(survivors), cap):
            return None
        past = max(stamps(out, t_kill)) - t_kill
        failed = [f for n in survivors if (f := first_after(work, n, t_kill, FAILED_BY))]
        back = [b for n in survivors if (b := first_after(work, n, t_kill, ("rendezvous_complete",)))]
        if len(failed) < len(survivors) or len(back) < len(survivors):
            return None
        return Recovery(max(f[0] for f in failed) - t_kill, max(b[0] for b in back) - t_kill, past,
                        sorted({f[1] for f in failed}))
    finally:
        subprocess.run([*RUNNER, "stop", str(spec)], capture_output=True, check=False, timeout=60)
        for p in procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(30)
            if p.poll() is None:
                kill_tree(p.pid, grace=0)
                p.wait()


def torchrun_run(run: int, base: Path, settle: float, cap: float) -> float | None:
    """Seconds from the kill to the survivors' new workers past init_process_group, or None if none within `cap` s."""
    work = base / f"torchrun-{run}"
    out = work / "out"
    out.mkdir(parents=True)
    env = {**os.environ, "BENCH_OUT": str(out), "OMP_NUM_THREADS": "1"}
    port = free_port()
    argv = [*TORCHRUN, "--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"loss-{run}", "--max-restarts", "3",
            "--monitor-interval", "0.1", str(WORKER)]
    procs = [spawn(argv, env, work) for _ in NODES]
    try:
        if not wait_until(lambda: len(stamps(out)) == len(NODES), 180):
            return None
        time.sleep(settle)
        victim = procs[-1]  # not the first: that one hosts the c10d store
        t_kill = time.time()
        for pid in [victim.pid, *descendants(victim.pid)]:  # the node dies: its agent and its worker
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if wait_until(lambda: len(stamps(out, t_kill)) == len(NODES) - 1, cap):
            return max(stamps(out, t_kill)) - t_kill
        return None
    finally:
        for p in procs:
            kill_tree(p.pid, grace=2)
            with contextlib.suppress(ChildProcessError):
                p.wait()
        for f in out.glob("past-*"):  # workers left behind by a SIGKILLed agent
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(f.name.rsplit("-", 1)[1]), signal.SIGKILL)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--settle", type=float, default=8.0, help="s between all workers past init and the kill")
    p.add_argument("--cap", type=float, default=60.0, help="how long to wait for the survivors' new workers, s")
    p.add_argument("--keep", action="store_true", help="keep the runs' logs (their folder is printed)")
    args = p.parse_args()
    precompile()
    base = Path(tempfile.mkdtemp(prefix="bench-loss-"))
    etcd = EtcdServer(base / "etcd-data")
    runner: list[Recovery | None] = []
    torch: list[float | None] = []
    try:
        etcd.start()
        for run in range(args.runs):
            runner.append(runner_run(run, etcd, base, args.settle, args.cap))
            print(f"runner run {run}: {runner[-1]}", file=sys.stderr)
            torch.append(torchrun_run(run, base, args.settle, args.cap))
            print(f"torchrun run {run}: {torch[-1]}", file=sys.stderr)
    finally:
        etcd.kill()
        if args.keep:
            print(f"logs kept in {base}", file=sys.stderr)
        else:
            with contextlib.suppress(OSError):
                shutil.rmtree(base)
    print(report(runner, torch, args))


def report(runner: list[Recovery | None], torch: list[float | None], args: argparse.Namespace) -> str:
    """The Markdown section."""
    good = [r for r in runner if r]
    t_good = [t for t in torch if t is not None]
    rows = []
    if good:
        by = sorted({b for r in good for b in r.by})
        rows.append(["runner", f"{Stat.of([r.detect for r in good]).fmt(digits=2)} ({', '.join(by)})",
                     Stat.of([r.running for r in good]).fmt(digits=2), Stat.of([r.past_init for r in good]).fmt(digits=2),
                     f"{len(good)}/{len(runner)}"])
    rows.append(["torchrun", "-", "-", Stat.of(t_good).fmt(digits=2) if t_good else f"never (none within {args.cap:g} s)",
                 f"{len(t_good)}/{len(torch)}"])
    ratio = ""
    if good and t_good:
        times = Stat.of(t_good).median / Stat.of([r.past_init for r in good]).median
        ratio = f"torchrun takes {times:.1f}x the runner's time (medians)."
    return "\n".join([
        "### SIGKILL of one node's agent (3 nodes, elastic 2:3, gloo): survivors' new workers past init_process_group",
        "",
        f"Machine: {machine_line()}",
        "",
        ("Defaults: lease_ttl 10 s, last_call 30 s, standbys with torch preloaded; the kill comes "
         f"{args.settle:g} s after every worker got past init_process_group."),
        "",
        table(["launcher", "survivors failed, s (by)", "RUNNING again, s", "new workers past init, s", "recovered runs"],
              rows),
        "",
        *([ratio, ""] if ratio else []),
        "Target: <= 1.5 s from the kill to the survivors' new workers past init_process_group.",
        "",
        f"Reproduce: `{reproduce_line()}`",
    ])


if __name__ == "__main__":
    main()
