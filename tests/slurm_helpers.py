"""A real Slurm cluster on simulated hosts (runner/testing/hosts.py), for tests of the sbatch script across machines.

One munged and one slurmctld run here (the root namespace: the "controller"), listening on the lab's bridge
address; one `slurmd -D` runs on each host (its own network namespace, address, hostname, /tmp and processes),
registered as `NodeName=<host> NodeAddr=<its address>`. Every path Slurm uses lives in the lab's shared folder
(`%n` keeps each slurmd's spool, pid and log files apart), so every host sees the same slurm.conf and munge socket.
No cgroups (proctrack/linuxproc, task/none): a job's processes are tracked through /proc, which on a host shows that
host's processes only. Jobs are submitted from here, as from a login node. Imported as `slurm_helpers`.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from conftest import wait_for

from runner.rendezvous.ports import free_port
from runner.testing.hosts import Host, Lab

NEEDED = ("slurmctld", "slurmd", "munged", "sbatch", "scontrol", "scancel", "sinfo", "srun")
RUNNER = str(Path(sys.executable).with_name("runner"))
SLURMD_TIMEOUT_S = 6  # how soon slurmctld declares a silent node DOWN (Slurm's default: 300 s)
KILL_WAIT_S = 10  # SIGTERM -> SIGKILL of a cancelled job's processes (longer than the specs' grace periods)
CRED_EXPIRE_S = 10  # also how long a requeued job waits before it may start again (Slurm's default: 120 s)
# How often the schedulers look at pending jobs (Slurm's defaults: 60 s main, 30 s backfill): nothing else wakes them
# when a requeued job's wait ends, so it would start up to 30 s later.
SCHED_INTERVAL_S = 2
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


def missing() -> list[str]:
    """Slurm and munge commands not installed here."""
    return [name for name in NEEDED if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]


def binary(name: str) -> str:
    """Path of a Slurm/munge binary (daemons live in /usr/sbin, often not on PATH)."""
    return shutil.which(name) or str(Path("/usr/sbin", name))


# Each slurmd's spool on its host's own /tmp: slurmstepd's Unix sockets live there, and a socket path may hold 108
# bytes at most, which a test's folder under an xdist worker's temp dir (popen-gwN/...) overran.
SPOOL = "/tmp/slurmd-spool"


def slurm_conf(base: Path, lab: Lab, names: list[str], control_port: int, slurmd_port: int) -> str:
    """The cluster: the controller at the bridge's address, one node per host at the host's address."""
    nodes = "\n".join(f"NodeName={n} NodeAddr={lab.address(n)} CPUs={os.cpu_count()} State=UNKNOWN" for n in names)
    return textwrap.dedent(f"""\
        ClusterName=runnerhosts
        SlurmctldHost={socket.gethostname()}({lab.bridge_ip})
        SlurmctldPort={control_port}
        SlurmdPort={slurmd_port}
        SlurmUser=root
        SlurmdUser=root
        AuthType=auth/munge
        CredType=cred/munge
        AuthInfo=socket={base}/munge.sock,cred_expire={CRED_EXPIRE_S}
        StateSaveLocation={base}/state
        SlurmdSpoolDir={SPOOL}.%n
        SlurmctldPidFile={base}/slurmctld.pid
        SlurmdPidFile={base}/slurmd.%n.pid
        SlurmctldLogFile={base}/slurmctld.log
        SlurmdLogFile={base}/slurmd.%n.log
        ProctrackType=proctrack/linuxproc
        TaskPlugin=task/none
        JobAcctGatherType=jobacct_gather/none
        SelectType=select/cons_tres
        SelectTypeParameters=CR_CPU
        SchedulerParameters=sched_interval={SCHED_INTERVAL_S},bf_interval={SCHED_INTERVAL_S}
        MpiDefault=none
        ReturnToService=2
        SlurmdTimeout={SLURMD_TIMEOUT_S}
        KillWait={KILL_WAIT_S}
        MinJobAge=600
        MessageTimeout=3
        """) + nodes + f"\nPartitionName=debug Nodes={','.join(names)} Default=YES MaxTime=INFINITE State=UP\n"


class SlurmLab:
    """munged + slurmctld here, one slurmd per host of `lab`; `close()` stops them all (never raises)."""

    def __init__(self, lab: Lab, names: list[str]) -> None:
        self.lab = lab
        self.base = lab.shared / "slurm"
        self.base.mkdir()
        (self.base / "state").mkdir()
        self.hosts: dict[str, Host] = {name: lab.add(name) for name in names}
        self.conf = self.base / "slurm.conf"
        self.conf.write_text(slurm_conf(self.base, lab, names, free_port(lab.bridge_ip), free_port()))
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        """Start every daemon; return once every node is idle."""
        key = self.base / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        self._daemon([binary("munged"), "-F", "--force", f"--key-file={key}", f"--socket={self.base}/munge.sock",
                      f"--pid-file={self.base}/munged.pid", f"--log-file={self.base}/munged.log",
                      f"--seed-file={self.base}/munge.seed"], None)
        wait_for(lambda: (self.base / "munge.sock").exists(), 30, "munged's socket")
        self._daemon([binary("slurmctld"), "-D", "-i", "-f", str(self.conf)], None)
        for name, host in self.hosts.items():
            host.run(["mkdir", "-p", "-m", "0755", f"{SPOOL}.{name}"], timeout=10)
            self._daemon([binary("slurmd"), "-D", "-N", name, "-f", str(self.conf)], host)
        try:
            wait_for(lambda: set(self.node_states().values()) == {"idle"}, 60, "every Slurm node to be idle")
        except AssertionError as e:
            raise AssertionError(f"{e}: {self.node_states()}; {self.logs()}") from None

    def _daemon(self, argv: list[str], host: Host | None) -> None:
        log = (self.base / f"{Path(argv[0]).name}.{host.name if host else 'ctl'}.out").open("wb")
        with log:
            if host is None:
                self.procs.append(subprocess.Popen(argv, env=self.env, stdout=log, stderr=log))
            else:
                self.procs.append(host.popen(argv, env=host.env({"SLURM_CONF": str(self.conf)}), stdout=log,
                                             stderr=log))

    def logs(self) -> str:
        """The daemons' logs (the last lines of each), for a failure's message."""
        parts = []
        for path in sorted(self.base.glob("*.log")) + sorted(self.base.glob("*.out")):
            lines = path.read_text(errors="replace").splitlines()[-15:]
            parts.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def command(self, *argv: str, check: bool = False, cwd: Path | None = None,
                extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """A Slurm command run here (the login node), bounded."""
        return subprocess.run([binary(argv[0]), *argv[1:]], env={**self.env, **(extra or {})}, cwd=cwd,
                              capture_output=True, text=True, check=check, timeout=60)

    def node_states(self) -> dict[str, str]:
        """node -> state as sinfo prints it (empty while slurmctld does not answer)."""
        done = self.command("sinfo", "-h", "-N", "-o", "%N %T")
        if done.returncode:
            return {}
        return dict(line.split(None, 1) for line in done.stdout.splitlines() if line.strip())

    def job_field(self, job: str, name: str) -> str:
        """One field of `scontrol show job` (JobState, ExitCode, Restarts, NodeList, ...)."""
        done = self.command("scontrol", "show", "job", job)
        match = re.search(rf"\b{name}=(\S+)", done.stdout)
        return match.group(1) if match else ""

    def submit(self, spec: Path, folder: Path, *sbatch_args: str) -> str:
        """Render the sbatch script with the real CLI (`runner template slurm`), submit it from `folder`."""
        script = folder / "job.sbatch"
        subprocess.run([RUNNER, "template", "slurm", spec.name, "-o", str(script)], check=True, cwd=folder,
                       timeout=60)
        done = self.command("sbatch", "--parsable", *sbatch_args, str(script), check=True, cwd=folder,
                            extra={"RUNNER": RUNNER, "PYTHONUNBUFFERED": "1"})
        return done.stdout.strip().split(";")[0]

    def wait_state(self, job: str, states: tuple[str, ...], timeout: float, folder: Path) -> str:
        """Wait for the job to reach one of `states`; the state (AssertionError with the job's output if not)."""
        try:
            wait_for(lambda: self.job_field(job, "JobState") in states, timeout, f"job {job} in {states}")
        except AssertionError as e:
            raise AssertionError(f"{e} (it is {self.job_field(job, 'JobState')}); output:\n{output(folder)}\n"
                                 f"{self.logs()}") from None
        return self.job_field(job, "JobState")

    def close(self) -> None:
        """Cancel every job, stop the daemons (slurmds first), reap them."""
        try:
            self.command("scancel", "--full", "--user=root")
        except (OSError, subprocess.SubprocessError):
            pass
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                subprocess.Popen.kill(proc)
                proc.wait()


def output(folder: Path) -> str:
    """The batch job's output (slurm-<name>-<id>.out in the submit folder)."""
    return "\n".join(p.read_text(errors="replace") for p in sorted(folder.glob("slurm-*.out")))


def leftovers(host: Host, keep: tuple[str, ...] = ("slurmd",)) -> list[str]:
    """Every process of `host` but its init and the daemons in `keep`: 'pid cmdline' (a job must leave none)."""
    found = []
    for inner, outer in sorted(host.pids().items()):
        if inner == 1:
            continue
        try:
            cmd = Path(f"/proc/{outer}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if cmd and Path(cmd.split()[0]).name not in keep and not any(cmd.startswith(f"{binary(k)} ") for k in keep):
            found.append(f"{inner} {cmd}")
    return found


def wait_no_leftovers(hosts: list[Host], timeout: float) -> None:
    """Wait until no host runs anything but slurmd (AssertionError naming what is left after `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        left = {h.name: leftovers(h) for h in hosts if not h.lost}
        if not any(left.values()):
            return
        if time.monotonic() > deadline:
            msg = f"processes left behind after {timeout:g} s: {left}"
            raise AssertionError(msg)
        time.sleep(0.2)
