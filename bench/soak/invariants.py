"""Every invariant the chaos soak checks, in one place: its name (what a `Violation` and the tally carry) and the mode
that checks it. The checks themselves live with their evidence (checks.py, faults.py, soak.py, hosts.py,
replicas.py); docs/faults.md "Chaos soak" says what each holds when.

tests/soak/test_chaos_invariants.py keeps this table honest both ways: every invariant name the soak's code can raise or
count (a `Violation`, an expectation, the tally, JOB_END_BRINGS, MOOT_WHY) is declared here, and every one declared
here has a test that feeds the soak a run violating it and sees the violation. A new check fails the suite until
both are added.
"""

from __future__ import annotations

# name -> the modes that check it (default: the base soak, with an external or --hosted etcd; hosts: --hosts;
# replicas: --replica-groups)
INVARIANTS: dict[str, str] = {
    "no_internal_error": "default, hosts, replicas",
    "report_written": "default, hosts, replicas",
    "outcome_matches_workers": "default, hosts, replicas",
    "attempts_recorded": "default, hosts, replicas",
    "stop_honoured": "default, hosts, replicas",
    "nothing_survives": "default, hosts, replicas",
    "job_completes": "default, hosts, replicas",
    "hang_detected": "default, hosts, replicas",
    "pause_went_on": "default, hosts, replicas",
    "guard_replaced": "default, hosts, replicas",
    "lease_revoked": "default, hosts",
    "etcd_restarted": "default (--hosted)",
    "etcd_keys_expire": "default, hosts",
    "etcd_unharmed": "default, hosts",
    "late_join_admitted": "default, hosts",
    "one_world": "default, hosts",
    "no_rank_twice": "hosts",
    "lease_expired": "hosts",
    "fenced": "hosts",
    "member_loss_survived": "hosts (--hosted, hosted_members 3)",
    "no_etcd_left": "hosts (--hosted)",
    "group_restarts_reported": "replicas",
    "lighthouse_restarted": "replicas",
    "lighthouse_up": "replicas",
    "survivor_advanced": "replicas",
}
