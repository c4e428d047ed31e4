"""The price of replication: a hosted rendezvous of 1 member against one of 3, at 3 and 16 nodes (issue 38).

Every node on a simulated host of its own (runner/testing/hosts.py), one worker each (bench/workers/host_beat.py:
gloo, a stamp past init_process_group, then an all_reduce and a beat every 0.1 s), the job's secret on every host
(members meet over TLS with its certificates: both member counts run with it, so only the members differ).
`rendezvous: {backend: etcd, hosted: true, hosted_members: M, endpoints: [<first host>:29400]}`, `nodes: N` fixed,
every other setting at its default; the N launchers started at once.

Measured per run:
- launch: the first launcher started -> every rank past init_process_group;
- members formed: the first launcher started -> every member asked for has joined (3: two nodes said
  `rendezvous_member_joined`; waited for at most --form s after the launch);
- etcd CPU: user + system seconds of every etcd process on every host, from the start to --steady s after the
  members formed (the growth and a steady state: leases, status publishes), sampled every 0.25 s from /proc (a
  process's last sample counts: etcd runs until the lab goes);
- members: how many members had formed by the end (3 asked: at most 3).
The member counts alternate run after run, smallest job first.

    sudo python bench/hosted_members_cost.py [--runs 3] [--nodes 3 16] [--steady 10] [--form 60]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import RUNNER, Stat, machine_line, reproduce_line, table
from bench.multinode_hosts import WORKER, bench_base, fresh_lab, stamps, wait_until
from runner.contract import SECRET_ENV
from runner.rendezvous.etcd.job_secret import new_secret_file
from runner.testing.hosts import Host, Lab

PORT = 29400
MEMBERS = (1, 3)
LAUNCH_TIMEOUT_S = 300.0
SAMPLE_S = 0.25
TICKS = os.sysconf("SC_CLK_TCK")


def host_names(n: int) -> list[str]:
    """h00, h01, ...: the first one hosts."""
    return [f"h{i:02d}" for i in range(n)]


def etcd_ticks(host: Host) -> dict[int, int]:
    """Every etcd process of `host` (its pid here) -> its user + system clock ticks so far."""
    found = {}
    for outer in host.pids().values():
        try:
            with open(f"/proc/{outer}/cmdline", "rb") as f:
                if not f.read().split(b"\0", 1)[0].endswith(b"/etcd"):
                    continue
            fields = Path(f"/proc/{outer}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        found[outer] = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return found


class EtcdCpu(threading.Thread):
    """Samples every host's etcd processes until stopped; `seconds()`: their CPU, each at its last sample."""

    def __init__(self, hosts: list[Host]) -> None:
        super().__init__(daemon=True)
        self.hosts, self.done = hosts, threading.Event()
        self.last: dict[int, int] = {}

    def run(self) -> None:
        """Sample until `done` is set."""
        while not self.done.is_set():
            for host in self.hosts:
                with contextlib.suppress(OSError):
                    self.last.update(etcd_ticks(host))
            self.done.wait(SAMPLE_S)

    def seconds(self) -> float:
        """The CPU seconds of every etcd process seen, at its last sample."""
        return sum(self.last.values()) / TICKS


@dataclass
class Run:
    """One run: launch (s, None: failed), members formed (s, None: not within --form), etcd CPU (s), members."""

    launch: float | None
    formed: float | None
    cpu: float
    members: int


def spec(work: Path, nodes: int, members: int, first: str) -> Path:
    """The job: N fixed nodes, a hosted rendezvous of `members`, every other setting at its default."""
    path = work / "job.yaml"
    path.write_text(textwrap.dedent(f"""\
        version: 1
        name: bench-members-{members}
        entrypoint: {{script: {WORKER}}}
        nodes: {nodes}
        nproc_per_node: 1
        rendezvous: {{backend: etcd, hosted: true, hosted_members: {members}, endpoints: ["{first}:{PORT}"]}}
        logs: {{dir: logs, tee: false, format: json}}
        """))
    return path


