"""Rendezvous at scale, priced from etcd's side: N agents spread over K processes against a real 1- or 3-member etcd.

Each agent is the runner's own rendezvous and lease code (runner.rendezvous.etcd.backend.EtcdRendezvous: its own
gRPC channel, lease, keep-alives, round monitor), without workers. The N agents are split over K worker processes
(asyncio in each), so that, as on a real cluster, no single Python thread does every node's work; `--procs-sweep`
adds processes until the time to form a round stops moving. The etcd members run on simulated hosts
(runner/testing/hosts.py, runner/testing/etcd_cluster.py: one network namespace each, joined by a bridge), so that a
3-member cluster has real peer traffic between three addresses; this benchmark therefore needs root.

What is measured, for each N, from etcd's side (its members' /metrics, summed over members, and each member's CPU
from /proc/<pid>/stat):

- cold: every agent opens (connect, lease grant, admission) and joins round 0, until the last one has its result;
- round: every agent joins round 1 at once (what a restart of the whole job does), until the last one has its result:
  the cost of one round;
- steady: the round runs for `--steady` seconds; each agent keeps its lease alive (every lease TTL / 3) and
  publishes its status every rendezvous.status_interval (--status-interval; what the agent does while its workers train);

and for each: seconds, etcd CPU seconds (all members), requests (gRPC messages received: unary calls and stream
messages), bytes in and out on the client side, raft bytes between members, watch events sent, WAL fsyncs; then the
database size. Per round they are given per node; in steady state per node per second.

`--churn N` runs the churn scenario at N nodes instead (min nodes N - 1% - window, max N; last call 1 s): 1% of the
agents die at once (their process SIGKILLed: leases expire), 1% join late, then one agent per second dies and a new
one joins for `--window` seconds; for each, the time until every live agent is in a new round, and etcd's load.

`--fit` reads the CSV, fits each per-round and steady-state figure to a power of N (least squares on log-log), prints
the exponent with its standard error and the value extrapolated to 16,384 nodes with its 95 % interval, and draws
the PNG.

    sudo python bench/rdzv_scale.py [--members 3] [--sizes 256,512,1024,2048,4096] [--procs 4] [--steady 15]
                                    [--csv bench/rdzv_scale.csv]
    sudo python bench/rdzv_scale.py --procs-sweep 1,2,4,8 --sizes 2048
    sudo python bench/rdzv_scale.py --churn 4096
    python bench/rdzv_scale.py --fit [--csv bench/rdzv_scale.csv] [--png docs/rdzv_scale.png]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import gc
import json
import logging
import math
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runner.config.spec import Entrypoint, JobSpec, Nodes, Rendezvous
from runner.errors import RendezvousError
from runner.events import MembershipChanged, PeerLost, StopRequested
from runner.rendezvous.base import RendezvousResult
from runner.rendezvous.etcd.backend import EtcdRendezvous
from runner.states.waiting import unless_stopped
from runner.testing.etcd_cluster import EtcdCluster, etcd_on_hosts
from runner.testing.hosts import HostProcess, Lab, why_not

SIZES = (256, 512, 1024, 2048, 4096)
TARGET_N = 16384
STATUS_S = Rendezvous().status_interval  # the agent's status refresh, as a job gets it by default
METRIC = re.compile(r"^(\w+)(\{[^}]*\})? (\S+)$")
MAX_RESTARTS = 1_000_000
PROGRESS_EVERY_S = 0.1
PHASE_TIMEOUT_S = float(os.environ.get("RDZV_SCALE_TIMEOUT_S", "240"))
BY_METHOD = bool(os.environ.get("RDZV_SCALE_BY_METHOD"))  # print each phase's unary calls by method and code
LOG_LEVEL = logging.INFO if os.environ.get("RDZV_SCALE_VERBOSE") else logging.ERROR


# --------------------------------------------------------------------------------------------------- etcd's side
def scrape(endpoint: str) -> dict[str, float]:
    """One member's counters this benchmark reads (summed over labels)."""
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {"requests": 0.0, "unary": 0.0, "keepalives": 0.0, "streams": 0.0, "bytes_in": 0.0, "bytes_out": 0.0,
           "peer_bytes": 0.0, "events": 0.0, "fsyncs": 0.0, "db_bytes": 0.0, "cpu_metric": 0.0}
    names = {"grpc_server_msg_received_total": "requests", "etcd_network_client_grpc_received_bytes_total": "bytes_in",
             "etcd_network_client_grpc_sent_bytes_total": "bytes_out", "etcd_network_peer_sent_bytes_total":
             "peer_bytes", "etcd_debugging_mvcc_events_total": "events",
             "etcd_disk_wal_fsync_duration_seconds_count": "fsyncs", "etcd_mvcc_db_total_size_in_bytes": "db_bytes",
             "process_cpu_seconds_total": "cpu_metric"}
    for line in text.splitlines():
        m = METRIC.match(line)
        if m is None:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name in names:
            out[names[name]] += value
        if name == "grpc_server_started_total" and "stream" in labels:
            out["streams"] += value
        elif name == "grpc_server_handled_total" and 'grpc_type="unary"' in labels:
            out["unary"] += value
            if BY_METHOD:
                method = re.search(r'grpc_method="(\w+)"', labels)
                code = re.search(r'grpc_code="(\w+)"', labels)
                key = f"{method.group(1) if method else '?'}/{code.group(1) if code else '?'}"
                out[key] = out.get(key, 0.0) + value
        elif name == "grpc_server_msg_received_total" and 'grpc_method="LeaseKeepAlive"' in labels:
            out["keepalives"] += value
    return out


