"""The chaos soak's arguments as bench/chaos.py's parser makes them, for tests that build a soak's real objects
(tests/test_chaos_verdict.py, test_chaos_checks.py, test_soak_own_etcd.py, test_soak_hosts.py)."""

from __future__ import annotations

import argparse


def soak_args(**over: object) -> argparse.Namespace:
    """A soak's arguments (a hosted etcd, 3 nodes, seed 1), with `over` replacing any of them."""
    args = argparse.Namespace(seed=1, duration=30.0, hosted=True, nodes=3, failure_every=4.0, steps=100,
                              job_window=30.0, classes="", standby=True, first_job=1, keep=False, replica_groups=False)
    for k, v in over.items():
        setattr(args, k, v)
    return args
