"""Seeded chaos soak: real agents, real etcd, a real training job, and a random schedule of faults; invariants after each.

    python bench/chaos.py --seed N --duration SECONDS [--hosted] [--nodes K] [--failure-every S]
                          [--steps N] [--job-window S] [--classes a,b,...] [--no-standby] [--first-job N] [--keep]
    python bench/chaos.py --replica-groups --seed N --duration SECONDS [...]
    python bench/chaos.py --hosts [--etcd-members 1|3] --seed N --duration SECONDS [...]

Only the entry: the soak is the package bench/soak/ (bench/soak/cli.py describes it), imported once, under its own
name. Method, classes, invariants and the verdict: docs/faults.md "Chaos soak".
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.soak.cli import main

if __name__ == "__main__":
    sys.exit(main())