def cpu_seconds(pid: int) -> float:
    """utime + stime of process `pid` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine (/proc/stat), for the share of the CPUs in use."""
    parts = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = parts[3] + parts[4]
    return sum(parts) - idle, sum(parts)


@dataclass
class Snapshot:
    """etcd's counters (summed over members), each member's CPU, the machine's, at one moment."""

    at: float
    counters: dict[str, float]
    member_cpu: list[float]
    machine: tuple[float, float]
    db_bytes: float


class EtcdSide:
    """The members of one etcd: their endpoints, pids and counters."""

    def __init__(self, cluster: EtcdCluster) -> None:
        self.cluster = cluster
        self.pids: list[int] = []
        for m in cluster.members:
            assert isinstance(m.proc, HostProcess)
            self.pids.append(m.proc.inner_pid())

    @property
    def endpoints(self) -> list[str]:
        """Every member's client endpoint."""
        return self.cluster.endpoints

    def snap(self) -> Snapshot:
        """Now."""
        per = [scrape(e) for e in self.endpoints]
        total = {k: sum(p.get(k, 0.0) for p in per) for k in set().union(*per)}
        return Snapshot(time.monotonic(), total, [cpu_seconds(p) for p in self.pids], machine_busy(),
                        max(p["db_bytes"] for p in per))


def priced(a: Snapshot, b: Snapshot) -> dict[str, Any]:
    """What etcd spent between two snapshots."""
    d = {k: b.counters[k] - a.counters.get(k, 0.0) for k in b.counters}
    busy = (b.machine[0] - a.machine[0]) / max(1.0, b.machine[1] - a.machine[1])
    member_cpu = [y - x for x, y in zip(a.member_cpu, b.member_cpu, strict=True)]
    return {"cpu": sum(member_cpu), "member_cpu": member_cpu, "machine_busy": busy, **d}


# ------------------------------------------------------------------------------------------------ the agents
@dataclass(eq=False)
class Agent:
    """One simulated node: the runner's rendezvous, its event queue, the round it is in."""

    rdzv: EtcdRendezvous
    name: str
    events: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    attempt: int = 0
    result: RendezvousResult | None = None
    formed_at: float = 0.0
    follower: asyncio.Task[None] | None = None
    publisher: asyncio.Task[None] | None = None
    stop: StopRequested | None = None  # what runner.states.waiting keeps (never set here)


def status(a: Agent, state: str) -> dict[str, Any]:
    """What an agent publishes (runner/agent/assembly.py's node_status) for a node of 8 workers: about 0.9 KB, the
    size of a real status.json's record; the rendezvous adds node, round and time."""
    rank0 = (a.result.group_rank if a.result is not None else 0) * 8
    return {"agent_pid": 42424, "agent_start_time": 26410, "state": state, "attempt": a.attempt,
            "restarts": a.attempt, "run_id": "scale", "run_dir": "/var/tmp/runner-logs/scale/20261126-160757-e06e58",
            "heartbeat": time.time(), "outcome": None, "launch": None, "recovery": None,
            "workers": [{"rank": rank0 + i, "local_rank": i, "pid": 100000 + i, "exit_code": None} for i in range(8)],
            "ledger": {"basis": "steps", "wall_s": 9.742, "productive_s": 3.201, "launch_s": 6.541, "lost_s": 0,
                       "ettr": 0.3286, "failure_count": 0}}


def job_spec(cfg: dict[str, Any]) -> JobSpec:
    """The job every agent runs (the same spec everywhere, as the rendezvous checks)."""
    return JobSpec(name=cfg["job"], entrypoint=Entrypoint(script="train.py"), nodes=Nodes(cfg["nmin"], cfg["nmax"]),
                   rendezvous=Rendezvous(backend="etcd", endpoints=tuple(cfg["endpoints"]), join_timeout=600.0,
                                         lease_ttl=cfg["ttl"], last_call=cfg["last_call"], connect_timeout=60.0,
                                         status_interval=cfg["status_interval"], master_port=29500))


