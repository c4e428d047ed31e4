"""The chaos soak's command line (bench/chaos.py runs it). Seeded chaos soak: real agents, real etcd, a real training job, and a random schedule of faults; invariants after each.

    python bench/chaos.py --seed N --duration SECONDS [--hosted] [--nodes K] [--failure-every S]
                          [--steps N] [--job-window S] [--classes a,b,...] [--no-standby] [--first-job N] [--keep]
    python bench/chaos.py --replica-groups --seed N --duration SECONDS [...]
    python bench/chaos.py --hosts [--etcd-members 1|3] --seed N --duration SECONDS [...]
    python bench/chaos.py --hosts --hosted [--hosted-members 1|3] --seed N --duration SECONDS [...]

--hosts runs every node on a simulated host of its own (runner/testing/hosts.py: its own network, address, hostname,
/tmp and processes), the etcd on a host of its own (or 3 members on 3, --etcd-members 3), and adds the classes
host_loss and link_cut, with invariants across hosts: bench/soak/hosts.py (root only). With --hosted, the job's own
nodes host the etcd instead (`rendezvous.hosted`, `hosted_members` 3 by default: members on n0, n1 and n2, each host
given the job's secret), and host_loss and link_cut hit member hosts too: a job a member host's loss ended, while the
others kept a quorum, fails the soak (member_loss_survived); no etcd nor its data is left on any host (no_etcd_left).

--replica-groups soaks single-node replica-group jobs (2 TorchFT groups, the hosted lighthouse) instead, with faults
and invariants of their own: bench/soak/replicas.py.

Every job of the soak: K agents (`python -m runner run job.yaml --node nK`, each in its own session and folder, as
the bench/ multinode benchmarks start them) on this machine, elastic `nodes: "2:K"`, one gloo DDP worker each
(bench/workers/chaos_train.py: a few steps per second, a checkpoint every 5 steps, resumed by every attempt, exit 0
after --steps steps). The rendezvous is a real etcd (runner/testing/etcd_server.py: temp data dir, loopback ports) or, with
--hosted, the etcd one of the agents hosts (`rendezvous.hosted: true`). The spec turns the watchdog's heartbeat on
(8 s), so a stopped worker is a hang the agent must kill.

Faults, their classes dealt from a seeded deck (every enabled class once per round: bench/soak/schedule.py), their
parameters drawn from random.Random("SEED:JOB"), about every --failure-every seconds while a job runs (for at most
--job-window seconds per job; then the job must finish, and the next one starts until --duration is spent; job N's
schedule does not depend on the jobs before it, so `--first-job N` replays it alone; an enabled class that never
fired with a target by then gets one make-up job, drawing only such classes):

| class | what |
|---|---|
| kill_worker | SIGKILL one worker |
| stop_worker | SIGSTOP one worker: SIGCONT 0.5-3 s later (a pause), or never (a hang the watchdog must kill) |
| kill_agent | SIGKILL one agent (3 in 4: one whose lease can be read); requeued 2-10 s later (a scheduler's) |
| kill_guard | SIGKILL one of an agent's guards (the shepherd: cmdline has runner.system.shepherd_main) |
| signal_agent | SIGTERM, SIGINT or SIGHUP to one agent; requeued 2-10 s later (not the hosting node: it stops the job) |
| etcd_stop | etcd down for 1-12 s (SIGTERM, start again on the same data); hosted: etcd frozen (SIGSTOP/SIGCONT) |
| etcd_restart | SIGKILL etcd and start it again at once; hosted: SIGKILL the hosted etcd (its agent restarts it) |
| etcd_wipe | SIGKILL etcd, delete its data dir, start it fresh on the same ports; hosted: the same to the hosted etcd |
| disk_full | fill the tmpfs every node's logs.dir is on (mounted by the soak) for 3-30 s |
| partition | cut the network of the node that runs in its own network namespace (veth pair) for 1-15 s |
| late_join | (drawn per job) one node starts 3-18 s after the others |

A fault only ever reaches a process the soak started or proved to be the job's: agents are its own children (never
reaped before it signals them); workers, guards and a hosted etcd are signalled through a pidfd after /proc shows
the same start time and the job's mark (its token in the environment, or the agent as parent).

Invariants (the first violation ends the soak with exit code 1, the seed, the invariant, the evidence and the replay
command): report_written, outcome_matches_workers, attempts_recorded, nothing_survives, no_internal_error,
etcd_keys_expire, hang_detected, pause_went_on, guard_replaced, lease_revoked, stop_honoured, etcd_restarted,
late_join_admitted, one_world, job_completes, etcd_unharmed (the soak's own etcd is never killed by a signal no fault sent): see docs/faults.md
"Chaos soak". An etcd of the soak's that exits by itself (etcd's own crash) is printed with its log's end, counted
under "infrastructure" and started again at once, as etcd_restart does. The run also fails (exit code 1) when it did not try: an enabled class
that never fired with a real target, or an invariant a fired class brings that held fewer than its minimum times
(bench/soak/verdict.py); per invariant it prints how many checks held, broke and did not apply (one that could not
be set up, as lease_revoked with etcd down at the kill, did not apply and says why). A fault that had no effect (a
signal to an agent that had already exited) is not counted as injected. A class the machine
cannot run (no root for the tmpfs, no network namespace), or that the other options rule out (late_join and
partition with --nodes 2), is skipped and printed with the reason, and never counted as fired; one the options rule out that
--classes names is refused. Exit code 2: the soak
itself failed (or was interrupted), not the runner.

The code: bench/soak/ (cli.py this command line, soak.py the loop composing the parts below, state.py the typed
options and shared state, schedule.py the deck, faults.py the classes, checks.py the invariants, verdict.py the tally
and verdict, processes.py a job's processes, procs.py /proc, infra.py etcd / network namespace / tmpfs, etcd_view.py
and etcd_reads.py keys and leases, model.py the records, bounds.py the bounds, hosts.py and replicas.py the other
modes); bench/chaos.py is only its entry.

Everything is bounded: every wait has a timeout, and on exit every process started is killed and reaped, the tmpfs
unmounted, the network namespace deleted and etcd stopped.
"""

