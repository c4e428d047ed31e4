"""The fault classes: each finds a target, injects the fault, records it and what must follow."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import argv_of
from bench.soak.bounds import (
    ETCD_BACK_BOUND_S,
    EVIDENCE,
    GONE_BOUND_S,
    GUARD_BOUND_S,
    HANG_BOUND_S,
    HEARTBEAT_TIMEOUT_S,
    HOSTED_ETCD_KILLS,
    HOSTED_STOP_BOUND_S,
    KILL_WAIT_S,
    LEASE_TTL_S,
    LEASED_KILL_SHARE,
    PAUSE_BOUND_S,
    PREFIX,
    REAP_BOUND_S,
    REVOKE_BOUND_S,
    STOP_BOUND_S,
    STOP_SIGNALS,
)
from bench.soak.etcd_view import EtcdView
from bench.soak.infra import fill
from bench.soak.model import Agent, Job, console_transitions, evidence
from bench.soak.processes import JobProcesses
from bench.soak.procs import Proc, descendants_of, describe, gone, ident, parent_of, running, signal_proven, stat
from bench.soak.schedule import one_of, pick
from bench.soak.state import SoakState


class Faults:
    """Inject one fault of a class: find its target, inject it, record it, and set up what must follow (the
    expectations, the restorative actions). One concern with many methods (a fault_* method per class, and the
    target choice, proof and follow-up each class shares with others): they share the fault-side state (the disk
    filler, the hosted etcd's kills) and how a fault reaches only the job's processes."""

    def __init__(self, state: SoakState, procs: JobProcesses, kv: EtcdView) -> None:
        self.state = state
        self.procs = procs
        self.kv = kv
        self.filled = False  # the logs tmpfs is filled (disk_full)
        self.hosted_kills: dict[int, int] = {}  # hosting agent pid -> hosted etcd kills

    def inject(self, job: Job, cls: str, u: list[float]) -> bool:
        """Inject one fault of `cls` with the draws `u`; False when the class has no target right now. The
        expectations the fault sets up are counted as that class's."""
        self.state.firing = cls
        try:
            if cls in ("etcd_stop", "etcd_restart", "etcd_wipe"):
                return self.fault_etcd(job, cls, u)
            method: Callable[[Job, list[float]], bool] = getattr(self, f"fault_{cls}")
            return method(job, u)
        finally:
            self.state.firing = ""

    def restore(self) -> None:
        """What a fault still holds at a job's end, given back: the logs disk, the network."""
        self.free_disk()
        self.heal()

    def targets(self, job: Job) -> list[Agent]:
        """Agents a process fault may hit: live, left alone so far, not a late node whose admission is still being
        judged (a fault on it would make late_join_admitted moot, and a short run would never see it hold), and the
        training not finished (a fault after the first worker said done would race with the job's own end)."""
        if job.trained():
            return []
        return sorted((a for a in job.live() if not a.fate and not a.joining), key=lambda a: (a.node, a.serial))

    def requeue(self, job: Job, node: str, delay: float) -> None:
        """Start the node again `delay` s from now (a scheduler's requeue), unless the job is over by then; never
        while an agent of that node still runs (a stopped agent may take a while to leave): then 1 s later."""
        def start() -> None:
            if job.trained() or job.host_stopped or (job.loss and not job.live()):
                self.state.say(f"job {job.index}: requeue of {node} skipped (the job is over)")
                return
            if any(a.node == node for a in job.live()):
                self.state.at(job, 1.0, f"requeue {node}", start)
                return
            agent = self.procs.start_agent(job, node)
            self.state.say(f"job {job.index}: {node} started again (pid {agent.proc.pid})")
        self.state.at(job, delay, f"requeue {node}", start)

    def fault_kill_worker(self, job: Job, u: list[float], sig: int = signal.SIGKILL) -> bool:
        dirs = {str(rd) for a in self.targets(job) if (rd := self.procs.run_dir(job, a))}
        cands = [(m, p) for m, p in self.procs.workers(job) if m["run_dir"] in dirs
                 and (sig == signal.SIGKILL or (stat(p.pid) or ("T",))[0] != "T")]  # a stopped one: not again
        if not cands:
            return False
        m, p = one_of(cands, u[0])
        parent = parent_of(p)  # (its agent: the one that must wait for it)
        if not self.signal_worker(job, m, p, sig):
            return False
        who = f"{m['node']} rank {m['rank']} pid {p.pid} (attempt {m['attempt']})"
        if sig == signal.SIGKILL:
            self.state.record(job, "kill_worker", who, "SIGKILL")
            self.expect_reaped(job, p, parent)
        elif u[1] < 0.5:
            self.pause(job, who, p, 0.5 + u[2] * 2.5, lambda: self.signal_worker(job, m, p, signal.SIGCONT))
        else:
            self.state.record(job, "stop_worker", who, f"SIGSTOP, left stopped (heartbeat_timeout {HEARTBEAT_TIMEOUT_S:g} s)")
            self.expect_hang_detected(job, p, parent)
        return True

    def expect_reaped(self, job: Job, p: Proc, parent: Proc | None, within: float = REAP_BOUND_S) -> None:
        """A killed worker: reaped by its parent (the agent) within the bound, or orphaned by it (nothing_survives).
        A zombie whose agent still runs is not gone: the agent must wait for its dead worker, once it stopped the
        rest of the group (REAP_BOUND_S)."""
        self.state.expect(job, "nothing_survives", within, lambda: gone(p, parent),
                          lambda: f"the killed worker is not gone {within:g} s later: {describe(p)}")

    def expect_hang_detected(self, job: Job, p: Proc, parent: Proc | None) -> None:
        """A worker left stopped: the heartbeat kills it within the bound (hang_detected), and its agent reaps it
        (nothing_survives) within REAP_BOUND_S more."""
        self.state.expect(job, "hang_detected", HANG_BOUND_S, lambda: not running(p),
                          lambda: f"the stopped worker still exists {HANG_BOUND_S:g} s later: {describe(p)}",
                          met=f"stopped worker {p.pid} gone")
        self.expect_reaped(job, p, parent, HANG_BOUND_S + REAP_BOUND_S)

    def pause(self, job: Job, who: str, p: Proc, pause: float, cont: Callable[[], bool]) -> None:
        """stop_worker's pause: `cont` (the SIGCONT) runs `pause` s from now. From then the job must go on within
        PAUSE_BOUND_S (pause_went_on): its training advances or ends, or the worker is gone (the heartbeat took the
        pause for a hang, or a restart replaced it); a worker still stopped, or a job stalled after the pause with
        no hang detected, breaks it. A worker gone before its SIGCONT makes the check "did not apply"."""
        self.state.record(job, "stop_worker", who, f"SIGSTOP, SIGCONT in {pause:.1f} s")

        def resume() -> None:
            before = self.progress(job)
            if not cont():
                self.state.tally.moot("pause_went_on", "the paused worker was gone before its SIGCONT", "stop_worker")
                return
            self.state.expect(job, "pause_went_on", PAUSE_BOUND_S, lambda: self.went_on(job, before, p),
                              lambda: f"{PAUSE_BOUND_S:g} s after its SIGCONT the paused worker still lives "
                              f"({describe(p)}) and the training neither advanced (no new checkpoint) nor finished",
                              met=f"job went on after the pause of {p.pid}", cls="stop_worker")

        self.state.at(job, pause, f"SIGCONT {p.pid}", resume)

    def progress(self, job: Job) -> tuple[int, ...]:
        """What changes whenever the job's training advances: its checkpoint's identity (rank 0 replaces it every 5
        steps)."""
        try:
            st = (job.dir / "ckpt" / "model.pt").stat()
        except OSError:
            return ()
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def went_on(self, job: Job, before: tuple[int, ...], p: Proc) -> bool:
        """Since `before` (progress() at a SIGCONT) the training advanced or finished, or the worker `p` died (the
        heartbeat took the pause for a hang, or a restart stopped it: reaping it is nothing_survives's business)."""
        return job.trained() or self.progress(job) != before or not running(p)

    def signal_worker(self, job: Job, m: dict[str, Any], p: Proc, sig: int) -> bool:  # noqa: ARG002 - --hosts reads m
        """Send `sig` to the worker `m` names (`p`: its identity here) through a pidfd, once /proc proves it is that
        process and the job's; False when it is not (gone, or its pid recycled)."""
        return signal_proven(p, sig, lambda pid: self.procs.marked(job, pid))

    def fault_stop_worker(self, job: Job, u: list[float]) -> bool:
        return self.fault_kill_worker(job, u, signal.SIGSTOP)

    def fault_kill_agent(self, job: Job, u: list[float]) -> bool:
        agent, keys = self.pick_leased(job, u)
        if agent is None:
            return False
        tree = [(p, parent_of(p)) for pid in descendants_of(agent.me.pid) if (p := ident(pid))]
        hosting = self.state.args.hosted and self.procs.hosted_etcd(agent) is not None
        lease, no_lease = self.lease_at_kill(job, agent, keys)
        if not self.kill_now(agent):
            return False  # it had already exited by itself: the kill did nothing (not injected; drawn again)
        detail = f"SIGKILL pid {agent.proc.pid}; {len(tree)} processes under it"
        if hosting:
            job.loss = "the hosting node's agent was SIGKILLed: its etcd died with it (docs/multinode.md §8)"
            detail += "; it hosts the etcd"
        self.state.record(job, "kill_agent", agent.label, detail)
        self.state.expect(job, "nothing_survives", GONE_BOUND_S, lambda: all(gone(p, up) for p, up in tree),
                          lambda: "processes of a SIGKILLed agent are not gone: "
                          + "; ".join(describe(p) for p, up in tree if not gone(p, up)),
                          met=f"the {len(tree)} processes under {agent.label} gone" if tree else "")
        if lease:
            self.state.expect(job, "lease_revoked", REVOKE_BOUND_S, lambda: self.kv.lease_gone(job, lease),
                              lambda: f"the SIGKILLed agent's lease {lease:x} is still granted (ttl {self.kv.lease_ttl(job, lease)})",
                              met=f"{agent.label}'s lease revoked")
        else:  # a check that cannot be set up did not apply, and says why (it is never silently dropped)
            self.state.tally.moot("lease_revoked", no_lease, "kill_agent")
        self.requeue(job, agent.node, 2 + u[1] * 8)
        return True

    def pick_leased(self, job: Job, u: list[float]) -> tuple[Agent | None, list[tuple[str, int]] | None]:
        """The target of kill_agent, with the job's keys
        read just before (None: etcd could not be read). Three in four, when one can, an agent whose lease can be
        checked (its revocation is then due); the others any agent (one in INIT, or the hosting one, tests
        the guard without a lease)."""
        targets = self.targets(job)
        if not targets:
            return None, None
        keys = self.kv.keys(job)
        leased = [a for a in targets if self.lease_at_kill(job, a, keys)[0]]
        return pick(leased if leased and u[3] < LEASED_KILL_SHARE else targets, u[0]), keys

    def live_agent(self, agent: Agent) -> bool:
        """The agent has not exited: Popen.poll (which reaps it if it has) and /proc (a zombie under nsenter, --hosts)
        agree. A signal to an agent that exited does nothing: Popen.send_signal skips one it reaped, and the kernel
        drops one sent to a zombie."""
        if agent.proc.poll() is not None:
            return False
        st = stat(agent.me.pid)
        return st is not None and st[0] != "Z"

    def kill_now(self, agent: Agent) -> bool:
        """SIGKILL the agent, then wait (KILL_WAIT_S at most) for it to die of it: True when the kill ended it (or it
        is still dying), False when it had already exited by itself, before the kill or as it came (its exit status is
        not SIGKILL's). The agent's fate is "killed" only when True."""
        if not self.live_agent(agent):
            return False
        agent.proc.send_signal(signal.SIGKILL)
        try:
            code = agent.proc.wait(KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            code = -signal.SIGKILL  # (alive after a SIGKILL: in an uninterruptible wait; it dies once out of it)
        if code != -signal.SIGKILL:
            return False
        agent.fate, agent.fate_at = "killed", time.time()
        return True

    def lease_at_kill(self, job: Job, agent: Agent, keys: list[tuple[str, int]] | None) -> tuple[int, str]:
        """The lease of the agent's node's live state key in `keys` (the job's keys; None: etcd could not be read), or
        0 and why there is none to check: etcd could not be read (stopped, frozen, restarting or wiped), the node had
        no state key (not joined yet), or the agent hosts the etcd (its leases die with it)."""
        if self.state.args.hosted and self.procs.hosted_etcd(agent) is not None:
            return 0, "the agent hosted the etcd: its leases died with it"
        if keys is None:
            return 0, "etcd could not be read at the kill (stopped, frozen, restarting or wiped)"
        for key, lease in keys:
            if key == f"{PREFIX}/{job.name}/nodes/{agent.node}" and lease:
                return lease, ""
        return 0, "the node had no live state key at the kill (it had not joined yet)"

    def lease_gone(self, job: Job, lease: int) -> bool | None:
        """True once the lease is gone; None (moot) while etcd cannot be read."""
        ttl = self.kv.lease_ttl(job, lease)
        return None if ttl is None else ttl < 0

    def fault_kill_guard(self, job: Job, u: list[float]) -> bool:
        cands = [(a, g) for a in self.targets(job) for g in self.procs.guards(a)]
        if not cands:
            return False
        agent, guard = one_of(cands, u[0])
        before = len(self.procs.guards(agent))

        def proof(pid: int) -> bool:
            st = stat(pid)
            return st is not None and st[1] == agent.me.pid and any(
                "runner.system.shepherd_main" in a for a in argv_of(pid))

        if not signal_proven(guard, signal.SIGKILL, proof):
            return False
        self.state.record(job, "kill_guard", agent.label, f"SIGKILL guard pid {guard.pid} (the agent had {before})")

        def replaced() -> bool | None:
            if agent.proc.poll() is not None:
                return None
            now = self.procs.guards(agent)
            return guard not in now and len(now) >= before

        self.state.expect(job, "guard_replaced", GUARD_BOUND_S, replaced,
                          lambda: f"{agent.label} has guards {[g.pid for g in self.procs.guards(agent)]}, had {before} before "
                          f"the kill of {guard.pid}", met=f"{agent.label}'s guard replaced")
        return True

    def fault_signal_agent(self, job: Job, u: list[float]) -> bool:
        cands = [a for a in self.targets(job) if console_transitions(a) or time.time() - a.started > 10]
        agent = pick(cands, u[0])
        if agent is None:
            return False
        sig = STOP_SIGNALS[min(int(u[1] * 3), 2)]
        hosting = self.state.args.hosted and self.procs.hosted_etcd(agent) is not None
        if not self.live_agent(agent):
            return False  # it had already exited: the signal would do nothing (not injected; drawn again)
        agent.proc.send_signal(sig)
        agent.fate, agent.fate_at = sig.name, time.time()
        detail = sig.name
        others = [a for a in job.live() if a is not agent]
        if hosting:
            job.host_stopped = True
            job.loss = "the hosting node was stopped by a signal: every node stops (docs/multinode.md §8)"
            detail += "; it hosts the etcd: every node must stop"
            self.state.expect(job, "stop_honoured", HOSTED_STOP_BOUND_S, lambda: all(a.code is not None for a in others),
                              lambda: "nodes still running after the hosting node was stopped: "
                              + ", ".join(a.label for a in others if a.code is None))
        self.state.record(job, "signal_agent", agent.label, detail)
        self.state.expect(job, "stop_honoured", STOP_BOUND_S, lambda: agent.code is not None,
                          lambda: f"{agent.label} still runs {STOP_BOUND_S:g} s after {sig.name}")
        if not hosting:
            self.requeue(job, agent.node, 2 + u[2] * 8)
        return True

    def fault_etcd(self, job: Job, cls: str, u: list[float]) -> bool:
        if self.state.args.hosted:
            return self.fault_hosted_etcd(job, cls, u)
        etcd = self.state.etcd
        if etcd is None or not etcd.up or job.trained():
            return False
        if cls == "etcd_stop":
            down = 1 + u[0] * 11
            etcd.stop()
            self.state.record(job, cls, "etcd", f"SIGTERM, started again in {down:.1f} s")
            self.state.at(job, down, "etcd start", self.kv.start)
        elif cls == "etcd_restart":
            etcd.kill()
            etcd.start()
            self.state.record(job, cls, "etcd", "SIGKILL, started again at once")
        else:
            etcd.wipe()
            self.state.record(job, cls, "etcd", "SIGKILL, data dir deleted, started fresh on the same ports")
        return True

    def fault_hosted_etcd(self, job: Job, cls: str, u: list[float]) -> bool:
        host = self.procs.host(job)
        etcd = self.procs.hosted_etcd(host) if host is not None and not host.fate and not job.trained() else None
        if host is None or etcd is None:
            return False
        argv = argv_of(etcd.pid)

        def proof(pid: int) -> bool:
            return pid in descendants_of(host.proc.pid) and argv_of(pid) == argv

        target = f"hosted etcd of {host.label}"
        if cls == "etcd_stop":
            down = 1 + u[0] * 11
            if not signal_proven(etcd, signal.SIGSTOP, proof):
                return False
            self.state.record(job, cls, target, f"SIGSTOP pid {etcd.pid}, SIGCONT in {down:.1f} s")
            self.state.at(job, down, "hosted etcd SIGCONT", lambda: signal_proven(etcd, signal.SIGCONT, proof))
            return True
        data = argv[argv.index("--data-dir") + 1] if "--data-dir" in argv else ""
        # Wipe only a data dir proven the job's: the hosted etcd keeps it in the job's TMPDIR (runner-etcd-*/data).
        ours = data and Path(data).parent.name.startswith("runner-etcd-") and Path(data).is_relative_to(job.tmp)
        if self.hosted_kills.get(host.proc.pid, 0) >= HOSTED_ETCD_KILLS or (cls == "etcd_wipe" and not ours):
            return False
        if cls == "etcd_wipe":
            shutil.rmtree(data, ignore_errors=True)
        if not signal_proven(etcd, signal.SIGKILL, proof):
            return False
        self.hosted_kills[host.proc.pid] = self.hosted_kills.get(host.proc.pid, 0) + 1
        what = "data dir deleted, SIGKILL" if cls == "etcd_wipe" else "SIGKILL"
        self.state.record(job, cls, target, f"{what} pid {etcd.pid} (its agent restarts it)")

        self.state.expect(job, "etcd_restarted", ETCD_BACK_BOUND_S, lambda: self.etcd_back(job, host, etcd),
                          lambda: f"{host.label} did not start its etcd again within {ETCD_BACK_BOUND_S:g} s\n"
                          + evidence(job, EVIDENCE), met=f"{host.label}'s etcd started again")
        return True

    def etcd_back(self, job: Job, host: Agent, killed: Proc) -> bool | None:
        """Whether `host` runs the job's etcd again (a process other than `killed`); None: moot (it ended, or two
        agents of one machine: the other one's etcd took the job's port while this one's was down, and this agent
        rightly joins it: CI, seed 512665)."""
        if host.proc.poll() is not None:
            return None
        now = self.procs.hosted_etcd(host)
        if now is not None and now != killed:
            return True
        other = self.procs.host(job)
        return None if other is not None and other is not host else False

    def fault_disk_full(self, job: Job, u: list[float]) -> bool:
        if self.filled or not self.state.mounted:
            return False
        size = fill(self.state.logs_root)
        self.filled = True
        hold = 3 + u[0] * 27
        self.state.record(job, "disk_full", "logs tmpfs", f"filled ({size >> 20} MiB), freed in {hold:.1f} s")
        self.state.at(job, hold, "free the logs disk", self.free_disk)
        return True

    def free_disk(self) -> None:
        """Delete the filler."""
        if self.filled:
            (self.state.logs_root / ".chaos-filler").unlink(missing_ok=True)
            self.filled = False
            self.state.say("logs disk freed")

    def fault_partition(self, job: Job, u: list[float]) -> bool:
        net = self.state.net
        node = job.nodes[-1]
        if net is None or net.cut or not any(a.node == node for a in self.targets(job)):
            return False
        cut = 1 + u[0] * 14
        net.down()
        for a in job.live():
            if a.node == node:
                a.cut_off = True
        self.state.record(job, "partition", node, f"link down for {cut:.1f} s (lease_ttl {LEASE_TTL_S:g} s)")
        self.state.at(job, cut, "heal the partition", self.heal)
        return True

    def heal(self) -> None:
        """Bring the namespace's link back up."""
        if self.state.net is not None and self.state.net.cut:
            self.state.net.up()
            self.state.say("partition healed")