class Worker:
    """One agent process: its agents, commands on stdin, one JSON line per answer (and progress) on stdout."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        spec = job_spec(cfg)
        self.cfg = cfg
        self.agents = [Agent(EtcdRendezvous(spec, name, advertise_addr="127.0.0.1"), name) for name in cfg["names"]]
        self.opened: list[Agent] = []  # agents[:len(opened)], in order
        self.dirty = False

    def say(self, **msg: Any) -> None:
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()

    async def open(self, count: int | None) -> list[Agent]:
        """Open `count` agents not opened yet (all when None); those agents."""
        start = len(self.opened)
        todo = self.agents[start:] if count is None else self.agents[start:start + count]
        self.opened.extend(todo)
        await asyncio.gather(*(a.rdzv.open(a.events) for a in todo))
        return todo

    async def round(self, attempt: int, agents: list[Agent]) -> None:
        async def one(a: Agent) -> None:
            a.attempt = attempt
            a.result = await a.rdzv.next_round(attempt)
            a.formed_at = time.monotonic()
        await asyncio.gather(*(one(a) for a in agents))

    async def follow(self, a: Agent) -> None:
        """As the agent does on a lost peer or a node waiting to join: publish FAILED, charge the round (a newcomer:
        uncharged), rendezvous again. Events that arrive meanwhile are stale, as in the agent's RENDEZVOUS state
        (runner.states.waiting.unless_stopped consumes them). A rendezvous that fails ends this agent (as it ends
        the agent's run): said on stderr."""
        try:
            await self._follow(a)
        except RendezvousError as e:
            print(f"agent {a.name} gave up: {e.message}", file=sys.stderr, flush=True)
            raise

    async def _follow(self, a: Agent) -> None:
        while True:
            ev = await a.events.get()
            if not isinstance(ev, (PeerLost, MembershipChanged)):
                continue
            with contextlib.suppress(RendezvousError):
                await a.rdzv.publish(status(a, "FAILED"))
                await a.rdzv.charge_restart(MAX_RESTARTS, charged=isinstance(ev, PeerLost))
            a.attempt += 1
            a.result = await unless_stopped(a, a.rdzv.next_round(a.attempt))
            a.formed_at = time.monotonic()
            self.dirty = True
            with contextlib.suppress(RendezvousError):
                await a.rdzv.publish(status(a, "RUNNING"))

    async def publish_loop(self, a: Agent) -> None:
        """The agent's status refresh: one put per status_interval, at a random phase (none when it is off)."""
        every = self.cfg["status_interval"]
        if not every:
            return
        await asyncio.sleep(random.uniform(0, every))
        while True:
            with contextlib.suppress(RendezvousError):
                await a.rdzv.publish(status(a, "RUNNING"))
            await asyncio.sleep(every)

    def progress(self) -> None:
        """Which round each opened agent is in: {round: [agents, last formed_at, world size]}."""
        rounds: dict[int, list[float]] = {}
        for a in self.opened:
            if a.result is None:
                continue
            entry = rounds.setdefault(a.result.round, [0, 0.0, a.result.group_world_size])
            entry[0] += 1
            entry[1] = max(entry[1], a.formed_at)
        self.say(kind="progress", rounds={str(r): v for r, v in rounds.items()}, opened=len(self.opened))

    async def reporter(self) -> None:
        while True:
            await asyncio.sleep(PROGRESS_EVERY_S)
            if self.dirty:
                self.dirty = False
                self.progress()

    async def serve(self) -> None:
        """Answer commands until stdin closes or `close` is done."""
        reporter = asyncio.get_running_loop().create_task(self.reporter())
        self.say(kind="ready", pid=os.getpid())
        handlers = {"open": self.do_open, "round": self.do_round, "publish": self.do_publish,
                    "follow": self.do_follow, "join": self.do_join, "close": self.do_close}
        while line := await asyncio.to_thread(sys.stdin.readline):
            cmd = json.loads(line)
            extra = await handlers[cmd["do"]](cmd)
            self.say(**{"kind": "done", "t": time.monotonic(), "cpu": time.process_time(), **extra})
            if cmd["do"] == "close":
                break
        reporter.cancel()

    async def do_open(self, _cmd: dict[str, Any]) -> dict[str, Any]:
        await self.open(None)
        return {}

    async def do_round(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Every opened agent joins the next round; when the last one had its result."""
        await self.round(cmd["attempt"], self.opened)
        return {"t": max(a.formed_at for a in self.opened)}

    async def do_publish(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Every agent publishes RUNNING once (`once`), or refreshes its status until the end (steady state)."""
        if cmd.get("once"):
            await asyncio.gather(*(a.rdzv.publish(status(a, "RUNNING")) for a in self.opened))
            return {}
        for a in self.opened:
            a.publisher = asyncio.get_running_loop().create_task(self.publish_loop(a))
        return {}

    async def do_follow(self, _cmd: dict[str, Any]) -> dict[str, Any]:
        """Churn: every agent reacts to losses and newcomers as the agent does."""
        for a in self.opened:
            if a.follower is None:
                a.follower = asyncio.get_running_loop().create_task(self.follow(a))
        self.dirty = True
        return {}

    async def do_join(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Late or replacement agents: open `count` more, each joins and then follows."""
        attempt = int(cmd["attempt"])

        async def join_then_follow(a: Agent) -> None:
            await self.round(attempt, [a])
            self.dirty = True
            await self.follow(a)
        for a in await self.open(cmd["count"]):
            a.follower = asyncio.get_running_loop().create_task(join_then_follow(a))
        return {}

    async def do_close(self, _cmd: dict[str, Any]) -> dict[str, Any]:
        """Every opened agent ends cleanly (final state, lease revoked)."""
        for a in self.opened:
            for task in (a.follower, a.publisher):
                if task is not None:
                    task.cancel()
        await asyncio.gather(*(a.rdzv.close("succeeded") for a in self.opened), return_exceptions=True)
        return {}


def worker_main(cfg_json: str) -> None:
    """A worker process (started by the benchmark itself)."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(LOG_LEVEL),
                        logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # stdout carries the answers
    gc.collect()
    gc.freeze()
    gc.disable()  # as bench/rdzv_protocol.py: one process holding many agents' objects is no node's cost
    asyncio.run(Worker(json.loads(cfg_json)).serve())


class Proc:
    """The benchmark's handle on one worker process."""

    def __init__(self, proc: asyncio.subprocess.Process, label: str, log: Path) -> None:
        self.proc, self.label, self.log = proc, label, log
        self.answers: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.rounds: dict[int, list[float]] = {}
        self.opened = 0
        self.cpu = 0.0
        self.reader: asyncio.Task[None] | None = None

    async def read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            if not line.startswith(b"{"):
                continue  # not an answer (the worker logs to stderr; a library might print)
            msg = json.loads(line)
            if msg["kind"] == "progress":
                self.rounds = {int(r): v for r, v in msg["rounds"].items()}
                self.opened = msg["opened"]
            else:
                self.cpu = msg.get("cpu", self.cpu)
                await self.answers.put(msg)
        await self.answers.put({"kind": "exited"})

    async def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        await self.proc.stdin.drain()
        return await self.answer()

    async def answer(self) -> dict[str, Any]:
        msg = await asyncio.wait_for(self.answers.get(), PHASE_TIMEOUT_S)
        if msg["kind"] == "exited":
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-15:])
            why = f"worker {self.label} exited with {await self.proc.wait()}; its log ends:\n{tail}"
            raise RuntimeError(why)
        return msg

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)