from __future__ import annotations

import argparse
import random
import shutil
import signal
import sys

from bench.soak.soak import Soak
from bench.soak.state import Options
from runner.testing.etcd_server import etcd_binary


def pick_soak(p: argparse.ArgumentParser, args: argparse.Namespace) -> type[Soak] | str:
    """The soak the options ask for, or why this machine cannot run it."""
    if args.replica_groups:
        from bench.soak.replicas import ReplicaSoak, missing_torchft

        if args.hosted:
            p.error("--replica-groups runs one node with no etcd: --hosted does not apply")
        return missing_torchft() or ReplicaSoak
    if args.hosts:
        from bench.soak.hosts import HostSoak
        from runner.testing.hosts import why_not

        if args.hosted and args.etcd_members != 1:
            p.error("--hosts --hosted: the job's nodes host the etcd (--hosted-members): --etcd-members does not apply")
        args.hosted_members = args.hosted_members or (3 if args.hosted else 1)
        if args.hosted_members != 1 and not args.hosted:
            p.error("--hosted-members needs --hosted (without it the etcd runs on hosts of its own: --etcd-members)")
        if args.hosted_members > 1 and args.nodes < args.hosted_members:
            p.error(f"--hosted-members {args.hosted_members} needs --nodes {args.hosted_members} or more (a job of "
                    f"fewer nodes keeps one member: docs/multinode.md)")
        why = why_not()
        return f"--hosts: {why}" if why else HostSoak
    return Soak


