"""Node loss: SIGKILL of one node's agent while 3 nodes run -> how long until the survivors run new workers.

runner: 3 agents (nodes "2:3", etcd backend, lease_ttl TTL, last_call LC), one worker each that sleeps.
  SIGKILL the agent of node n2 (its shepherd then kills its worker). The survivors see its lease expire
  (PeerLost), go FAILED -> RESTARTING -> RENDEZVOUS (round 1 closes after last_call with 2 nodes) -> RUNNING.
  Measured from the kill: peer_lost transition (detection), RUNNING again, new workers' first statement.
torchrun (same run, side by side): 3 agents (--nnodes 2:3, c10d backend, same worker); SIGKILL one agent and
  its worker (the whole node dies). Survivors' workers that do not talk to the dead one are never restarted:
  torchrun notices a lost node only at the next rendezvous. Reported: new workers within CAP seconds or not.

    python bench/node_loss.py [--runs 3] [--ttl 3] [--last-call 0.5] [--cap 30]
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
from pathlib import Path

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
from tests.etcd_server import EtcdServer, free_port

WORKER = ROOT / "bench" / "workers" / "start_stamp.py"
NODES = ("n0", "n1", "n2")
VICTIM = "n2"


def stamps(out: Path, restart: str) -> list[float]:
    """Start times of the workers of restart count `restart`."""
    return [float(p.read_text()) for p in out.glob(f"start-*-{restart}-*") if p.suffix != ".tmp"]


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


def runner_spec(work: Path, endpoint: str, run: int, ttl: float, last_call: float) -> Path:
    """3-node elastic job, one sleeping worker per node."""
    spec = work / "job.yaml"
    spec.write_text(textwrap.dedent(f"""\
        version: 1
        name: bench-loss-{run}-{os.getpid()}
        entrypoint: {{script: {WORKER}}}
        nodes: "2:3"
        nproc_per_node: 1
        rendezvous: {{backend: etcd, endpoints: ["{endpoint}"], master_addr: 127.0.0.1, last_call: {last_call}s,
                      lease_ttl: {ttl}s}}
        restart: {{max_restarts: 3, backoff: {{initial: 0.1s}}}}
        shutdown: {{grace_period: 2s}}
        logs: {{dir: logs, tee: false, format: json}}
        """))
    return spec


def transition_time(work: Path, node: str, trigger: str, after: float) -> float | None:
    """time.time() of the first transition `trigger` of `node` after `after`."""
    for path in (work / "nodes" / node).glob("logs/*/*/transitions.jsonl"):  # logs.dir is relative to the cwd
        for line in path.read_text().splitlines():
            t = json.loads(line)
            if t["trigger"] == trigger and t["time"] >= after:
                return float(t["time"])
    return None


def runner_run(run: int, etcd: EtcdServer, base: Path, ttl: float, last_call: float) -> dict[str, float] | None:
    """Seconds from the kill to detection, RUNNING again and new workers (None if it did not recover)."""
    work = base / f"runner-{run}"
    out = work / "out"
    out.mkdir(parents=True)
    spec = runner_spec(work, etcd.endpoint, run, ttl, last_call)
    subprocess.run([*RUNNER, "validate", str(spec)], check=True, capture_output=True)
    env = {**os.environ, "BENCH_OUT": str(out), "BENCH_SLEEP": "600"}
    procs = {}
    for n in NODES:
        (work / "nodes" / n).mkdir(parents=True)
        procs[n] = spawn([*RUNNER, str(spec), "--node", n], env, work / "nodes" / n)
    try:
        if not wait_until(lambda: len(stamps(out, "0")) == len(NODES), 120):
            return None
        time.sleep(1.0)  # let the lease keep-alives settle into their rhythm
        t_kill = time.time()
        procs[VICTIM].send_signal(signal.SIGKILL)
        ok = wait_until(lambda: len(stamps(out, "1")) == len(NODES) - 1, ttl + last_call + 60)
        if not ok:
            return None
        new = max(stamps(out, "1")) - t_kill
        survivors = [n for n in NODES if n != VICTIM]
        lost = [transition_time(work, n, "peer_lost", t_kill) for n in survivors]
        back = [transition_time(work, n, "rendezvous_complete", t_kill) for n in survivors]
        if None in lost or None in back:
            return None
        return {"detect": max(lost) - t_kill, "running": max(back) - t_kill, "workers": new}  # type: ignore[type-var]
    finally:
        subprocess.run([*RUNNER, "stop", str(spec)], capture_output=True, check=False, timeout=60)
        for p in procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(30)
            if p.poll() is None:
                kill_tree(p.pid, grace=0)
                p.wait()


def torchrun_run(run: int, base: Path, cap: float) -> float | None:
    """Seconds from the kill to the survivors' new workers, or None if none started within `cap` s."""
    work = base / f"torchrun-{run}"
    out = work / "out"
    out.mkdir(parents=True)
    env = {**os.environ, "BENCH_OUT": str(out), "BENCH_SLEEP": "600", "OMP_NUM_THREADS": "1"}
    port = free_port()
    argv = [*TORCHRUN, "--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"loss-{run}", "--max-restarts", "3",
            "--monitor-interval", "0.1", "--rdzv-conf", "last_call_timeout=1", str(WORKER)]
    procs = [spawn(argv, env, work) for _ in NODES]
    try:
        if not wait_until(lambda: len(stamps(out, "0")) == len(NODES), 120):
            return None
        time.sleep(1.0)
        victim = procs[-1]
        t_kill = time.time()
        for pid in [victim.pid, *descendants(victim.pid)]:  # the node dies: its agent and its worker
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if wait_until(lambda: len(stamps(out, "1")) >= 1, cap):
            return max(stamps(out, "1")) - t_kill
        return None
    finally:
        for p in procs:
            kill_tree(p.pid, grace=2)
            with contextlib.suppress(ChildProcessError):
                p.wait()
        for f in out.glob("start-*"):  # workers left behind by a SIGKILLed agent
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(f.name.rsplit("-", 1)[1]), signal.SIGKILL)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--ttl", type=float, default=3.0, help="rendezvous.lease_ttl, s")
    p.add_argument("--last-call", type=float, default=0.5, help="rendezvous.last_call, s")
    p.add_argument("--cap", type=float, default=30.0, help="how long to wait for torchrun's survivors, s")
    args = p.parse_args()
    precompile()
    base = Path(tempfile.mkdtemp(prefix="bench-loss-"))
    etcd = EtcdServer(base / "etcd-data")
    runner: list[dict[str, float] | None] = []
    torch: list[float | None] = []
    try:
        etcd.start()
        for run in range(args.runs):
            runner.append(runner_run(run, etcd, base, args.ttl, args.last_call))
            print(f"runner run {run}: {runner[-1]}", file=sys.stderr)
            torch.append(torchrun_run(run, base, args.cap))
            print(f"torchrun run {run}: {torch[-1]}", file=sys.stderr)
    finally:
        etcd.kill()
        with contextlib.suppress(OSError):
            shutil.rmtree(base)
    print(report(runner, torch, args))