async def spawn(cfg: dict[str, Any], label: str, log_dir: Path) -> Proc:
    """A worker process for `cfg["names"]`, once it is ready."""
    path = log_dir / f"worker-{label}.log"
    with path.open("ab") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--worker", json.dumps(cfg), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=log, limit=1 << 22)
    p = Proc(proc, label, path)
    p.reader = asyncio.get_running_loop().create_task(p.read())
    await p.answer()  # ready
    return p


async def ask_all(procs: list[Proc], **cmd: Any) -> list[dict[str, Any]]:
    return list(await asyncio.gather(*(p.ask(**cmd) for p in procs)))


async def reap(procs: list[Proc]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            await p.proc.wait()
        if p.reader is not None:
            p.reader.cancel()


def split(names: list[str], k: int) -> list[list[str]]:
    """`names` in k nearly equal slices."""
    return [names[i::k] for i in range(k)]


def node_names(n: int, prefix: str = "gpu") -> list[str]:
    """Hostname-like node ids (32 to a rack): 'gpu-r012-n07'. Their length is what a round's result carries."""
    return [f"{prefix}-r{i // 32:03d}-n{i % 32:02d}" for i in range(n)]


# ------------------------------------------------------------------------------------------------ a size
@contextlib.contextmanager
def etcd_cluster(members: int, base: Path) -> Iterator[EtcdSide]:
    """A fresh etcd of `members` members, each on a simulated host of its own."""
    with Lab(base / "lab") as lab, etcd_on_hosts(lab, [f"etcd{i}" for i in range(members)]) as cluster:
        yield EtcdSide(cluster)


def per(value: float, by: float, digits: int = 2) -> float:
    return round(value / by, digits) if by else 0.0


async def measure_size(etcd: EtcdSide, n: int, k: int, ttl: float, steady: float, log_dir: Path,
                       members: int, status_interval: float | None = STATUS_S) -> dict[str, Any]:
    """One size: cold join, one round, steady state, priced from etcd's side."""
    cfg = {"job": f"scale-{n}", "endpoints": etcd.endpoints, "nmin": n, "nmax": n, "ttl": ttl, "last_call": 0.0,
           "status_interval": status_interval}
    procs = [await spawn({**cfg, "names": names}, f"{n}-{i}", log_dir) for i, names in enumerate(split(node_names(n), k))]
    try:
        s0, go = etcd.snap(), time.monotonic()
        cpu0 = sum(p.cpu for p in procs)
        await ask_all(procs, do="open")
        done = await ask_all(procs, do="round", attempt=0)
        cold_s = max(d["t"] for d in done) - go
        await ask_all(procs, do="publish", once=True)  # RUNNING, as each agent publishes once its workers run
        s1 = etcd.snap()
        cpu1 = sum(p.cpu for p in procs)
        go = time.monotonic()
        done = await ask_all(procs, do="round", attempt=1)
        round_s = max(d["t"] for d in done) - go
        s2 = etcd.snap()
        cpu2 = sum(p.cpu for p in procs)
        await ask_all(procs, do="publish")
        await asyncio.sleep(status_interval or 0)  # every agent has published once: the steady state
        s3 = etcd.snap()
        await asyncio.sleep(steady)
        s4 = etcd.snap()
        await ask_all(procs, do="close")
    finally:
        await reap(procs)
    cold, one, ss = priced(s0, s1), priced(s1, s2), priced(s3, s4)
    if BY_METHOD:
        for label, phase in (("cold", cold), ("round", one), ("steady", ss)):
            print(f"  {label}: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(phase.items()) if "/" in k and v))
    secs = s4.at - s3.at
    return {
        "members": members, "nodes": n, "procs": k, "ttl_s": ttl, "status_s": status_interval or 0,
        "cold_s": round(cold_s, 2), "cold_etcd_cpu_s": round(cold["cpu"], 2),
        "cold_req_per_node": per(cold["requests"], n),
        "round_s": round(round_s, 2), "round_etcd_cpu_s": round(one["cpu"], 2),
        "round_cpu_members": "/".join(f"{c:.2f}" for c in one["member_cpu"]),
        "round_cpu_ms_per_node": per(one["cpu"] * 1000, n, 3),
        "round_req_per_node": per(one["requests"], n), "round_streams_per_node": per(one["streams"], n),
        "round_unary_per_node": per(one["unary"], n),
        "round_keepalives_per_node": per(one["keepalives"], n),
        "round_in_kib_per_node": per(one["bytes_in"] / 1024, n), "round_out_kib_per_node": per(one["bytes_out"] / 1024, n),
        "round_raft_kib_per_node": per(one["peer_bytes"] / 1024, n),
        "round_events_per_node": per(one["events"], n), "round_fsyncs": int(one["fsyncs"]),
        "agents_cpu_round_s": round(cpu2 - cpu1, 2), "agents_cpu_cold_s": round(cpu1 - cpu0, 2),
        "machine_busy_round": round(one["machine_busy"], 2),
        "db_mib": round(s4.db_bytes / 2**20, 2),
        "steady_req_per_node_s": per(ss["requests"], n * secs, 4),
        "steady_events_per_node_s": per(ss["events"], n * secs, 4),
        "steady_etcd_cpu_per_s": per(ss["cpu"], secs, 3),
        "steady_cpu_us_per_node_s": per(ss["cpu"] * 1e6, n * secs, 1),
        "steady_in_b_per_node_s": per(ss["bytes_in"], n * secs, 1),
        "steady_out_b_per_node_s": per(ss["bytes_out"], n * secs, 1),
        "steady_fsyncs_per_s": per(ss["fsyncs"], secs, 1),
        "steady_db_kib_per_s": per((s4.db_bytes - s3.db_bytes) / 1024, secs, 1),
        "steady_unary_per_node_s": per(ss["unary"], n * secs, 4),
    }


FIELDS = ["members", "nodes", "procs", "ttl_s", "cold_s", "cold_etcd_cpu_s", "cold_req_per_node", "round_s",
          "round_etcd_cpu_s", "round_cpu_members", "round_cpu_ms_per_node", "round_req_per_node",
          "round_unary_per_node", "round_keepalives_per_node", "round_streams_per_node", "round_in_kib_per_node",
          "round_out_kib_per_node", "round_raft_kib_per_node",
          "round_events_per_node", "round_fsyncs", "agents_cpu_round_s", "agents_cpu_cold_s", "machine_busy_round",
          "db_mib", "steady_req_per_node_s", "steady_events_per_node_s", "steady_etcd_cpu_per_s",
          "steady_cpu_us_per_node_s", "steady_in_b_per_node_s", "steady_out_b_per_node_s", "steady_fsyncs_per_s",
          "steady_db_kib_per_s", "steady_unary_per_node_s", "torch_c10d_s"]


def append_csv(path: Path, rows: list[dict[str, Any]], fields: list[str]) -> None:
    new = not path.exists()
    with path.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerows(rows)


# ------------------------------------------------------------------------------------------------ churn
async def until_formed(procs: list[Proc], live: int, after: int, timeout: float = PHASE_TIMEOUT_S) -> tuple[int, float]:
    """(round, when) once every one of the `live` agents is in one round later than `after`."""
    deadline = time.monotonic() + timeout
    together: dict[int, list[float]] = {}
    while time.monotonic() < deadline:
        together = {}
        for p in procs:
            for r, (count, at, _world) in p.rounds.items():
                entry = together.setdefault(r, [0, 0.0])
                entry[0] += count
                entry[1] = max(entry[1], at)
        for r, (count, at) in together.items():
            if r > after and count >= live:
                return r, at
        await asyncio.sleep(0.05)
    seen = {r: int(v[0]) for r, v in sorted(together.items())}
    msg = f"no round after {after} with all {live} live agents within {timeout:g} s (agents per round: {seen})"
    raise TimeoutError(msg)


async def churn_procs(cfg: dict[str, Any], n: int, d: int, window: int, k: int,
                      log_dir: Path) -> tuple[list[Proc], Proc, list[Proc], Proc, Proc]:
    """The churn's agent processes: k for the agents that stay, one for the d that die at once, one per agent that
    dies during the window (killed one by one), one for the d late ones, one for the window's newcomers."""
    names = node_names(n)
    steady, doomed, singles = names[: n - d - window], names[n - d - window: n - window], names[n - window:]
    procs = [await spawn({**cfg, "names": s}, f"churn-{i}", log_dir) for i, s in enumerate(split(steady, k))]
    victims = await spawn({**cfg, "names": doomed}, "churn-doomed", log_dir)
    alone = [await spawn({**cfg, "names": [s]}, f"churn-single-{i}", log_dir) for i, s in enumerate(singles)]
    late = await spawn({**cfg, "names": node_names(d, "late")}, "churn-late", log_dir)
    spares = await spawn({**cfg, "names": node_names(window, "spare")}, "churn-spares", log_dir)
    return procs, victims, alone, late, spares


async def churn(etcd: EtcdSide, n: int, k: int, ttl: float, window: int, log_dir: Path,
                members: int) -> list[dict[str, Any]]:
    """1% die at once, 1% join late, one replaced per second for `window` s: time to a new round, etcd's load."""
    d = max(1, math.ceil(n / 100))
    cfg = {"job": f"churn-{n}", "endpoints": etcd.endpoints, "nmin": n - d - window - 1, "nmax": n, "ttl": ttl,
           "last_call": 1.0, "status_interval": STATUS_S}
    procs, victims, alone, late, spares = await churn_procs(cfg, n, d, window, k, log_dir)
    every = [*procs, victims, *alone, late, spares]
    living = list(every)  # a killed process's last progress is no live agent's
    rows: list[dict[str, Any]] = []
    try:
        first = [*procs, victims, *alone]
        await ask_all(first, do="open")
        await ask_all(first, do="round", attempt=0)
        await ask_all(first, do="publish", once=True)
        await ask_all(first, do="follow")
        rnd, _ = await until_formed(living, n, -1)
        live = n

        async def event(what: str, act: Any, live_after: int) -> None:
            nonlocal rnd
            s0, t0, before = etcd.snap(), time.monotonic(), rnd
            await act()
            try:
                rnd, at = await until_formed(living, live_after, rnd)
            except TimeoutError as exc:
                rows.append({"members": members, "nodes": n, "ttl_s": ttl, "event": what, "formed_s": "",
                             "note": str(exc)})
                print(f"  churn {what}: {exc}", flush=True)
                raise
            s1 = etcd.snap()
            c = priced(s0, s1)
            rows.append({"members": members, "nodes": n, "ttl_s": ttl, "event": what, "round": rnd,
                         "rounds_formed": rnd - before,
                         "formed_s": round(at - t0, 2), "etcd_cpu_s": round(c["cpu"], 2),
                         "requests": int(c["requests"]), "events": int(c["events"]),
                         "req_per_node": per(c["requests"], live_after)})
            print(f"  churn {what}: round {rnd} formed {at - t0:.2f} s later; etcd cpu {c['cpu']:.2f} s, "
                  f"{int(c['requests'])} requests", flush=True)

        async def die() -> None:
            victims.kill()
            living.remove(victims)
        live -= d
        await event(f"{d} agents (1%) die at once", die, live)

        async def join_late() -> None:
            await late.ask(do="join", count=d, attempt=0)
        live += d
        await event(f"{d} agents (1%) join late", join_late, live)

        async def replace() -> None:
            for i in range(window):
                alone[i].kill()
                living.remove(alone[i])
                await spares.ask(do="join", count=1, attempt=0)
                await asyncio.sleep(1.0)
        await event(f"one agent replaced per second for {window} s", replace, live)
        await ask_all([*procs, late, spares], do="close")
    except TimeoutError:
        pass  # recorded: the rows so far and the event whose round did not form
    finally:
        await reap(every)
    return rows


CHURN_FIELDS = ["members", "nodes", "ttl_s", "event", "round", "rounds_formed", "formed_s", "etcd_cpu_s", "requests",
                "events", "req_per_node", "note"]


# ------------------------------------------------------------------------------------------------ the fit
FITTED = [("round_etcd_cpu_s", "etcd CPU per round (s)"), ("round_req_per_node", "requests per node per round"),
          ("round_unary_per_node", "unary calls per node per round"),
          ("round_events_per_node", "watch events per node per round"),
          ("round_out_kib_per_node", "KiB out per node per round"), ("round_s", "time to form a round (s)"),
          ("steady_req_per_node_s", "requests per node per s (steady)"),
          ("steady_etcd_cpu_per_s", "etcd CPU per s (steady)"), ("db_mib", "db size (MiB)"),
          ("steady_db_kib_per_s", "db growth (KiB/s, steady, no compaction)")]


def fit(xs: list[float], ys: list[float], at: float = TARGET_N) -> tuple[float, float, float, float, float]:
    """log y = a + b log x by least squares: (b, its standard error, y at `at`, 95 % interval low, high)."""
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-9)) for y in ys]
    n = len(lx)
    mx, my = sum(lx) / n, sum(ly) / n
    sxx = sum((x - mx) ** 2 for x in lx)
    b = sum((x - mx) * (y - my) for x, y in zip(lx, ly, strict=True)) / sxx
    a = my - b * mx
    resid = [y - (a + b * x) for x, y in zip(lx, ly, strict=True)]
    s2 = sum(r * r for r in resid) / max(1, n - 2)
    se_b = math.sqrt(s2 / sxx)
    x0 = math.log(at)
    se_pred = math.sqrt(s2 * (1 + 1 / n + (x0 - mx) ** 2 / sxx))
    t = T95.get(n - 2, 2.0)
    y0 = math.exp(a + b * x0)
    return b, se_b, y0, y0 * math.exp(-t * se_pred), y0 * math.exp(t * se_pred)


