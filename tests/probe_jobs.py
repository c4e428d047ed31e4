"""Jobs of tests/fixtures/workers/worker_probe.py processes (the `job` fixture's spec text), for single-node tests."""

from __future__ import annotations

PROBE_JOB = """
version: 1
name: probe
entrypoint:
  script: ${{PROBE}}
  args: ["--dir", "${{OUT}}", {args}]
nproc_per_node: {nproc}
logs: {{dir: "${{LOGS}}"}}
restart:
  max_restarts: {max_restarts}
  backoff: {{initial: 0.1s, max: 0.2s}}
  non_retryable_exit_codes: [{non_retryable}]
  scope: {scope}
  preload: []  # the probe imports nothing: preload nothing (docs/standby.md); still forked warm from the fork server
shutdown: {{grace_period: {grace}}}
"""


def probe_job(job, args: str = "", nproc: int = 2, max_restarts: int = 0, scope: str = "group",
              grace: str = "5s", non_retryable: str = ""):
    """A job of worker_probe processes."""
    return job(PROBE_JOB.format(args=args.strip(", ") or '"--sleep", "0"', nproc=nproc, max_restarts=max_restarts,
                                scope=scope, grace=grace, non_retryable=non_retryable))
