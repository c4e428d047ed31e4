"""The sbatch script from `runner template slurm` on a real single-node Slurm (slurmctld + slurmd + munged)
started on localhost by a fixture: the job completes, and the time-limit signal reaches the workers."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from ci_skips import need
from conftest import ROOT, wait_for

from runner.rendezvous.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("slurm")]  # one Slurm lab at a time

KILL_WAIT_S = 10  # SIGTERM -> SIGKILL of a cancelled job's processes
DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch", "scontrol", "scancel", "squeue")
MISSING = [name for name in DAEMONS if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]
RUNNER = str(Path(sys.executable).with_name("runner"))
SIGNAL_WORKER = """
import os, signal, sys, time
out = sys.argv[1]
def on_term(signum, frame):  # written, then renamed: the test reads it as soon as it exists
    path = os.path.join(out, "term-" + os.environ["RANK"])
    with open(path + ".tmp", "w") as f:
        f.write(str(signum))
    os.replace(path + ".tmp", path)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(out, "ready-" + os.environ["RANK"]), "w").close()
while True:
    time.sleep(0.2)
"""


def binary(name: str) -> str:
    """Path of a Slurm/munge binary (daemons live in /usr/sbin, often not on PATH)."""
    return shutil.which(name) or str(Path("/usr/sbin", name))


def slurm_conf(base: Path, host: str) -> str:
    """A one-node cluster on loopback: no cgroups (proctrack/linuxproc), everything under `base`."""
    return textwrap.dedent(f"""\
        ClusterName=runnertest
        SlurmctldHost={host}(127.0.0.1)
        SlurmctldPort={free_port("127.0.0.1")}
        SlurmdPort={free_port("127.0.0.1")}
        SlurmUser=root
        SlurmdUser=root
        AuthType=auth/munge
        CredType=cred/munge
        AuthInfo=socket={base}/munge.sock
        StateSaveLocation={base}/state
        SlurmdSpoolDir={base}/spool
        SlurmctldPidFile={base}/slurmctld.pid
        SlurmdPidFile={base}/slurmd.pid
        SlurmctldLogFile={base}/slurmctld.log
        SlurmdLogFile={base}/slurmd.log
        ProctrackType=proctrack/linuxproc
        TaskPlugin=task/none
        JobAcctGatherType=jobacct_gather/none
        SelectType=select/cons_tres
        SelectTypeParameters=CR_CPU
        MpiDefault=none
        ReturnToService=2
        KillWait={KILL_WAIT_S}
        MinJobAge=600
        NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN
        PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
        """)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Start munged, slurmctld and slurmd in the foreground (children of this test, always reaped)."""
    if MISSING:
        need(f"Slurm not installed (missing {', '.join(MISSING)}): apt-get install -y slurm-wlm munge")
    if os.geteuid() != 0:
        need("slurmd must run as root to start jobs")
    base = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (base / sub).mkdir()
    key = base / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    conf = base / "slurm.conf"
    conf.write_text(slurm_conf(base, socket.gethostname()))
    env = dict(os.environ, SLURM_CONF=str(conf))
    commands = [
        [binary("munged"), "-F", "--force", f"--key-file={key}", f"--socket={base}/munge.sock",
         f"--pid-file={base}/munged.pid", f"--log-file={base}/munged.log", f"--seed-file={base}/munge.seed"],
        [binary("slurmctld"), "-D", "-i", "-f", str(conf)],
        [binary("slurmd"), "-D", "-f", str(conf)],
    ]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for argv in commands:
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            if argv[0].endswith("munged"):
                wait_for(lambda: (base / "munge.sock").exists(), 30, "munged's socket")
        wait_for(lambda: node_state(env) == "idle", 60, "the Slurm node to be idle")
        yield env
    finally:
        subprocess.run([binary("scancel"), "--full", "--user=root"], env=env, check=False, capture_output=True)
        # slurmd must outlive the jobs: its step daemons, here in this machine's PID namespace, would survive it with
        # whatever they failed to kill (a failed test's agents, on the next test's ports)
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not queued(env), KILL_WAIT_S + 20, "every job to end")
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def queued(env: dict[str, str]) -> list[str]:
    """The jobs squeue lists (pending, running, completing: not ended yet); [] also when slurmctld does not answer."""
    done = subprocess.run([binary("squeue"), "-h", "-o", "%i %T"], env=env,
                          capture_output=True, text=True, check=False)
    return done.stdout.split("\n")[:-1] if done.returncode == 0 else []