T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31}  # Student's t, two-sided 95 %


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


def fits(rows: list[dict[str, str]]) -> None:
    """Print each figure's exponent in N and its extrapolation to 16,384 nodes, per member count and procs."""
    groups: dict[tuple[str, str], list[dict[str, str]]] = {}
    for r in rows:
        groups.setdefault((r["members"], r["procs"]), []).append(r)
    for (members, procs), group in sorted(groups.items()):
        sizes = sorted({int(r["nodes"]) for r in group})
        if len(sizes) < 3:
            continue
        print(f"\n{members} member(s), {procs} agent processes, sizes {sizes}:")
        print(f"  {'figure':38} {'exponent b (y ~ N^b)':>22} {'at 16,384 nodes (95 % interval)':>36}")
        for col, label in FITTED:
            xs = [float(r["nodes"]) for r in group]
            ys = [float(r[col]) for r in group]
            b, se, y0, lo, hi = fit(xs, ys)
            print(f"  {label:38} {b:>14.2f} ± {se:.2f}     {y0:>12.4g}  ({lo:.4g} .. {hi:.4g})")


def plot(rows: list[dict[str, str]], png: Path) -> None:
    """Four panels, log-log against N: round time, etcd CPU per round, per-node requests, steady state."""
    import matplotlib as mpl
    mpl.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    panels = [("round_s", "seconds to form a round"), ("round_etcd_cpu_s", "etcd CPU per round (s, all members)"),
              ("round_req_per_node", "requests per node per round"),
              ("steady_req_per_node_s", "steady state: requests per node per s")]
    groups: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        groups.setdefault(f"{r['members']} member(s), {r['procs']} procs", []).append(r)
    for ax, (col, title) in zip(axes.flat, panels, strict=True):
        for label, members in sorted(groups.items()):
            xs, ys = [int(r["nodes"]) for r in members], [float(r[col]) for r in members]
            sizes = sorted(set(xs))
            medians = [statistics.median(y for x, y in zip(xs, ys, strict=True) if x == n) for n in sizes]
            line, = ax.plot(sizes, medians, marker="o", label=f"{label} (median; every run a dot)")
            ax.scatter(xs, ys, s=12, color=line.get_color())
            if len(sizes) >= 3:
                _b, _se, y0, lo, hi = fit([float(x) for x in xs], ys)
                ax.plot([sizes[-1], TARGET_N], [medians[-1], y0], ls="--", color=line.get_color())
                ax.errorbar([TARGET_N], [y0], yerr=[[y0 - lo], [hi - y0]], color=line.get_color(), capsize=3)
        ax.set(xscale="log", yscale="log", xlabel="nodes", title=title)
        ax.legend(fontsize=7)
    fig.suptitle("runner's etcd rendezvous at scale (dashed: the log-log fit to 16,384 nodes, 95 % interval)")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    print(f"plot: {png}")