def check_classes(p: argparse.ArgumentParser, soak: type[Soak], args: argparse.Namespace) -> None:
    """--classes names only classes of this soak, and none that the other options rule out (one not asked for by
    name is skipped instead, and the run says so)."""
    asked = set(filter(None, args.classes.split(",")))
    unknown = asked - set(soak.all_classes)
    if unknown:
        p.error(f"unknown classes {sorted(unknown)}; known: {', '.join(soak.all_classes)}")
    for cls, why in sorted(soak.ruled_out(Options.of(args)).items()):
        if cls in asked:
            p.error(f"--classes {cls}: the other options rule it out: it {why}; change them or leave {cls} out")


def check_modes(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse the options a mode does not take (argparse's error: exit 2 with the reason)."""
    if args.single_member_faults and not (args.hosts and args.hosted):
        p.error("--single-member-faults needs --hosts --hosted")
    if args.etcd_members != 1 and not args.hosts:
        p.error("--etcd-members needs --hosts (the default mode runs one etcd on this machine)")
    if args.hosted_members is not None and not args.hosts:
        p.error("--hosted-members needs --hosts --hosted (the default mode runs every node on one machine: one member)")
    if not args.hosts:
        args.hosted_members = 1
    if args.replica_groups and args.hosts:
        p.error("--replica-groups runs one node: --hosts does not apply")


def main() -> int:
    p = argparse.ArgumentParser(prog="python bench/chaos.py", description="Seeded chaos soak: real agents, real etcd, a real training job, random faults; invariants after each.")
    p.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    p.add_argument("--duration", type=float, default=300.0, help="seconds of faults in all (jobs end after it)")
    p.add_argument("--hosted", action="store_true", help="rendezvous.hosted: one agent hosts etcd")
    p.add_argument("--nodes", type=int, default=3, help="agents per job (nodes: 2:K)")
    p.add_argument("--failure-every", type=float, default=10.0, help="mean seconds between faults")
    p.add_argument("--steps", type=int, default=200, help="training steps per job (0.1 s each)")
    p.add_argument("--job-window", type=float, default=60.0, help="seconds of faults per job, then it must end")
    p.add_argument("--classes", default="", help="comma-separated fault classes to draw from (default: all)")
    p.add_argument("--no-standby", dest="standby", action="store_false",
                   help="restart.standby false (cold workers); the default is the product's: warm workers forked "
                        "from the fork server")
    p.add_argument("--first-job", type=int, default=1, help="number of the first job (replays job N's schedule)")
    p.add_argument("--keep", action="store_true", help="keep every log (a failing run keeps them anyway)")
    p.add_argument("--replica-groups", action="store_true",
                   help="single-node replica-group jobs (2 groups, hosted TorchFT lighthouse): bench/soak/replicas.py")
    p.add_argument("--hosts", action="store_true",
                   help="every node on a simulated host of its own, host_loss and link_cut among the classes: "
                        "bench/soak/hosts.py (root)")
    p.add_argument("--etcd-members", type=int, default=1, choices=(1, 3),
                   help="with --hosts: etcd members, each on a host of its own (default 1)")
    p.add_argument("--hosted-members", type=int, default=None, choices=(1, 3),
                   help="with --hosts --hosted: rendezvous.hosted_members, the etcd members the job's first nodes "
                        "run (default 3)")
    p.add_argument("--single-member-faults", action="store_true",
                   help="with --hosted-members 3: every fault that may take a member away waits until 3 members vote "
                        "and all are up (default: three in four do; the rest test the growth window and double faults)")
    args = p.parse_args()
    check_modes(p, args)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 10**6)
    picked = pick_soak(p, args)
    if isinstance(picked, str):
        print(f"chaos soak: {picked}", file=sys.stderr)
        return 2
    soak = picked
    if not args.replica_groups and args.nodes < 2:
        p.error("--nodes must be at least 2")
    check_classes(p, soak, args)
    print(f"chaos soak: seed {args.seed}", flush=True)

    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    if soak is Soak:
        shutil.which("etcd") or etcd_binary()  # fails early, with the fix, when etcd is not installed
    return soak(Options.of(args)).run()


if __name__ == "__main__":
    sys.exit(main())