def joined_members(work: Path, names: list[str]) -> int:
    """The hosting node's member and every node that said it joined as one."""
    count = 1
    for name in names[1:]:
        with contextlib.suppress(OSError):
            count += "rendezvous_member_joined" in (work / "nodes" / name / "stderr").read_text(errors="replace")
    return count


def one_run(lab: Lab, nodes: int, members: int, steady: float, form: float) -> Run:
    """Start the N launchers at once; time the launch and the members' forming, sample etcd's CPU until `steady` s
    after they formed."""
    names = host_names(nodes)
    hosts = [lab.add(n) for n in names]
    secret = lab.shared / "job.secret"
    new_secret_file(secret)
    work = lab.shared / "job"
    out = work / "out"
    out.mkdir(parents=True)
    path = spec(work, nodes, members, names[0])
    cpu = EtcdCpu(hosts)
    cpu.start()
    t0 = time.time()
    for host in hosts:
        home = work / "nodes" / host.name
        home.mkdir(parents=True)
        env = host.env({"BENCH_OUT": str(out), "OMP_NUM_THREADS": "1", SECRET_ENV: str(secret)})
        with (home / "stdout").open("wb") as o, (home / "stderr").open("wb") as e:
            host.popen([*RUNNER, str(path)], cwd=home, env=env, stdout=o, stderr=e)
    launched = wait_until(lambda: len(stamps(out)) >= nodes, LAUNCH_TIMEOUT_S)
    launch = max(s.time for s in stamps(out)) - t0 if launched else None
    formed = wait_until(lambda: joined_members(work, names) >= members, max(0.0, t0 + form - time.time()))
    formed_s = time.time() - t0 if formed else None
    time.sleep(steady)
    cpu.done.set()
    cpu.join()
    return Run(launch, formed_s, cpu.seconds(), joined_members(work, names))


def fmt(values: list[float | None]) -> str:
    """median (min-max) (n) of the runs that have a value; the failures counted."""
    ok = [v for v in values if v is not None]
    failed = len(values) - len(ok)
    text = f"{Stat.of(ok).fmt(digits=2)} ({len(ok)})" if ok else "-"
    return text + (f", {failed} failed" if failed else "")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--nodes", type=int, nargs="+", default=[3, 16])
    p.add_argument("--steady", type=float, default=10.0, help="s after the members formed that etcd is sampled")
    p.add_argument("--form", type=float, default=60.0, help="s after the launch the members are waited for")
    args = p.parse_args()
    start_line = machine_line()
    runs: dict[tuple[int, int], list[Run]] = {(n, m): [] for n in args.nodes for m in MEMBERS}
    with bench_base("bench/hosted_members_cost.py", "bench-members-") as base:
        for nodes in sorted(args.nodes):
            for run in range(args.runs):
                for members in MEMBERS if run % 2 == 0 else reversed(MEMBERS):
                    with fresh_lab(base, f"n{nodes}-m{members}-{run}") as lab:
                        r = one_run(lab, nodes, members, args.steady, args.form)
                    runs[(nodes, members)].append(r)
                    print(f"{nodes} nodes, {members} member(s), run {run}: launch {r.launch}, formed {r.formed}, "
                          f"etcd CPU {r.cpu:.2f} s, members {r.members}", file=sys.stderr, flush=True)
    rows = []
    for (nodes, members), rs in sorted(runs.items()):
        rows.append([str(nodes), str(members), fmt([r.launch for r in rs]), fmt([r.formed for r in rs]),
                     fmt([r.cpu for r in rs]), ", ".join(str(r.members) for r in rs)])
    print("\n".join([
        "### The price of replication (bench/hosted_members_cost.py)", "",
        start_line, "",
        table(["nodes", "hosted_members", "launch -> every rank past init, s", "launch -> members formed, s",
               "etcd CPU, s (until formed + steady)", "members formed"], rows), "",
        f"Reproduce: `{reproduce_line()}`; ended {machine_line()}",
    ]))


if __name__ == "__main__":
    main()