# ------------------------------------------------------------------------------------------------ main
def interrupted(*_: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--members", type=int, default=3, help="etcd members (1 or 3)")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--procs", type=int, default=4, help="agent processes")
    parser.add_argument("--procs-sweep", help="comma-separated process counts, each at every size")
    parser.add_argument("--ttl", type=float, default=10.0, help="rendezvous.lease_ttl (s)")
    parser.add_argument("--status-interval", type=float, default=STATUS_S,
                        help="rendezvous.status_interval (s; 0 = on changes only); other than the default, rows go "
                             "to CSV_status.csv with a status_s column")
    parser.add_argument("--steady", type=float, default=15.0, help="seconds of steady state measured")
    parser.add_argument("--churn", type=int, help="run the churn scenario at this many nodes instead")
    parser.add_argument("--window", type=int, default=10, help="churn: seconds of one replacement per second")
    parser.add_argument("--csv", default="bench/rdzv_scale.csv")
    parser.add_argument("--churn-csv", default="bench/rdzv_scale_churn.csv")
    parser.add_argument("--fit", action="store_true", help="fit and plot the CSV; run nothing")
    parser.add_argument("--png", default="docs/rdzv_scale.png")
    parser.add_argument("--torch-max", type=int, default=0,
                        help="also time torch's DynamicRendezvousHandler (c10d, one TCPStore, threads in this "
                             "process: bench/rdzv_protocol.py) at the sizes up to this one")
    parser.add_argument("--logs", help="keep the agent processes' logs in this folder (default: deleted)")
    args = parser.parse_args()
    if args.worker:
        worker_main(args.worker)
        return
    if args.fit:
        rows = read_rows(Path(args.csv))
        fits(rows)
        plot(rows, Path(args.png))
        return
    why = why_not()
    if why:
        sys.exit(f"rdzv_scale needs simulated hosts for its etcd members: {why}")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    signal.signal(signal.SIGTERM, interrupted)  # as Ctrl-C: every `with` closes (hosts, etcd, agent processes)
    with tempfile.TemporaryDirectory(prefix="rdzv-scale-") as tmp:
        base = Path(args.logs or tmp)
        base.mkdir(parents=True, exist_ok=True)
        if args.churn:
            with etcd_cluster(args.members, base) as etcd:
                rows = asyncio.run(churn(etcd, args.churn, args.procs, args.ttl, args.window, base, args.members))
            append_csv(Path(args.churn_csv), rows, CHURN_FIELDS)
            return
        sweep = [int(k) for k in args.procs_sweep.split(",")] if args.procs_sweep else [args.procs]
        status_interval = None if args.status_interval == 0 else args.status_interval
        csv_path = args.csv if status_interval == STATUS_S else args.csv.replace(".csv", "_status.csv")
        for n in (int(s) for s in args.sizes.split(",")):
            for k in sweep:
                with etcd_cluster(args.members, base / f"{n}-{k}") as etcd:
                    row = asyncio.run(measure_size(etcd, n, k, args.ttl, args.steady, base, args.members,
                                                   status_interval))
                if n <= args.torch_max:
                    from rdzv_protocol import torch_round  # bench/rdzv_protocol.py (imports torch)
                    row["torch_c10d_s"] = round(torch_round(n, f"scale-{n}"), 2)
                append_csv(Path(csv_path), [row], FIELDS if status_interval == STATUS_S else [*FIELDS, "status_s"])
                print(f"{args.members} member(s) {n:>5} nodes {k} procs: cold {row['cold_s']} s, round "
                      f"{row['round_s']} s, etcd cpu/round {row['round_etcd_cpu_s']} s ({row['round_cpu_members']}), "
                      f"{row['round_req_per_node']} req/node, agents cpu {row['agents_cpu_round_s']} s, machine busy "
                      f"{row['machine_busy_round']}; steady {row['steady_req_per_node_s']} req/node/s, etcd "
                      f"{row['steady_etcd_cpu_per_s']} cpu/s; db {row['db_mib']} MiB", flush=True)


if __name__ == "__main__":
    main()
