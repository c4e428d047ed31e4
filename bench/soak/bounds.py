"""The soak's settings and bounds: the spec's timings, how long each effect of a fault may take, the class names."""

from __future__ import annotations

import signal

from bench.common import ROOT

WORKER = ROOT / "bench" / "workers" / "chaos_train.py"
PREFIX = "/runner"

STEP_TIME_S = 0.1


LEASE_TTL_S = 5.0
# etcd renews every lease when it starts: its TTL counts again from there, plus an election timeout (1 s by default).
ETCD_RENEW_EXTRA_S = 1.0
HEARTBEAT_TIMEOUT_S = 8.0
GRACE_S = 3.0
CONNECT_TIMEOUT_S = 30.0
JOIN_TIMEOUT_S = 300.0
LAST_CALL_S = 2.0
FINAL_TTL_S = 3600  # docs/multinode.md: final states are kept for an hour

TICK_S = 0.1
GONE_BOUND_S = 25.0  # an ended agent's processes: the guard's kill, revoke (2 s) and cgroup wait (10 s), plus load
HANG_BOUND_S = HEARTBEAT_TIMEOUT_S * 1.25 + 20.0  # timeout, one check interval, py-spy's stacks, load
# A worker paused (SIGSTOP, SIGCONT 0.5-3 s later): from the SIGCONT, the training advances (a new checkpoint, every 5
# steps: 0.5 s) or ends, or the worker is gone (the heartbeat took the pause for a hang, or a restart replaced it).
PAUSE_BOUND_S = HANG_BOUND_S
# A dead worker is reaped by its agent only once the agent stopped the rest of its group (runner/workers/group.py: never
# before, so that its ids cannot be reused meanwhile): after FAILED, whose node-ledger mark and restart charge may each
# wait connect_timeout for etcd, then RESTARTING's stop (grace, SIGKILL, the cgroup's wait) as GONE_BOUND_S allows.
REAP_BOUND_S = GONE_BOUND_S + 2 * CONNECT_TIMEOUT_S
LEASED_KILL_SHARE = 0.75  # of kill_agent's kills: on an agent whose lease can be checked, when one can (else any)
KILL_WAIT_S = 5.0  # a SIGKILLed agent is dead (and reaped by the soak) within this, but out of an uninterruptible wait
GUARD_BOUND_S = 10.0
REVOKE_BOUND_S = 10.0  # docs: the guard revokes within 2 s of the agent's death
# A stopped agent: grace, then publishing its state and leaving the rendezvous, each bounded by connect_timeout
# when etcd does not answer (docs/multinode.md §6).
STOP_BOUND_S = GRACE_S + 2 * CONNECT_TIMEOUT_S + 25.0
# The others, once the hosting node is stopped: their own stop, while the host lingers at most grace + lease_ttl +
# connect_timeout before it stops etcd (docs/multinode.md §8).
HOSTED_STOP_BOUND_S = GRACE_S + LEASE_TTL_S + CONNECT_TIMEOUT_S + STOP_BOUND_S
ETCD_BACK_BOUND_S = 20.0
LATE_ADMIT_BOUND_S = 120.0
RACE_S = 5.0  # a worker's done marker to its exit 0 and the agent's notice, under load
HOSTED_ETCD_KILLS = 2  # the hosting agent restarts its etcd 3 times at most (docs/multinode.md §8)

CLASSES = ("kill_worker", "stop_worker", "kill_agent", "kill_guard", "signal_agent", "etcd_stop", "etcd_restart",
           "etcd_wipe", "disk_full", "partition")
ALL_CLASSES = (*CLASSES, "late_join")
# What a fault of these classes brings, checked at its job's end (beyond what it sets up as it is injected): an etcd
# fault or a partition, that the job's rounds and ranks stayed consistent (one world per attempt, each rank held once)
# and that the job ended as it must; a full logs disk, that the workers' result stood (a warning is all it may cost).
JOB_END_BRINGS = {
    "etcd_stop": ("one_world", "job_completes"),
    "etcd_restart": ("one_world", "job_completes"),
    "etcd_wipe": ("one_world", "job_completes"),
    "partition": ("one_world", "job_completes"),
    "disk_full": ("outcome_matches_workers", "job_completes"),
}
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# What the final table counts as lost (only the first two may be non-zero in a run whose invariants held).
LOST = {
    "documented": "jobs that did not finish their training: a documented loss (the hosting node lost or stopped)",
    "killed": "node runs without report.json: the agent was SIGKILLed by the soak (by design)",
    "job_completes": "jobs, or nodes' results, lost otherwise",
    "report_written": "node runs without report.json otherwise",
    "nothing_survives": "processes that outlived their job",
    "etcd_keys_expire": "etcd keys left on a live lease",
}
# Not the runner's: our etcd's own crashes (printed with its log's end, and started again).
ETCD_CRASHED = "infrastructure: the soak's etcd exited by itself (no fault stopped it); started again at once"
# The times the soak measures, from each fault to its expectation met.
MEASURED = {
    "hang_detected": "a worker left stopped gone (heartbeat_timeout 8 s)",
    "pause_went_on": "a paused worker's SIGCONT to the training going on",
    "lease_revoked": "a SIGKILLed agent's lease revoked",
    "guard_replaced": "a killed guard replaced",
    "nothing_survives": "a SIGKILLed agent's processes gone",
    "etcd_restarted": "a killed hosted etcd started again",
    "late_join_admitted": "a late node RUNNING",
}
# Agent events quoted when a job did not complete.
EVIDENCE = ("hosted_etcd_gone", "hosted_etcd_restarting", "etcd_data_lost", '"give_up"', "rendezvous_timeout")
# In an agent's output: the CLI's last resort, and asyncio's words for an exception nobody handled.
INTERNAL_ERRORS = ("internal error", "Exception in callback", "Task exception was never retrieved",
                   "exception was never retrieved", "Unhandled exception")
