"""--hosts: the chaos soak with every node on a simulated host of its own (runner/testing/hosts.py).

Each node's agent runs on host n0..nK-1 (`python -m runner run job.yaml`: its node id is the hostname, its address
the host's), with the host's own network, /tmp and processes; the etcd runs on a host of its own ("etcd"), or on
three (etcd0..etcd2, `--etcd-members 3`: runner/testing/etcd_cluster.py); the soak's folder is the lab's shared folder
(specs, logs, checkpoints, the workers' markers), seen by every host at the same path.

Classes: the base soak's process and etcd faults (a worker's pid is its host's: the soak finds the process through
`Host.pids()` and signals it with `Host.kill()`), with an etcd fault hitting the leader of 3 members (or the only
one), and two of hosts:
- `host_loss`: `Host.lose()`: every process of the host killed at once by the kernel (its PID 1 SIGKILLed), its /tmp
  gone, no guard left to revoke the lease. The others must see the node lost when its lease expires; 2-10 s later a
  fresh host of that name (same address, empty /tmp) starts the node again, as a scheduler's requeue: the same rule as
  kill_agent's;
- `link_cut`: `Host.cut()` for 1-15 s (seeded), then `heal()`; three cuts in four wait for a node whose workers run
  (the fence's case: no target until one does), the others hit any node (in a rendezvous: it must come back). A node cut off longer than its lease while its round
  ran must fence itself (docs/multinode.md §4): its agent ends with exit 3 and a report whose last failure is of kind
  `fenced`, within lease_ttl + 10 s of the cut; once it ended, the node is started again 2-10 s after the heal.
The default mode's `disk_full` (the logs tmpfs is not seen by the hosts: the lab shares a plain folder) and
`partition` (link_cut is its form here) are not drawn.

Invariants, beyond the base soak's: `nothing_survives` also on every host (after the job, no process on a node's host
but its PID 1); `lease_expired` (a lost host's lease gone within lease_ttl + 10 s); `fenced` (above); `no_rank_twice`
(at no moment do live workers of two worlds exist: a world is an attempt's MASTER_ADDR:MASTER_PORT, fresh for each,
so a cut-off node's workers must be gone before the others' next world starts). `one_world` (at the job's end: in
each world, every rank was held by one worker, of one world size) is the base soak's now (bench/soak/checks.py).

`--hosted` (`--hosted-members 3` by default, or 1): no etcd host; the jobs' nodes host it (`rendezvous.hosted: true`,
`hosted_members: N`, endpoints naming n0..nN-1 on a port of the job's, each host given the job's secret in a file of
its own /tmp, mode 0600, named by RUNNER_SECRET_FILE: docs/security.md). host_loss and link_cut may hit any node, the
hosting node n0 and the other member hosts included; the etcd classes are not drawn (a member's etcd is hit through
its host, or its agent: kill_agent). Before each host_loss, link_cut, kill_agent or signal_agent the soak reads the
member list; once the fault fired, it judges the target's loss:
- hosted_members 1: the hosting node's host lost or cut off, as its agent SIGKILLed, is a documented loss (the job
  cannot go on: docs/multinode.md §8), and a cut hosting node is not expected to fence (its lease lives on its own
  etcd);
- hosted_members 3: a voting member's loss while the others keep a quorum without it must not end the job
  (`member_loss_survived`, checked at the job's end: the training finished); nor, with two voters, the loss of the
  one that is not the founder (n0's first agent of the job, up and linked: it goes on alone,
  runner/rendezvous/etcd/founder.py). The others are a documented loss: fewer than 3 voting members at the fault
  otherwise (the growth window, docs/multinode.md, or a lost member not yet replaced), another member already down
  (two of three), or a member list that could not be read;
and after every job, no etcd process and no `runner-etcd-*` data folder on any live node host (`no_etcd_left`; a
folder of an agent the soak SIGKILLed is its next member's to sweep, and does not count).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import argv_of
from bench.soak.bounds import ALL_CLASSES, CLASSES, EVIDENCE, GONE_BOUND_S, LEASE_TTL_S, LOST, MEASURED
from bench.soak.checks import Checks
from bench.soak.etcd_reads import EtcdReader
from bench.soak.etcd_view import EtcdView
from bench.soak.faults import Faults
from bench.soak.infra import HostEtcd
from bench.soak.model import Agent, Job, Violation, console_transitions, evidence, read_text, state_of, tail, tails
from bench.soak.processes import JobProcesses
from bench.soak.procs import Proc, describe, ident, reap_orphans, running, set_subreaper
from bench.soak.schedule import pick
from bench.soak.soak import Soak
from bench.soak.state import Options, SoakState
from runner.contract import SECRET_ENV
from runner.testing.etcd_cluster import EtcdCluster
from runner.testing.hosts import Host, Lab

HOST_CLASSES = (*(c for c in CLASSES if c not in ("disk_full", "partition")), "host_loss", "link_cut")
HOST_ALL_CLASSES = (*HOST_CLASSES, *(c for c in ALL_CLASSES if c not in CLASSES))
HOST_LOST = {**LOST, "host_lost": "node runs without report.json: their host was lost by the soak (by design)"}
HOST_MEASURED = {**MEASURED, "lease_expired": "a lost host's lease expired",
                 "fenced": "a node cut off longer than its lease ended fenced"}
LEASE_EXPIRE_BOUND_S = LEASE_TTL_S + 10.0  # the last keep-alive was at most a third of the TTL before; etcd, load
FENCE_BOUND_S = LEASE_TTL_S + 10.0  # the fence fires before the lease lapses; grace TTL/6, the report, load
LONG_CUT_S = LEASE_TTL_S + 1.0  # a cut at least this long outlasts the lease (kept alive every TTL/3)
CUT_S = (1.0, 15.0)
RUNNING_CUT_SHARE = 0.75  # of the cuts: on a node that trains (the fence's case; else no target yet); the rest any
HOSTED_PORT = 29400  # --hosted: job N's members listen on HOSTED_PORT + 2 (N mod 40), peers on the port above
ETCD_CLASSES = ("etcd_stop", "etcd_restart", "etcd_wipe")
MEMBER_CLASSES = ("host_loss", "link_cut", "kill_agent", "signal_agent")  # --hosted: may take a member away
MEMBER_EVIDENCE = (*EVIDENCE, "rendezvous_lost", "rendezvous_member_removed", "rendezvous_member_joined")
GROWN_SHARE = 0.75  # --hosted-members 3: of the member classes' faults, those that wait for 3 voting members; the rest any
NO_LIST = "the member list could not be read at the fault (an outage already)"
FEW_VOTERS = "fewer than 3 voting members at the fault (the growth window, or a lost member not yet replaced)"
NO_QUORUM = "another member was down already: no quorum without it (two of three)"


def stacks(pid: int) -> str:
    """py-spy's dump of a Python process (its threads' and tasks' stacks), when py-spy is installed beside Python."""
    spy = Path(sys.executable).parent / "py-spy"
    if not spy.exists():
        return ""
    try:
        done = subprocess.run([str(spy), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=20,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return f"\nits stacks (py-spy dump):\n{done.stdout[-5000:]}"


@dataclass
class Seen:
    """A worker seen started: its marker and its process as this machine numbers it (None: gone before seen)."""

    m: dict[str, Any]
    proc: Proc | None


@dataclass
class HostWorld:
    """What the parts of the soak on hosts share beyond SoakState: the lab (its hosts), the etcd on its hosts, the
    workers seen started, and how many times two live worlds were looked for."""

    lab: Lab | None = None
    cluster: HostEtcd | None = None
    seen: dict[str, Seen] = field(default_factory=dict)  # start marker's path -> the worker
    overlap_checks: int = 0
    # --hosted, hosted_members 3: job index -> (class, what) of each member's loss the job must survive
    must_survive: dict[int, list[tuple[str, str]]] = field(default_factory=dict)


class HostProcesses(JobProcesses):
    """A job's processes on simulated hosts: agents started on their node's host, workers found and signalled
    through their host's pid namespace, what is left on a host after a job."""

    def __init__(self, state: SoakState, world: HostWorld) -> None:
        super().__init__(state)
        self.world = world

    def own_pids(self) -> set[int]:
        """Children this process waits for itself: the agents' and etcd members' nsenter, every host's PID 1."""
        pids = super().own_pids()
        for host in self.world.lab.hosts.values() if self.world.lab is not None else ():
            if host.init is not None:
                pids.add(host.init.pid)
            pids.update(p.pid for p in host.procs)
        return pids

    def kill_job(self, job: Job) -> None:
        """The base kill, then every process left on the job's node hosts (but their PID 1)."""
        super().kill_job(job)
        for host in self.node_hosts(job):
            for pid in host.pids():
                if pid != 1:
                    host.kill(pid)

    def node_hosts(self, job: Job) -> list[Host]:
        """The job's node hosts that are up."""
        assert self.world.lab is not None
        return [h for n in job.nodes if (h := self.world.lab.hosts.get(n)) is not None and not h.lost]

    def node_host(self, node: str) -> Host:
        """The node's host; a fresh one of that name when it was lost (same address, empty /tmp)."""
        assert self.world.lab is not None
        host = self.world.lab.hosts.get(node)
        if host is None or host.lost:
            host = self.world.lab.add(node)
        return host

    def host_cut(self, node: str) -> bool:
        """The node's host has its link cut now."""
        host = self.world.lab.hosts.get(node) if self.world.lab is not None else None
        return host is not None and host.cut_off and not host.lost

    def start_agent(self, job: Job, node: str) -> Agent:
        """Start one agent of `node` on its host (no --node: the hostname is its id), output to a file."""
        host = self.node_host(node)
        home = job.dir / "nodes" / node
        home.mkdir(parents=True, exist_ok=True)
        serial = sum(1 for a in job.agents if a.node == node)
        out = home / f"agent{serial}.log"
        env = host.env({"CHAOS_TOKEN": job.token, "CHAOS_NODE": node, "XDG_STATE_HOME": str(job.state),
                        "CHAOS_LOGS": str(job.logs / node), "PYTHONUNBUFFERED": "1"})
        env.pop("RUNNER_STANDBY", None)  # the spec says (the product's default: on)
        if self.state.args.hosted:
            env[SECRET_ENV] = self.give_secret(job, host)
        with out.open("wb") as f:
            proc = host.popen([sys.executable, "-m", "runner", "run", str(job.spec)], cwd=home, env=env, stdout=f,
                              stderr=f)
        outer = proc.inner_pid()
        me = ident(outer) or Proc(outer, 0)
        on_host = next((inner for inner, pid in host.pids().items() if pid == outer), 0)
        agent = Agent(node, serial, proc, me, out, time.time(), host_pid=on_host)
        job.agents.append(agent)
        return agent

    @staticmethod
    def host_tmp(host: Host) -> Path:
        """The host's own /tmp, as this machine reaches it (through its PID 1's root)."""
        return Path(f"/proc/{host.init_pid}/root/tmp")

    def give_secret(self, job: Job, host: Host) -> str:
        """The job's secret copied into the host's own /tmp (mode 0600, as a user keeps it on each machine): its path
        there, for RUNNER_SECRET_FILE (a lost host's successor gets it again: its /tmp is new)."""
        inside = f"/tmp/{job.name}.secret"  # the host's own tmpfs
        fd = os.open(self.host_tmp(host) / f"{job.name}.secret", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write((job.dir / "job.secret").read_bytes())
        return inside

    def hosted_etcd(self, agent: Agent) -> Proc | None:
        """The etcd the agent hosts, with one member (the base's); none with several: no one agent's loss takes the
        rendezvous with it (HostFaults.judge_member_loss judges a member's loss from the member list)."""
        return super().hosted_etcd(agent) if self.state.args.hosted_members <= 1 else None

    def etcd_leftovers(self, job: Job) -> list[str]:
        """--hosted: etcd processes and `runner-etcd-*` data folders left on the job's live node hosts; a folder named
        after an agent the soak SIGKILLed on that host (the next member there sweeps it) does not count."""
        left = []
        for host in self.node_hosts(job):
            for inner, outer in host.pids().items():
                argv = argv_of(outer)
                if argv and Path(argv[0]).name == "etcd" and (p := ident(outer)) is not None:
                    left.append(f"{host.name}: etcd pid {inner} ({describe(p)})")
            killed = {str(a.host_pid) for a in job.agents if a.node == host.name and a.fate == "killed"}
            with contextlib.suppress(OSError):
                for d in sorted(self.host_tmp(host).glob("runner-etcd-*")):
                    if d.name.split("-")[2:3] and d.name.split("-")[2] in killed:
                        continue
                    left.append(f"{host.name}: /tmp/{d.name}")
        return left

    def resolve(self, path: Path) -> Seen | None:
        """The worker a start marker names, found once on its host (None: the marker cannot be read yet)."""
        seen = self.world.seen.get(str(path))
        if seen is not None:
            return seen
        try:
            m = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        host = self.world.lab.hosts.get(str(m.get("node"))) if self.world.lab is not None else None
        outer = host.pids().get(int(m["pid"])) if host is not None else None
        p = ident(outer) if outer else None
        seen = Seen(m, p if p is not None and p.ticks == int(m["start_ticks"]) else None)
        self.world.seen[str(path)] = seen
        return seen

    def workers(self, job: Job, *, live_only: bool = True) -> list[tuple[dict[str, Any], Proc]]:
        """Workers the markers name, with their identity here (running ones only by default)."""
        found = []
        for path in sorted(job.out.glob("start-*.json")):
            seen = self.resolve(path)
            if seen is None:
                continue
            p = seen.proc or Proc(0, int(seen.m["start_ticks"]))
            if not live_only or (seen.proc is not None and running(seen.proc)):
                found.append((seen.m, p))
        return sorted(found, key=lambda x: (x[0]["node"], x[0]["rank"], x[1].pid))

    def host_leftovers(self, job: Job) -> list[str]:
        """Every process on a node host of the job but the host's PID 1."""
        return [f"{h.name}: {describe(p)}" for h in self.node_hosts(job) for inner, pid in h.pids().items()
                if inner != 1 and (p := ident(pid)) is not None]


class HostEtcdView(EtcdView):
    """The etcd on its hosts (one member, or three)."""

    def __init__(self, state: SoakState, world: HostWorld) -> None:
        super().__init__(state)
        self.world = world
        self.unread = ""  # why the last member list could not be read

    def reader(self, job: Job) -> EtcdReader | None:
        """The cluster, while a quorum of its members runs; --hosted: the members the job's nodes run, at the spec's
        endpoints, closed by the job's secret."""
        if self.state.args.hosted:
            return EtcdReader(job.endpoint, job.trust)
        if self.world.cluster is None or not self.world.cluster.readable:
            return None
        return EtcdReader(job.endpoint)

    def voting(self, job: Job) -> list[str] | None:
        """--hosted: the names (node ids) of the etcd's voting members, learners left out; None when unreadable
        (`unread` then says why)."""
        reader = self.reader(job)
        members = reader.members() if reader is not None else None
        self.unread = reader.error if reader is not None and members is None else ""
        return None if members is None else sorted(name for name, learner in members if not learner)

    def renewed_at(self) -> float:
        """When the cluster last had a member started, stopped or killed (a new leader renews every lease)."""
        return self.world.cluster.started_at + 1.0 if self.world.cluster is not None else 0.0

    def start(self) -> None:
        """Start every member that is down again."""
        if self.world.cluster is not None and not self.world.cluster.up:
            self.world.cluster.start()
            self.state.say("etcd started again")


class HostFaults(Faults):
    """The base soak's faults through the hosts (a worker signalled on its host, etcd's leader hit), and the host
    classes: host_loss and link_cut (with the fence it must bring)."""

    procs: HostProcesses
    kv: HostEtcdView

    def __init__(self, state: SoakState, procs: HostProcesses, kv: HostEtcdView, world: HostWorld) -> None:
        super().__init__(state, procs, kv)
        self.world = world

    def inject(self, job: Job, cls: str, u: list[float]) -> bool:
        """The base's injection; --hosted, for a class that may take a member away, the member list read before (one
        member: the hosting agent found) and the fault's loss judged after (judge_member_loss). With several members,
        three faults in four (a draw derived from u[1], which the classes use for a delay) have no target while fewer
        than 3 members vote, one of them is down (member_up), or the list cannot be read: most test the loss the job must survive, the rest the
        growth window's and a double fault's."""
        if not self.state.args.hosted or cls not in MEMBER_CLASSES:
            return super().inject(job, cls, u)
        several = self.state.args.hosted_members > 1
        voting = self.kv.voting(job) if several else None
        full = voting is not None and len(voting) >= 3 and all(self.member_up(job, m) for m in voting)
        share = 1.0 if self.state.args.single_member_faults else GROWN_SHARE
        if several and not full and (u[1] * 16) % 1.0 < share:
            now = (", ".join(f"{m}{'' if self.member_up(job, m) else ' (down)'}" for m in voting)
                   if voting is not None else "unread, " + self.kv.unread)
            self.state.say(f"job {job.index}: {cls} waits for 3 voting members, all up (now: {now})")
            return False  # (no target yet: the etcd still grows, or a lost member is not replaced yet)
        hosting = None if several else self.procs.host(job)
        before = len(job.faults)
        if not super().inject(job, cls, u):
            return False
        node = job.faults[before].target.split("#")[0]
        if several:
            self.judge_member_loss(job, cls, node, voting)
        elif hosting is not None and node == hosting.node and cls in ("host_loss", "link_cut"):
            how = "lost" if cls == "host_loss" else "cut off"
            job.loss = job.loss or (f"the hosting node's host was {how}: the only member (hosted_members 1), the job "
                                    "cannot go on (docs/multinode.md §8)")
        return True

    def judge_member_loss(self, job: Job, cls: str, node: str, voting: list[str] | None) -> None:
        """hosted_members 3: a fault that took `node` away, judged on the member list read just before it. A voting
        member's loss while the others keep a quorum without it is one the job must survive (member_loss_survived, at
        its end); otherwise the loss is documented, and says why. A node that is no voting member is no member's
        loss (the base invariants judge it)."""
        fault = job.faults[-1]
        if voting is not None and node not in voting:
            return
        down = [m for m in voting or () if m != node and not self.member_up(job, m)]
        founder = self.founder(job)
        if voting is not None and len(voting) == 2 and founder in voting and node != founder and not down:
            what = (f"{cls} of {fault.target} at {fault.at:.1f} s (voting members {', '.join(voting)}: the founder "
                    f"{founder} goes on alone)")
            self.world.must_survive.setdefault(job.index, []).append((cls, what))
            self.state.say(f"job {job.index}: {node} was the other of two voting members; the founder {founder} is "
                           "up: it goes on alone, the job must go on")
            return
        if voting is None:
            why = NO_LIST
        elif len(voting) < 3:
            why = FEW_VOTERS
        elif (len(voting) - 1 - len(down)) * 2 <= len(voting):
            why = NO_QUORUM
        else:
            what = (f"{cls} of {fault.target} at {fault.at:.1f} s (voting members {', '.join(voting)}; the others "
                    "up)")
            self.world.must_survive.setdefault(job.index, []).append((cls, what))
            self.state.say(f"job {job.index}: {node} was a voting member of {len(voting)}; the others keep a quorum: "
                           "the job must go on")
            return
        detail = f"{why} ({self.kv.unread})" if voting is None else f"{why}: voting {', '.join(voting)}, down {', '.join(down) or 'none'}"
        job.loss = job.loss or f"{cls} of member {node}: {detail}"
        self.state.tally.moot("member_loss_survived", why, cls)
        self.state.say(f"job {job.index}: {node}'s loss may end the job (documented): {detail}")

    def founder(self, job: Job) -> str | None:
        """The node whose agent founded the job's etcd ("n0": the first endpoint's host), while that agent lives,
        left alone; None once it is gone (a node started again on n0 joins the members as any other)."""
        first = min((a for a in job.agents if a.node == "n0"), key=lambda a: a.serial, default=None)
        if first is None or first.code is not None or first.fate or first.cut_off:
            return None
        return first.node

    def member_up(self, job: Job, node: str) -> bool:
        """`node`'s member runs and is reachable: its host is up and linked, an agent of it runs, left alone, and an
        etcd runs there (a node started again after its member was lost runs none until it grows back: its old
        member, still listed until removed, is down; CI once judged such a list "the others up")."""
        host = self.world.lab.hosts.get(node) if self.world.lab is not None else None
        return (host is not None and not host.lost and not host.cut_off
                and any(a.node == node and a.code is None and not a.fate for a in job.agents)
                and any((argv := argv_of(outer)) and Path(argv[0]).name == "etcd" for outer in host.pids().values()))

    def signal_worker(self, job: Job, m: dict[str, Any], p: Proc, sig: int) -> bool:  # noqa: ARG002 - the base's
        """Signal the worker through its host (Host.kill: the pid its host numbers it), once the host still maps
        that pid to the process the soak saw start."""
        host = self.world.lab.hosts.get(str(m["node"])) if self.world.lab is not None else None
        if host is None or host.lost or host.pids().get(int(m["pid"])) != p.pid or not running(p):
            return False
        return host.kill(int(m["pid"]), signal.Signals(sig))

    def targets(self, job: Job) -> list[Agent]:
        """The base soak's targets, but none on a host whose link is cut (its fence is under test)."""
        return [a for a in super().targets(job) if not self.procs.host_cut(a.node)]

    def fault_etcd(self, job: Job, cls: str, u: list[float]) -> bool:
        etcd = self.world.cluster
        if etcd is None or not etcd.up or job.trained():
            return False
        m = etcd.target()
        who = f"etcd member {m.name}" + (" (the leader)" if len(etcd.cluster.members) > 1 else "")
        if cls == "etcd_stop":
            down = 1 + u[0] * 11
            etcd.stop(m)
            self.state.record(job, cls, who, f"SIGTERM, started again in {down:.1f} s")
            self.state.at(job, down, "etcd start", self.kv.start)
        elif cls == "etcd_restart":
            etcd.restart(m)
            self.state.record(job, cls, who, "SIGKILL, started again at once")
        else:
            etcd.wipe()
            self.state.record(job, cls, "etcd (every member)", "SIGTERM, data deleted, a new cluster on the same addresses")
        return True

    def fault_host_loss(self, job: Job, u: list[float]) -> bool:
        agent = pick(self.targets(job), u[0])
        if agent is None:
            return False
        host = self.procs.node_host(agent.node)
        tree = [p for pid in host.pids().values() if (p := ident(pid))]
        lease, no_lease = self.lease_at_kill(job, agent, self.kv.keys(job))
        host.lose()
        for a in job.live():
            if a.node == agent.node:
                a.fate, a.fate_at = "lost", time.time()
        self.state.record(job, "host_loss", agent.label, f"host {host.name} lost: its {len(tree)} processes killed at once")
        self.state.expect(job, "nothing_survives", GONE_BOUND_S, lambda: not any(running(p) for p in tree),
                          lambda: "processes of a lost host still run: " + "; ".join(describe(p) for p in tree if running(p)))
        if lease:
            self.state.expect(job, "lease_expired", LEASE_EXPIRE_BOUND_S, lambda: self.kv.lease_gone(job, lease),
                              lambda: f"the lost host's lease {lease:x} is still granted {LEASE_EXPIRE_BOUND_S:g} s later "
                              f"(ttl {self.kv.lease_ttl(job, lease)})", met=f"{agent.label}'s lease expired")
        else:  # counted as "did not apply", with why (not yet charged to host_loss: its target is not chosen for it)
            self.state.tally.moot("lease_expired", no_lease)
        self.requeue(job, agent.node, 2 + u[1] * 8)
        return True

    def fault_link_cut(self, job: Job, u: list[float]) -> bool:
        targets = self.targets(job)
        training = [a for a in targets if state_of(a) == "RUNNING" and self.workers_of(job, a)]
        agent = pick(training if u[3] < RUNNING_CUT_SHARE else targets, u[0])
        if agent is None:
            return False
        node, host = agent.node, self.procs.node_host(agent.node)
        cut = CUT_S[0] + u[1] * (CUT_S[1] - CUT_S[0])
        mine = self.workers_of(job, agent)
        state, at = state_of(agent), time.time()
        host.cut()
        for a in job.live():
            if a.node == node:
                a.cut_off = True
        self.state.record(job, "link_cut", agent.label, f"link down for {cut:.1f} s (lease_ttl {LEASE_TTL_S:g} s; "
                          f"{state}, {len(mine)} worker(s) running)")
        only_member = self.state.args.hosted and self.procs.hosted_etcd(agent) is not None
        if only_member:  # its lease lives on its own etcd: the others lapse instead (a documented loss: inject)
            self.state.tally.moot("fenced", "the cut node hosts the only member (hosted_members 1)")
        elif cut >= LONG_CUT_S and state == "RUNNING" and mine:
            self.state.expect(job, "fenced", FENCE_BOUND_S, lambda: self.fence_held(job, agent, at),
                              lambda: self.fence_detail(job, agent, cut), met=f"{agent.label} fenced")
        self.heal_later(job, agent, host, cut, 2 + u[2] * 8)
        return True

    def heal_later(self, job: Job, agent: Agent, host: Host, cut: float, requeue_s: float) -> None:
        """Heal the link `cut` s from now; once the cut agent ended (fenced), start its node again `requeue_s` s
        later, as kill_agent's requeue does."""
        node = agent.node

        def rejoin(tries: int) -> None:
            if agent.code is not None:
                if not agent.fate:
                    self.requeue(job, node, requeue_s)
            elif tries < FENCE_BOUND_S:
                self.state.at(job, 1.0, f"requeue {node} once its fence ended it", lambda: rejoin(tries + 1))

        def heal() -> None:
            if not host.lost and host.cut_off:
                host.heal()
                self.state.say(f"job {job.index}: link of {node} healed")
            rejoin(0)

        self.state.at(job, cut, f"heal the link of {node}", heal)

    def workers_of(self, job: Job, agent: Agent) -> list[dict[str, Any]]:
        """The markers of the agent's running workers."""
        rd = self.procs.run_dir(job, agent)
        return [m for m, _ in self.procs.workers(job) if rd is not None and m["run_dir"] == str(rd)]

    def fence_held(self, job: Job, agent: Agent, cut_at: float) -> bool | None:
        """The cut agent ended fenced (True); None when something else explains its end: it left its round
        before the fence's time (a restart), got another fault, or the job finished."""
        if agent.code is not None and self.procs.fenced(job, agent):
            return True
        if agent.fate or job.trained():
            return None
        left = [t for t in console_transitions(agent)
                if float(t.get("time", 0.0)) >= cut_at and t.get("src") == "RUNNING" and t.get("trigger") != "fenced"]
        if left and float(left[0].get("time", 0.0)) < cut_at + LEASE_TTL_S * 2 / 3:
            return None
        return False

    def fence_detail(self, job: Job, agent: Agent, cut: float) -> str:
        """Why a cut agent's fence did not hold."""
        if agent.code is None:
            now = f"it still runs, in {state_of(agent)}{stacks(agent.me.pid)}"
        else:
            report = self.procs.report_of(job, agent) or {}
            now = (f"it ended with exit {agent.code}, outcome {report.get('outcome')}, failures "
                   f"{json.dumps(report.get('failures', []))[:600]}")
        return (f"{agent.label} was cut off for {cut:.1f} s (lease_ttl {LEASE_TTL_S:g} s) while RUNNING, and did not "
                f"end fenced within {FENCE_BOUND_S:g} s (docs/multinode.md §4): {now}\n{tail(read_text(agent.out))}")

    def heal(self) -> None:
        """Every cut link back up."""
        for host in self.world.lab.hosts.values() if self.world.lab is not None else ():
            if host.cut_off and not host.lost:
                host.heal()
                self.state.say(f"link of {host.name} healed")


class HostChecks(Checks):
    """The base soak's invariants, and across hosts: nothing left on a node's host, no two live worlds at once, the
    cluster's own exits."""

    procs: HostProcesses

    def __init__(self, state: SoakState, procs: HostProcesses, kv: EtcdView, world: HostWorld) -> None:
        super().__init__(state, procs, kv)
        self.world = world

    def check_own_etcd(self) -> None:
        """A member ended that no fault stopped: by a signal, a violation; by itself, counted and started again."""
        if self.world.cluster is None or (code := self.world.cluster.exited_unasked()) is None:
            return
        if code < 0:
            raise Violation("etcd_unharmed", f"an etcd member died of signal {-code} and no fault sent it; its log "
                            f"ends:\n{self.world.cluster.log_tail()}")
        crash = f"an etcd member exited by itself with code {code} (no fault stopped it); started again"
        self.state.say(f"{crash}; the logs end:\n{self.world.cluster.log_tail()}")
        self.state.etcd_crashes.append(crash)
        self.world.cluster.start()

    def check_one_live_world(self, job: Job) -> None:
        """At no moment do live workers of two worlds exist, on whatever hosts (no_rank_twice)."""
        worlds: dict[str, list[dict[str, Any]]] = {}
        for m, _ in self.procs.workers(job):
            worlds.setdefault(str(m.get("master")), []).append(m)
        self.world.overlap_checks += 1
        if len(worlds) > 1:
            raise Violation("no_rank_twice", f"job {job.index}: workers of {len(worlds)} worlds live at once (ranks "
                            "held twice): " + "; ".join(
                                f"world {w}: " + ", ".join(f"rank {m['rank']}/{m['world_size']} on {m['node']} pid "
                                                           f"{m['pid']} (attempt {m['attempt']})" for m in ms)
                                for w, ms in sorted(worlds.items())))

    def wait_nothing_survives(self, job: Job) -> None:
        """The base check (the job's mark, on this machine), --hosted no etcd left on a host, then every node host
        empty but its PID 1."""
        super().wait_nothing_survives(job)
        if self.state.args.hosted:
            self.check_no_etcd_left(job)
        deadline = time.monotonic() + GONE_BOUND_S
        while (left := self.procs.host_leftovers(job)) and time.monotonic() < deadline:
            time.sleep(0.2)
            reap_orphans(self.procs.own_pids())
        if left:
            raise Violation("nothing_survives", f"{len(left)} process(es) left on the hosts of job {job.index} "
                            f"{GONE_BOUND_S:g} s after its end: " + "; ".join(left))

    def check_no_etcd_left(self, job: Job) -> None:
        """--hosted: within GONE_BOUND_S of the job's end, no etcd process and no `runner-etcd-*` data folder on any of
        its live node hosts (docs/multinode.md: no etcd process or data folder is left on any host)."""
        deadline = time.monotonic() + GONE_BOUND_S
        while (left := self.procs.etcd_leftovers(job)) and time.monotonic() < deadline:
            time.sleep(0.2)
            reap_orphans(self.procs.own_pids())
        if left:
            raise Violation("no_etcd_left", f"job {job.index}: {GONE_BOUND_S:g} s after its end, left on its hosts: "
                            + "; ".join(left))
        self.state.tally.held("no_etcd_left")

    def check_job_result(self, job: Job) -> None:
        """hosted_members 3: every member's loss the others had a quorum without (HostFaults.judge_member_loss) left
        the job to finish its training (member_loss_survived); then the base's (one_world, job_completes)."""
        for cls, what in self.world.must_survive.get(job.index, []):
            if job.trained():
                self.state.tally.held("member_loss_survived", cls)
            elif job.loss:
                self.state.tally.moot("member_loss_survived", "a documented loss ended the job", cls)
            else:
                summary = ", ".join(f"{a.label}={a.code}{'/' + a.fate if a.fate else ''}" for a in job.agents)
                raise Violation("member_loss_survived", f"job {job.index} ended without finishing its training after "
                                f"{what}: the other members kept a quorum, so the job had to go on (docs/multinode.md "
                                f"'Members'); agents {summary}\n" + evidence(job, MEMBER_EVIDENCE) + tails(job))
        super().check_job_result(job)

    def check_job_end(self, job: Job) -> None:
        """The base checks (one world per attempt among them), and no two worlds ever live at once."""
        super().check_job_end(job)
        self.state.tally.held("no_rank_twice")


class HostSoak(Soak):
    """The soak on simulated hosts (see the module's docstring): the base soak's plan, with the host parts."""

    classes = HOST_CLASSES
    all_classes = HOST_ALL_CLASSES
    lost_rows = HOST_LOST
    measured = HOST_MEASURED
    procs: HostProcesses
    kv: HostEtcdView
    checks: HostChecks
    faults: HostFaults

    def __init__(self, args: Options, base: Path | None = None) -> None:
        self.world = HostWorld()
        super().__init__(args, base)

    def new_procs(self) -> HostProcesses:
        return HostProcesses(self.state, self.world)

    def new_etcd_view(self) -> HostEtcdView:
        return HostEtcdView(self.state, self.world)

    def new_faults(self) -> HostFaults:
        return HostFaults(self.state, self.procs, self.kv, self.world)

    def new_checks(self) -> HostChecks:
        return HostChecks(self.state, self.procs, self.kv, self.world)

    # ------------------------------------------------------------------ setup / teardown

    @classmethod
    def ruled_out(cls, args: Options) -> dict[str, str]:
        """The base's, and with --hosted the etcd classes: the members are the nodes' own, hit through their hosts
        (host_loss, link_cut) or their agents (kill_agent, signal_agent)."""
        out = super().ruled_out(args)
        if args.hosted:
            for c in ETCD_CLASSES:
                out[c] = ("is not drawn with --hosts --hosted: the members run on the nodes' hosts, hit by host_loss, "
                          "link_cut and kill_agent")
        return out

    def setup(self) -> None:
        """Subreaper, the lab (its shared folder: the soak's own), the etcd's host(s) and members; --hosted: the node
        hosts (their addresses are the spec's endpoints), no etcd of the soak's."""
        set_subreaper()
        self.select_classes()
        lab = self.world.lab = Lab(self.state.base)
        lab.__enter__()
        nodes = ", ".join(f"n{i}" for i in range(self.args.nodes))
        if self.args.hosted:
            for i in range(self.args.nodes):
                lab.add(f"n{i}")
            self.state.say(f"lab {lab.bridge} ({lab.bridge_ip}/24), shared {self.state.base}; nodes on hosts {nodes}, "
                           f"hosting the etcd: hosted_members {self.args.hosted_members}")
            for c, why in sorted(self.state.tally.skipped().items()):
                self.state.say(f"class {c} skipped: {why}")
            return
        members = self.args.etcd_members
        names = ["etcd"] if members == 1 else [f"etcd{i}" for i in range(members)]
        cluster = self.world.cluster = HostEtcd(EtcdCluster([lab.add(n) for n in names],
                                                            token=f"chaos-{self.args.seed}"))
        cluster.start_cluster()
        self.state.say(f"lab {lab.bridge} ({lab.bridge_ip}/24), shared {self.state.base}; etcd of {members} "
                       f"member(s) at {cluster.endpoint}; nodes on hosts {nodes}")

    def teardown(self, keep: bool) -> None:
        """Every agent and host process killed, the etcd members, the hosts, their namespaces and the bridge; then
        the base soak's teardown (its folder). Never raises."""
        for job in self.state.jobs:
            try:
                self.procs.kill_job(job)
            except Exception as e:  # teardown goes on, and says why
                print(f"teardown: job {job.index}: {e}", file=sys.stderr)
        if self.world.cluster is not None:
            self.world.cluster.kill()
        if self.world.lab is not None:
            self.world.lab.close()
        super().teardown(keep)

    # ------------------------------------------------------------------ jobs

    def job_endpoint(self) -> str:
        """Every etcd member's client endpoint (the spec lists them all); --hosted: the first hosted_members node
        hosts' addresses, on a port of the job's own (the hosting node's first)."""
        if self.args.hosted:
            assert self.world.lab is not None
            port = HOSTED_PORT + 2 * (len(self.state.jobs) % 40)
            return ",".join(f"{self.world.lab.address(f'n{i}')}:{port}"
                            for i in range(min(self.args.hosted_members, self.args.nodes)))
        assert self.world.cluster is not None
        return self.world.cluster.endpoint

    def spec_text(self, job: Job, endpoint: str) -> str:
        """The base's spec; --hosted: `hosted_members`, and the secret from each host's own file (RUNNER_SECRET_FILE,
        HostProcesses.give_secret) instead of the shared folder's."""
        text = super().spec_text(job, endpoint)
        if not self.args.hosted:
            return text
        return text.replace(f"\n  secret_file: {job.dir / 'job.secret'}", "")

    def hosted_members(self) -> int:
        """--hosted-members: every node on a host of its own."""
        return self.args.hosted_members

    def finish_job(self, job: Job) -> None:
        """The base's end of a job; then its secret's copies removed from the hosts."""
        super().finish_job(job)
        for host in self.procs.node_hosts(job) if self.args.hosted else ():
            with contextlib.suppress(OSError):
                (self.procs.host_tmp(host) / f"{job.name}.secret").unlink()

    def replay(self, job: int | None = None) -> str:
        """The base soak's replay, on hosts."""
        line = super().replay(job) + " --hosts"
        if self.args.hosted:
            return line + f" --hosted-members {self.args.hosted_members}"
        return line + (f" --etcd-members {self.args.etcd_members}" if self.args.etcd_members != 1 else "")

    def setting(self) -> str:
        """The soak's setting, for the table's title."""
        if self.args.hosted:
            return (f"{self.args.nodes} nodes on simulated hosts, hosting the etcd (hosted_members "
                    f"{self.args.hosted_members})")
        return (f"{self.args.nodes} nodes on simulated hosts, etcd of {self.args.etcd_members} member(s) on hosts of "
                "their own")

    def tick(self, job: Job) -> None:
        """The base tick, then: live workers of one world at most."""
        super().tick(job)
        self.checks.check_one_live_world(job)
