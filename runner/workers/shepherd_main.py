"""Guard process: kills the workers' process groups if the agent dies, even by SIGKILL.

Run as `python -S -I shepherd.py` with a pipe from the agent on stdin. The agent writes `+PGID` when it
starts a worker and `-PGID` once that group is gone. When the pipe reaches EOF (the agent exited, however
it exited) every group still listed is SIGKILLed: the workers and their own children alike.
"""

import os
import signal
import sys


def main() -> None:
    """Track process groups from stdin; kill the remaining ones at EOF."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    groups: set[int] = set()
    for line in sys.stdin:
        op, _, num = line.strip().partition(" ")
        if not num.isdigit():
            continue
        (groups.add if op == "+" else groups.discard)(int(num))
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass


if __name__ == "__main__":
    main()
