"""A worker that leaks: it double-forks a grandchild that calls setsid() (as torchrun's workers' helpers can), then
records pids and behaves as told. No torch.

Writes <dir>/rank<R>.json: {"pid", "escapee"} once the escapee runs. Options:
  --scrub-env  the escapee clears its environment (exec with env={}): only a cgroup or the subreaper finds it
  --exit N     exit N right away after the escapee started (else sleep --sleep seconds)
  --signals    record every stop signal received in <dir>/rank<R>.signals (KeyboardInterrupt included)
"""

import argparse
import json
import os
import signal
import sys
import time

SLEEPER = [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"]


def spawn_escapee(scrub: bool) -> int:
    """Double fork + setsid: the grandchild leaves our session and process group; returns its pid."""
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(r)
        os.setsid()
        grandchild = os.fork()
        if grandchild == 0:
            os.close(w)
            env = {} if scrub else dict(os.environ)
            os.execve(SLEEPER[0], SLEEPER, env)
        os.write(w, str(grandchild).encode())
        os._exit(0)
    os.close(w)
    pid = int(os.read(r, 64).decode())
    os.close(r)
    os.waitpid(child, 0)
    return pid


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--sleep", type=float, default=3600.0)
    p.add_argument("--exit", type=int, default=None)
    p.add_argument("--scrub-env", action="store_true")
    p.add_argument("--signals", action="store_true")
    a = p.parse_args()
    rank = os.environ.get("RANK", "0")
    sigfile = os.path.join(a.dir, f"rank{rank}.signals")

    def record(name: str) -> None:
        with open(sigfile, "a") as f:
            f.write(name + "\n")

    if a.signals:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(sig, lambda s, _f: (record(signal.Signals(s).name), sys.exit(128 + s)))
    escapee = spawn_escapee(a.scrub_env)
    path = os.path.join(a.dir, f"rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "escapee": escapee}, f)
    os.replace(path + ".tmp", path)
    if a.exit is not None:
        sys.exit(a.exit)
    try:
        time.sleep(a.sleep)
    except KeyboardInterrupt:
        record("KeyboardInterrupt")
        sys.exit(130)


if __name__ == "__main__":
    main()
