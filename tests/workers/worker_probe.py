"""A worker for integration tests (no torch): records what it saw, then behaves as told.

Writes <dir>/rank<R>.attempt<A>.json with its pid, env contract and (if asked) its child's pid; appends
"term" to <dir>/rank<R>.signals when it gets SIGTERM.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--sleep-later", type=float, default=None, help="the sleep of attempts after the first (default: --sleep)")
    p.add_argument("--exit", type=int, default=0, help="exit code once done")
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-attempts", type=int, default=0, help="fail-rank exits with --fail-code on attempts < N")
    p.add_argument("--fail-code", type=int, default=3)
    p.add_argument("--fail-after", type=float, default=0.2)
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--spawn-child", action="store_true", help="start a grandchild that sleeps forever")
    a = p.parse_args()
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    sigfile = os.path.join(a.dir, f"rank{rank}.signals")

    def on_term(signum: int, frame: object) -> None:
        with open(sigfile, "a") as f:
            f.write("term\n")
        if not a.ignore_term:
            sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"]) if a.spawn_child else None
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "child_pid": child.pid if child else None,
        "env": {k: v for k, v in os.environ.items() if k.startswith(("TORCHELASTIC", "RANK", "LOCAL", "WORLD",
                                                                       "GROUP", "ROLE", "MASTER", "OMP", "RUNNER"))},
    }
    path = os.path.join(a.dir, f"rank{rank}.attempt{attempt}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(info, f)
    os.replace(path + ".tmp", path)
    if rank == a.fail_rank and attempt < a.fail_attempts:
        time.sleep(a.fail_after)
        print(f"rank {rank} failing on attempt {attempt} with code {a.fail_code}", file=sys.stderr, flush=True)
        sys.exit(a.fail_code)
    deadline = time.monotonic() + (a.sleep if attempt == 0 or a.sleep_later is None else a.sleep_later)
    while time.monotonic() < deadline:
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    print(f"rank {rank} done on attempt {attempt}", flush=True)
    sys.exit(a.exit)


if __name__ == "__main__":
    main()