def node_state(env: dict[str, str]) -> str:
    """The node's state as sinfo prints it ('' while slurmctld is not answering)."""
    done = subprocess.run([binary("sinfo"), "-h", "-o", "%T"], env=env, capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


def job_field(env: dict[str, str], job: str, name: str) -> str:
    """One field of `scontrol show job` (JobState, ExitCode, Restarts, ...)."""
    done = subprocess.run([binary("scontrol"), "show", "job", job], env=env, capture_output=True, text=True,
                          check=False)
    match = re.search(rf"\b{name}=(\S+)", done.stdout)
    return match.group(1) if match else ""


def submit(env: dict[str, str], spec: Path, folder: Path) -> str:
    """Render the sbatch script with the real CLI and submit it from `folder`; returns the job id."""
    script = folder / "job.sbatch"
    subprocess.run([RUNNER, "template", "slurm", str(spec), "-o", str(script)], check=True, cwd=folder)
    env = dict(env, RUNNER=RUNNER, PYTHONUNBUFFERED="1")
    done = subprocess.run([binary("sbatch"), "--parsable", str(script)], env=env, cwd=folder,
                          capture_output=True, text=True, check=True)
    return done.stdout.strip().split(";")[0]


def output(folder: Path) -> str:
    """The batch job's output file (slurm-<name>-<id>.out in the submit folder)."""
    files = list(folder.glob("slurm-*.out"))
    return files[0].read_text() if files else ""


def test_sbatch_script_runs_the_example_to_completion(slurm: dict[str, str], tmp_path: Path) -> None:
    """hello.yaml through sbatch: one agent via srun, two gloo workers, job COMPLETED with exit 0."""
    job = submit(slurm, ROOT / "examples" / "jobs" / "hello.yaml", tmp_path)
    wait_for(lambda: job_field(slurm, job, "JobState") in ("COMPLETED", "FAILED", "CANCELLED"), 180, "the job to end")
    text = output(tmp_path)
    assert job_field(slurm, job, "JobState") == "COMPLETED", text
    assert job_field(slurm, job, "ExitCode") == "0:0"
    assert "runner: agents exited with status 0" in text
    report = tmp_path / "runner-logs" / "hello" / "latest" / "report.json"
    assert '"succeeded"' in report.read_text()


def test_time_limit_signal_reaches_workers_and_requeues(slurm: dict[str, str], tmp_path: Path) -> None:
    """USR1 to the batch shell (what --signal=B:USR1@lead sends before the time limit) stops the agents, whose
    workers get shutdown.signal and exit cleanly; the script then requeues the job (Restarts=1)."""
    (tmp_path / "worker.py").write_text(SIGNAL_WORKER)
    out = tmp_path / "out"
    out.mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text(textwrap.dedent(f"""\
        name: preempt
        entrypoint: {{script: worker.py, args: ["{out}"]}}
        nproc_per_node: 2
        restart: {{max_restarts: 0}}
        shutdown: {{signal: SIGTERM, grace_period: 20s}}
        cluster: {{slurm: {{signal_lead: 60s, requeue: true}}}}
        """))
    job = submit(slurm, spec, tmp_path)
    wait_for(lambda: (out / "ready-0").exists() and (out / "ready-1").exists(), 120, "the workers to start")
    subprocess.run([binary("scancel"), "--batch", "--signal=USR1", job], env=slurm, check=True)
    wait_for(lambda: (out / "term-0").exists() and (out / "term-1").exists(), 60, "SIGTERM in both workers")
    assert (out / "term-0").read_text() == "15"
    try:
        wait_for(lambda: job_field(slurm, job, "Restarts") == "1", 120, "the job to be requeued")
    except AssertionError as e:
        raise AssertionError(f"{e}; the job's output:\n{output(tmp_path)}") from None
    text = output(tmp_path)
    assert "time limit near" in text
    assert "runner: agents exited with status 143" in text  # 128 + SIGTERM: stopped, not failed
    assert "requeueing job" in text
    # Right after the requeue the old incarnation may still be COMPLETING; it must then be queued again.
    wait_for(lambda: job_field(slurm, job, "JobState") in ("PENDING", "REQUEUED", "RUNNING"), 120, "the job queued again")
    subprocess.run([binary("scancel"), job], env=slurm, check=True)
    wait_for(lambda: job_field(slurm, job, "JobState") in ("CANCELLED", "COMPLETED", "FAILED"), 120, "the cancel")
