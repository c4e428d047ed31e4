"""The processes of a job: its mark, its guards, workers, hosted etcd, run dirs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench.common import argv_of
from bench.soak.model import Agent, Job, jsonl, read_text
from bench.soak.procs import Proc, all_pids, children_of, descendants_of, describe, environ_of, ident, running, stat


class JobProcesses:
    """The soak's view of a job's processes (a part of Soak: it reads the soak's args and state)."""

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
        """The etcd the agent hosts (a descendant whose program is etcd), if any."""
        for pid in descendants_of(agent.me.pid):
            argv = argv_of(pid)
            if argv and Path(argv[0]).name == "etcd" and (p := ident(pid)) and running(p):
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