def report(runner: list[dict[str, float] | None], torch: list[float | None], args: argparse.Namespace) -> str:
    """The Markdown section."""
    good = [r for r in runner if r]
    rows = []
    if good:
        rows.append(["runner", Stat.of([r["detect"] for r in good]).fmt(digits=2),
                     Stat.of([r["running"] for r in good]).fmt(digits=2),
                     Stat.of([r["workers"] for r in good]).fmt(digits=2), f"{len(good)}/{len(runner)}"])
    t_good = [t for t in torch if t is not None]
    rows.append(["torchrun", "-", "-", Stat.of(t_good).fmt(digits=2) if t_good else f"none within {args.cap:g} s",
                 f"{len(t_good)}/{len(torch)}"])
    budget = args.ttl + args.last_call + 1
    return "\n".join([
        "### SIGKILL of one node's agent (3 nodes, elastic 2:3): survivors' new workers running",
        "",
        f"Machine: {machine_line()}",
        "",
        f"lease_ttl {args.ttl:g} s, last_call {args.last_call:g} s (round 1 waits last_call for more nodes).",
        "",
        table(["launcher", "peer_lost seen, s", "RUNNING again, s", "new workers started, s", "recovered runs"],
              rows),
        "",
        f"Target: new workers within lease TTL + 1 s = {args.ttl + 1:g} s (with last_call: {budget:g} s).",
        "",
        f"Reproduce: `{reproduce_line()}`",
    ])


if __name__ == "__main__":
    main()
