"""What a long wait costs: an agent waiting in an etcd rendezvous that misses a node (nodes 2, one started).

Two runs of WAIT s each, measured from the 5th second on (start-up excluded):
  terminal: stdout and stderr on a pty (the calm console: the live line is redrawn in place);
  json:     stderr on a pipe, with `logs.format: json` (JSON lines).
Per run: the agent's CPU (utime + stime of its main process, /proc/<pid>/stat) per minute of waiting, the bytes it
wrote to the console per minute, and the `waiting` events agent.jsonl got.

    python bench/wait_cost.py [--wait 30]
"""

from __future__ import annotations

import argparse
import os
import pty
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runner.testing.etcd_server import etcd_server

SPEC = """\
version: 1
name: waitcost
entrypoint: {{script: work.py}}
nodes: 2
nproc_per_node: 1
rendezvous: {{backend: etcd, endpoints: ["{endpoint}"], master_addr: 127.0.0.1, join_timeout: 1h}}
logs: {{dir: logs{fmt}}}
"""
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """utime + stime of `pid`, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def measure(folder: Path, endpoint: str, wait: float, *, terminal: bool) -> tuple[float, float, int]:
    """(CPU s per minute, console bytes per minute, waiting events) of one agent waiting `wait` s."""
    folder.mkdir(parents=True)
    (folder / "work.py").write_text("print('hi')\n")
    (folder / "job.yaml").write_text(SPEC.format(endpoint=endpoint, fmt="" if terminal else ", format: json"))
    env = dict(os.environ, XDG_STATE_HOME=str(folder / "state"), NO_COLOR="")
    if terminal:
        reader, writer = pty.openpty()
    else:
        reader, writer = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "runner", "job.yaml", "--node", "alone"], cwd=folder, env=env,
                            stdin=subprocess.DEVNULL, stdout=writer, stderr=writer)
    os.close(writer)
    written = 0
    try:
        start = time.monotonic()
        cpu0 = None
        while time.monotonic() - start < 5 + wait:
            if cpu0 is None and time.monotonic() - start >= 5:
                cpu0, written = cpu_s(proc.pid), 0
            if select.select([reader], [], [], 0.2)[0]:
                written += len(os.read(reader, 65536))
        cpu = cpu_s(proc.pid) - (cpu0 or 0.0)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(reader)
    run = next(d for d in (folder / "logs" / "waitcost").iterdir() if not d.is_symlink())
    events = (run / "agent.jsonl").read_text().count('"event": "waiting"')
    return cpu * 60 / wait, written * 60 / wait, events


def main() -> None:
    """Print one line per run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wait", type=float, default=30.0, help="seconds of waiting measured per run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, etcd_server(Path(tmp) / "etcd") as etcd:
        for name, terminal in (("terminal", True), ("json", False)):
            cpu, written, events = measure(Path(tmp) / name, etcd.endpoint, args.wait, terminal=terminal)
            print(f"{name:8}  agent CPU {cpu * 1000:6.1f} ms/min   console {written:7.0f} B/min   "
                  f"waiting events in {5 + args.wait:g} s: {events}")


if __name__ == "__main__":
    main()
