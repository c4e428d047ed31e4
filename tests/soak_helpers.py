"""The chaos soak's options as bench/chaos.py's parser makes them, for tests that build a soak's real objects
(tests/test_chaos_verdict.py, test_chaos_checks.py, test_soak_own_etcd.py, test_soak_hosts.py)."""

from __future__ import annotations

import dataclasses

from bench.soak.state import Options


def soak_args(**over: object) -> Options:
    """A soak's options (a hosted etcd, 3 nodes, seed 1), with `over` replacing any of them."""
    args = Options(seed=1, duration=30.0, hosted=True, nodes=3, failure_every=4.0, steps=100, job_window=30.0,
                   classes="", standby=True, first_job=1, keep=False, replica_groups=False)
    return dataclasses.replace(args, **over)  # type: ignore[arg-type]
