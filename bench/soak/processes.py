"""The processes of a job: starting its agents, its mark, its guards, workers, hosted etcd, run dirs and reports;
killing it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import argv_of
from bench.soak.model import Agent, Job, jsonl, read_text
from bench.soak.procs import (
    Proc,
    all_pids,
    children_of,
    descendants_of,
    describe,
    environ_of,
    ident,
    reap_orphans,
    running,
    signal_proven,
    stat,
)
from bench.soak.state import SoakState
from runner.system.served import listens


class JobProcesses:
    """A job's processes as the soak starts, finds and kills them (its agents, their guards and workers, a hosted
    etcd), and the files they leave (run dir, transitions, report). It reads the run's network namespace and etcd."""

    def __init__(self, state: SoakState) -> None:
        self.state = state

    # ------------------------------------------------------------------ agents

    def start_agent(self, job: Job, node: str) -> Agent:
        """Start one agent of `node` (a new one after a fault), in its own session, output to a file."""
        net = self.state.net
        home = job.dir / "nodes" / node
        home.mkdir(parents=True, exist_ok=True)
        serial = sum(1 for a in job.agents if a.node == node)
        out = home / f"agent{serial}.log"
        in_ns = net is not None and node == job.nodes[-1]
        addr = (net.ns_addr if in_ns else net.host_addr) if net else "127.0.0.1"
        env = {**os.environ, "CHAOS_TOKEN": job.token, "CHAOS_NODE": node, "TMPDIR": str(job.tmp),
               "XDG_STATE_HOME": str(job.state), "CHAOS_LOGS": str(job.logs / node), "PYTHONUNBUFFERED": "1"}
        env.pop("RUNNER_STANDBY", None)  # the spec says (the product's default: on)
        if net is not None:
            env["GLOO_SOCKET_IFNAME"] = net.vn if in_ns else net.vh
        argv = [sys.executable, "-m", "runner", "run", str(job.spec), "--node", node, "--advertise-addr", addr]
        if in_ns and net is not None:
            argv = net.wrap(argv)
        with out.open("wb") as f:
            proc = subprocess.Popen(argv, cwd=home, env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=f,
                                    start_new_session=True)
        me = ident(proc.pid) or Proc(proc.pid, 0)
        agent = Agent(node, serial, proc, me, out, time.time())
        job.agents.append(agent)
        return agent

    def own_pids(self) -> set[int]:
        """Children this process waits for itself (Popen): every agent, and our etcd. Not for reap_orphans."""
        pids = {a.proc.pid for j in self.state.jobs for a in j.agents}
        if self.state.etcd is not None and self.state.etcd.proc is not None:
            pids.add(self.state.etcd.proc.pid)
        return pids

    def kill_job(self, job: Job) -> None:
        """SIGKILL the job's agents (ours: Popen) and every process carrying the job's mark; reap them."""
        for a in job.agents:
            if a.proc.poll() is None:
                a.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                a.proc.wait(10)
        for _ in range(3):
            found = self.job_processes(job)
            for p, _why in found:
                signal_proven(p, signal.SIGKILL, lambda pid: self.marked(job, pid))
            if not found:
                break
            time.sleep(0.5)
        reap_orphans(self.own_pids())

    # ------------------------------------------------------------------ processes of a job

    def marked(self, job: Job, pid: int) -> bool:
        """The job's mark: its token or TMPDIR in the environment, its folder on the command line or as cwd."""
        env = environ_of(pid)
        if f"CHAOS_TOKEN={job.token}".encode() in env or f"TMPDIR={job.tmp}".encode() in env:
            return True
        cmd = " ".join(argv_of(pid))
        if f"{job.dir}/" in cmd or f"{job.logs}/" in cmd:  # (with the slash: job1 is no prefix of job10)
            return True
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            return False
        return cwd == str(job.dir) or cwd.startswith((f"{job.dir}/", f"{job.logs}/"))

    def job_processes(self, job: Job) -> list[tuple[Proc, str]]:
        """Every live (non-zombie) process with the job's mark, this process excluded."""
        found = []
        for pid in all_pids():
            if pid == os.getpid():
                continue
            st = stat(pid)
            if st is None or st[0] == "Z" or not self.marked(job, pid):
                continue
            found.append((Proc(pid, st[2]), describe(Proc(pid, st[2]))))
        return found

    def guards(self, agent: Agent) -> list[Proc]:
        """The agent's guard processes (its children running runner.system.shepherd_main)."""
        return [p for pid in children_of(agent.me.pid)
                if any("runner.system.shepherd_main" in a for a in argv_of(pid)) and (p := ident(pid))]

    def hosted_etcd(self, agent: Agent) -> Proc | None:
        """The etcd the agent hosts, if any: a descendant whose program is etcd and that listens on the job's port.

        Not any etcd of the agent: one started on a loopback port to set up the job's users (hosted_server's auth
        bootstrap), or one that lost the race for the port to another agent of this machine, is not the job's
        rendezvous (CI, seed 970833: the first, SIGKILLed, was expected back, but its agent rightly joined the other
        agent's etcd instead).
        """
        job = self.state.job
        port = job.endpoint.rpartition(":")[2] if job is not None else ""
        if not port.isdigit():
            return None  # no job's port to listen on: nothing can be proven the job's etcd
        for pid in descendants_of(agent.me.pid):
            argv = argv_of(pid)
            if argv and Path(argv[0]).name == "etcd" and (p := ident(pid)) and running(p) and listens(pid, int(port)):
                return p
        return None

    def host(self, job: Job) -> Agent | None:
        """The live agent hosting the job's etcd (hosted mode)."""
        for a in job.live():
            if self.hosted_etcd(a) is not None:
                return a
        return None

    def workers(self, job: Job, *, live_only: bool = True) -> list[tuple[dict[str, Any], Proc]]:
        """Workers the markers name (start-*), with their identity; running ones only by default."""
        found = []
        for m in job.markers("start"):
            p = Proc(int(m["pid"]), int(m["start_ticks"]))
            if not live_only or running(p):
                found.append((m, p))
        return sorted(found, key=lambda x: (x[0]["node"], x[0]["rank"], x[1].pid))

    def run_dir(self, job: Job, agent: Agent) -> Path | None:
        """The agent's run dir: from the console's last lines, else from runs.jsonl (its pid's start line)."""
        if agent.run_dir is not None:
            return agent.run_dir
        for line in reversed(read_text(agent.out).splitlines()):
            if line.startswith("runner: logs: "):
                agent.run_dir = Path(line.removeprefix("runner: logs: ").strip())
                return agent.run_dir
        lines, _ = jsonl(job.state / "runner" / "runs.jsonl")
        for item in reversed(lines):  # (--hosts: hosts number their processes alike, a rejoined host anew)
            if (item.get("kind") == "start" and item.get("pid") == (agent.host_pid or agent.me.pid)
                    and item.get("job") == job.name and item.get("node", agent.node) == agent.node
                    and float(item.get("time", agent.started)) >= agent.started - 1.0):
                agent.run_dir = Path(item["run_dir"])
                return agent.run_dir
        return None

    def transitions(self, job: Job, agent: Agent) -> tuple[list[dict[str, Any]], int]:
        """The agent's transitions.jsonl (lines, torn lines)."""
        rd = self.run_dir(job, agent)
        return jsonl(rd / "transitions.jsonl") if rd else ([], 0)

    def report_path(self, a: Agent, rd: Path | None) -> Path | None:
        """report.json in the run dir, else the fallback the console names."""
        if rd is not None and (rd / "report.json").is_file():
            return rd / "report.json"
        for line in read_text(a.out).splitlines():
            if line.startswith("runner: report: "):
                path = Path(line.removeprefix("runner: report: ").split(" (")[0])
                if path.is_file():
                    return path
        return None

    def report_of(self, job: Job, a: Agent) -> dict[str, Any] | None:
        """The agent's report.json, parsed (None: none, or unreadable)."""
        path = self.report_path(a, self.run_dir(job, a))
        try:
            return dict(json.loads(path.read_text())) if path is not None else None
        except (OSError, ValueError):
            return None

    def fenced(self, job: Job, a: Agent) -> bool:
        """The agent ended fenced: its report's last failure is of kind `fenced` (docs/multinode.md §4)."""
        report = self.report_of(job, a)
        failures = report.get("failures") if report else None
        return bool(failures) and isinstance(failures, list) and failures[-1].get("kind") == "fenced"
