"""The first host lost: a hosted rendezvous with three members against one non-hosting host lost and torchrun.

Three simulated hosts a, b, c (runner/testing/hosts.py), one node and one worker each (bench/workers/host_beat.py:
gloo, a stamp past init_process_group, then all_reduce and a beat every 0.1 s), the job's secret on every host.

- runner, first host: `rendezvous.hosted`, endpoint a:29400, nodes "2:3", hosted_members 3 (the default), every other
  setting at its default (lease_ttl 10 s); host a (it hosted etcd, its node holds the first member) lost
  (`host.lose()`) --settle s after every rank got past init and the three members formed;
- runner, other host: the same job, a host that is neither a nor rank 0's lost (any node but the first: the loss
  that cost the job about a second before members);
- torchrun, first host: `--rdzv-backend c10d --rdzv-endpoint a:29400`, the store on a, host a lost.

The figure: the fault -> both survivors' new workers past init_process_group (None: not within --bound s).

    sudo python bench/hosted_loss.py [--runs 3] [--settle 8] [--bound 90]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine_line, reproduce_line, table
from bench.multinode_hosts import (
    C10D_PORT,
    NODES,
    Job,
    bench_base,
    fmt,
    fresh_lab,
    lose_and_recover,
    wait_until,
)
from runner.contract import SECRET_ENV
from runner.rendezvous.etcd.job_secret import new_secret_file

CASES = ("runner, first host lost", "runner, another host lost", "torchrun, first host lost")


class HostedJob(Job):
    """The runner's job on a rendezvous that host a hosts (three members), or torchrun's on a's c10d store."""

    def rendezvous(self) -> str:
        """Host a hosts the etcd (it grows to three members over a, b and c)."""
        return f"{{backend: etcd, hosted: true, hosted_members: 3, endpoints: {json.dumps([f'a:{C10D_PORT}'])}}}"


def members_formed(job: Job) -> bool:
    """b and c said they joined the hosted etcd as members (their agents' JSON logs)."""
    found = 0
    for name in ("b", "c"):
        with contextlib.suppress(OSError):
            found += "rendezvous_member_joined" in (job.work / "nodes" / name / "stderr").read_text(errors="replace")
    return found == 2


def one_run(case: str, run: int, base: Path, settle: float, bound: float) -> float | None:
    """One fault of `case`: seconds from the loss to both survivors' new workers past init (None: not within)."""
    tool = "torchrun" if case.startswith("torchrun") else "runner"
    with fresh_lab(base, f"{tool}-{run}-{CASES.index(case)}") as lab:
        for name in NODES:
            lab.add(name)
        secret = lab.shared / "job.secret"
        new_secret_file(secret)
        os.environ[SECRET_ENV] = str(secret)  # every host's processes start from this environment (Host.env)
        job = HostedJob(tool, lab, lab.shared / "job", name="bench-hosted")
        job.start()
        if job.launched() is None:
            print(f"{case} run {run}: launch failed: {job.tail('a')}", file=sys.stderr)
            return None
        if tool == "runner" and not wait_until(lambda: members_formed(job), 60):
            print(f"{case} run {run}: members did not form: {job.tail('b')}", file=sys.stderr)
            return None
        time.sleep(settle)
        return lose_and_recover(job, lab.hosts["a"] if "first" in case else job.victim(), bound)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--settle", type=float, default=8.0, help="s between every rank past init and the loss")
    p.add_argument("--bound", type=float, default=90.0, help="how long the survivors' new workers are waited for, s")
    args = p.parse_args()
    start_line = machine_line()
    figures: dict[str, list[float | None]] = {case: [] for case in CASES}
    with bench_base("bench/hosted_loss.py", "bench-hosted-loss-") as base:
        for run in range(args.runs):
            for case in CASES:
                figures[case].append(one_run(case, run, base, args.settle, args.bound))
                print(f"{case} run {run}: {figures[case][-1]}", file=sys.stderr, flush=True)
    rows = [[case, fmt(figures[case], args.bound)] for case in CASES]
    print("\n".join([
        "### The first host lost (bench/hosted_loss.py)", "",
        f"{start_line}", "",
        table(["fault", "loss -> survivors' new workers past init, s: median (min-max) (runs)"], rows), "",
        f"Reproduce: `{reproduce_line()}`; ended {machine_line()}",
    ]))


if __name__ == "__main__":
    main()
