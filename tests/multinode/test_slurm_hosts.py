"""The sbatch script from `runner template slurm` on a real Slurm of several machines: slurmctld here, one slurmd
on each simulated host (tests/slurm_helpers.py, runner/testing/hosts.py: own address, hostname, /tmp, processes).

The spec names no host: its hosted rendezvous is on `${RUNNER_FIRST_NODE}:29400`, which the script sets to the
allocation's first node. Proven across hosts: a 2- and a 3-node job complete (one gloo all_reduce over the bridge);
a host lost mid-job leaves an elastic job's survivors to finish, and requeues a fixed-size job, which resumes from
its checkpoint on the nodes it gets next; scancel and the time-limit signal end every host's workers and leave no
process behind on any host.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ci_skips import need
from conftest import wait_for
from slurm_helpers import (
    CRED_EXPIRE_S,
    ENDED,
    KILL_WAIT_S,
    RUNNER,
    SLURMD_TIMEOUT_S,
    SlurmLab,
    leftovers,
    missing,
    output,
    wait_no_leftovers,
)

from runner.testing.hosts import Lab

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("slurm")]  # one Slurm lab at a time

HOSTS = ["h1", "h2", "h3"]
JOIN_TIMEOUT_S = 600  # the fixed-size job's: the requeue must not wait for it
# A lost host to the requeued job's workers: detection (SlurmdTimeout and its pings), the step's end (at most KillWait
# after its cancel, twice for the batch step), cred_expire, the scheduler, a start; with room for a loaded machine.
REQUEUED_WITHIN_S = 3 * SLURMD_TIMEOUT_S + 2 * KILL_WAIT_S + CRED_EXPIRE_S + 60
assert REQUEUED_WITHIN_S < JOIN_TIMEOUT_S / 2
# A worker that trains `steps` steps of 0.3 s, rank 0 checkpointing after each, resuming from the checkpoint it finds;
# it records where it started (host, world size, Slurm restart, checkpoint) and the signal that stopped it.
WORKER = """
import json, os, signal, socket, sys, time
out, steps, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
restart, attempt = os.environ.get("SLURM_RESTART_COUNT", "0"), os.environ["TORCHELASTIC_RESTART_COUNT"]
host = socket.gethostname()
tag = f"r{restart}-a{attempt}-rank{rank}"
def on_term(signum, frame):
    with open(os.path.join(out, f"term-{tag}"), "w") as f:
        f.write(host)
    sys.exit(128 + signum)
signal.signal(signal.SIGTERM, on_term)
ckpt = os.path.join(out, "ckpt")
start = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
with open(os.path.join(out, f"start-{tag}.json"), "w") as f:
    json.dump({"host": host, "rank": rank, "world": world, "restart": int(restart), "attempt": int(attempt),
               "start": start, "master": os.environ["MASTER_ADDR"]}, f)
if mode == "allreduce":
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    with open(os.path.join(out, f"sum-rank{rank}"), "w") as f:
        f.write(f"{t.item():g}")
    dist.destroy_process_group()
for step in range(start, steps):
    time.sleep(0.3)
    if rank == 0:
        with open(ckpt + ".tmp", "w") as f:
            f.write(str(step + 1))
        os.replace(ckpt + ".tmp", ckpt)
"""


def spec(name: str, nodes: str, steps: int, mode: str = "train", requeue: bool = True, join_timeout: int = 60) -> str:
    """A job on a hosted rendezvous at the allocation's first node: no host name anywhere."""
    return textwrap.dedent(f"""\
        version: 1
        name: {name}
        entrypoint: {{script: worker.py, args: [out, "{steps}", {mode}]}}
        nodes: "{nodes}"
        nproc_per_node: 1
        rendezvous:
          backend: etcd
          hosted: true
          endpoints: ["${{RUNNER_FIRST_NODE}}:29400"]
          last_call: 3s
          lease_ttl: 3s
          join_timeout: {join_timeout}s
          connect_timeout: 5s
        restart: {{max_restarts: 3, backoff: {{initial: 0.1s}}}}
        shutdown: {{signal: SIGTERM, grace_period: 5s}}
        cluster: {{slurm: {{signal_lead: 30s, requeue: {str(requeue).lower()}}}}}
        """)


@pytest.fixture
def slurm(lab: Lab) -> Iterator[SlurmLab]:
    """Slurm on three hosts (h1, h2, h3); skipped with the reason where Slurm is not installed."""
    if missing():
        need(f"Slurm not installed (missing {', '.join(missing())}): apt-get install -y slurm-wlm munge")
    made = SlurmLab(lab, HOSTS)
    try:
        made.start()
        yield made
    finally:
        made.close()


def job_folder(slurm: SlurmLab, text: str) -> Path:
    """The submit folder (shared by every host): the spec, the worker and its output folder."""
    folder = slurm.lab.shared / "job"
    (folder / "out").mkdir(parents=True)
    (folder / "worker.py").write_text(WORKER)
    (folder / "job.yaml").write_text(text)
    return folder


def until(slurm: SlurmLab, folder: Path, cond: Callable[[], bool], timeout: float, what: str) -> None:
    """wait_for, failing with what the job said (its output, the workers' starts, the Slurm job) to diagnose it."""
    try:
        wait_for(cond, timeout, what)
    except AssertionError as e:
        jobs = slurm.command("scontrol", "show", "job").stdout
        logs = "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in folder.glob("runner-logs/*/*/agent.jsonl") if not p.parent.is_symlink())
        raise AssertionError(f"{e}\nstarts: {starts(folder)}\noutput:\n{output(folder)}\n{jobs}\n{logs}") from None


def starts(folder: Path) -> list[dict[str, Any]]:
    """What every worker recorded when it started."""
    found = []
    for path in sorted((folder / "out").glob("start-*.json")):
        try:
            found.append(json.loads(path.read_text()))
        except ValueError:
            continue  # being written
    return found


def reports(folder: Path) -> dict[str, dict[str, Any]]:
    """node id -> its agent's report.json (every run dir of the job, in the shared submit folder)."""
    found = {}
    for path in folder.glob("runner-logs/*/*/report.json"):
        if not path.parent.is_symlink():
            report = json.loads(path.read_text())
            found[str(report.get("node"))] = report
    return found


@pytest.mark.parametrize("nodes", [2, 3])
def test_job_completes_with_the_rendezvous_on_the_first_node(slurm: SlurmLab, nodes: int) -> None:
    """N nodes, one agent on each host; the first node hosts etcd (found from the allocation), every worker joins one
    gloo all_reduce across the hosts, and the job is COMPLETED."""
    folder = job_folder(slurm, spec(f"first{nodes}", str(nodes), 1, "allreduce"))
    job = slurm.submit(folder / "job.yaml", folder)
    state = slurm.wait_state(job, ("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL"), 120, folder)
    text = output(folder)
    assert state == "COMPLETED", f"{text}\n{slurm.logs()}"
    first = HOSTS[0]
    assert f"job {job} on" in text
    started = starts(folder)
    assert sorted(s["host"] for s in started) == HOSTS[:nodes]  # one worker per host, named by the host
    assert {s["world"] for s in started} == {nodes}
    assert {s["master"] for s in started} == {first}  # rank 0 on the first node, advertised by its hostname
    total = nodes * (nodes + 1) / 2
    assert [float((folder / "out" / f"sum-rank{r}").read_text()) for r in range(nodes)] == [total] * nodes
    done = reports(folder)
    assert sorted(done) == [f"node{i}" for i in range(nodes)]  # SLURM_NODEID: node0 runs on the first host
    assert all(r["outcome"] == "succeeded" for r in done.values()), done
    hosting = [json.loads((log.parent.parent / "report.json").read_text())["node"]
               for log in folder.glob("runner-logs/*/*/etcd/etcd.log") if not log.parent.parent.is_symlink()]
    # the first node hosts; with three nodes the etcd grows to three members (hosted_members 3, the default), as far
    # as it got before a one-step job ended; two nodes keep one member (two would need each other)
    assert "node0" in hosting and set(hosting) <= {f"node{i}" for i in range(3 if nodes >= 3 else 1)}, hosting
    wait_no_leftovers(list(slurm.hosts.values()), KILL_WAIT_S + 10)


def test_elastic_job_goes_on_without_a_lost_host(slurm: SlurmLab) -> None:
    """nodes 2:3 on three hosts; h3 is lost mid-training (every process at once, slurmd too): h1 and h2
    re-rendezvous as a world of 2, resume from the checkpoint and finish; Slurm keeps the allocation (--no-kill)."""
    folder = job_folder(slurm, spec("elastic", "2:3", 40))
    job = slurm.submit(folder / "job.yaml", folder, "--nodes=3")  # Slurm may give a 2-3 range its minimum
    until(slurm, folder, lambda: len({s["host"] for s in starts(folder)}) == 3, 90, "a worker on each of the 3 hosts")
    until(slurm, folder, lambda: (folder / "out" / "ckpt").exists() and int((folder / "out" / "ckpt").read_text() or 0) >= 3,
             60, "3 steps trained")
    slurm.hosts["h3"].lose()
    until(slurm, folder, lambda: any(s["world"] == 2 for s in starts(folder)), 60, "workers of a world of 2")
    state = slurm.wait_state(job, ("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL"), 120, folder)
    text = output(folder)
    after = [s for s in starts(folder) if s["world"] == 2]
    assert {s["host"] for s in after} == {"h1", "h2"}, starts(folder)
    assert min(s["start"] for s in after) >= 3  # resumed from the checkpoint, not from step 0
    assert {s["restart"] for s in starts(folder)} == {0}  # the same allocation: no requeue
    assert int((folder / "out" / "ckpt").read_text()) == 40
    done = reports(folder)
    assert {n for n, r in done.items() if r["outcome"] == "succeeded"} >= {"node0", "node1"}, f"{state} {done}\n{text}"
    assert state == "COMPLETED", text  # srun --no-kill: the step outlives the node Slurm finds down
    wait_no_leftovers([slurm.hosts["h1"], slurm.hosts["h2"]], KILL_WAIT_S + 10)


def test_fixed_size_job_is_requeued_and_resumes_after_a_lost_host(slurm: SlurmLab) -> None:
    """nodes 2 on three hosts (h1, h2 allocated); h2 is lost mid-training: Slurm finds the node down, requeues the
    job (--requeue), which runs again on h1 and h3 and resumes from the checkpoint to the end.

    The survivor's agent on h1 waits in its rendezvous for the lost node (join_timeout: 600 s); Slurm's cancel of the
    step must reach it (proctrack/linuxproc finds it under the step daemon), so the job starts again within the
    bound below: Slurm's detection, KillWait twice over and cred_expire, far below the join timeout.
    """
    folder = job_folder(slurm, spec("fixed", "2", 30, join_timeout=JOIN_TIMEOUT_S))
    job = slurm.submit(folder / "job.yaml", folder)
    until(slurm, folder, lambda: (folder / "out" / "ckpt").exists() and int((folder / "out" / "ckpt").read_text() or 0) >= 3,
             90, "3 steps trained")
    first = {s["host"] for s in starts(folder)}
    assert first == {"h1", "h2"}, starts(folder)
    slurm.hosts["h2"].lose()
    until(slurm, folder, lambda: any(s["restart"] >= 1 for s in starts(folder)), REQUEUED_WITHIN_S,
          "workers of the requeued job (the survivor's agent was not stopped when Slurm found its peer's node down?)")
    state = slurm.wait_state(job, ("COMPLETED", "FAILED", "CANCELLED"), 120, folder)
    text = output(folder)
    assert state == "COMPLETED", text
    assert slurm.job_field(job, "Restarts") == "1"
    again = [s for s in starts(folder) if s["restart"] == 1]
    assert {s["host"] for s in again} == {"h1", "h3"}, starts(folder)
    assert min(s["start"] for s in again) >= 3  # from the checkpoint
    assert int((folder / "out" / "ckpt").read_text()) == 30
    wait_no_leftovers([slurm.hosts["h1"], slurm.hosts["h3"]], KILL_WAIT_S + 10)


def test_scancel_ends_every_hosts_workers(slurm: SlurmLab) -> None:
    """scancel of a running 3-node job: every host's worker gets shutdown.signal from its agent, and nothing of the
    job (agent, hosted etcd, guard, worker, step daemon) is left on any host."""
    folder = job_folder(slurm, spec("cancel", "3", 1000))
    job = slurm.submit(folder / "job.yaml", folder)
    until(slurm, folder, lambda: len({s["host"] for s in starts(folder)}) == 3, 90, "a worker on each of the 3 hosts")
    running = {h.name: leftovers(h) for h in slurm.hosts.values()}
    # the check sees them: each host's agent, by its title (runner/system/title.py)
    assert all(any(" runner: agent job cancel" in cmd for cmd in cmds) for cmds in running.values()), running
    slurm.command("scancel", job, check=True)
    slurm.wait_state(job, ("CANCELLED",), 60, folder)
    wait_no_leftovers(list(slurm.hosts.values()), KILL_WAIT_S + 15)
    terms = {p.read_text() for p in (folder / "out").glob("term-*")}
    assert terms == set(HOSTS), terms


def test_time_limit_signal_ends_every_hosts_workers(slurm: SlurmLab) -> None:
    """USR1 to the batch shell (what --signal=B:USR1@signal_lead sends before the time limit): the script signals
    the agents' step, each agent stops its host's worker with shutdown.signal, the job ends and leaves nothing."""
    folder = job_folder(slurm, spec("limit", "3", 1000, requeue=False))
    job = slurm.submit(folder / "job.yaml", folder)
    until(slurm, folder, lambda: len({s["host"] for s in starts(folder)}) == 3, 90, "a worker on each of the 3 hosts")
    slurm.command("scancel", "--batch", "--signal=USR1", job, check=True)
    state = slurm.wait_state(job, ("COMPLETED", "FAILED", "CANCELLED"), 60, folder)
    text = output(folder)
    assert "time limit near" in text
    assert "runner: agents exited with status 143" in text, text  # stopped, not failed
    assert state == "FAILED"  # exit 143: the time limit stopped it (requeue: false, so no requeue)
    terms = {p.read_text() for p in (folder / "out").glob("term-*")}
    assert terms == set(HOSTS), terms
    wait_no_leftovers(list(slurm.hosts.values()), KILL_WAIT_S + 15)


def test_converted_torchrun_job_runs_as_rendered(slurm: SlurmLab) -> None:
    """A torchrun command line with a fixed rendezvous host that is not in the allocation (192.0.2.2, TEST-NET-1),
    converted by `runner convert`, rendered by `runner template slurm` and submitted unedited: the script puts the
    allocation's first node in its place (RUNNER_HOSTED_ENDPOINT), both hosts join one gloo all_reduce, COMPLETED."""
    folder = slurm.lab.shared / "job"
    (folder / "out").mkdir(parents=True)
    (folder / "worker.py").write_text(WORKER)
    torchrun = ["torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                "192.0.2.2:29400", "worker.py", "out", "1", "allreduce"]
    done = subprocess.run([RUNNER, "convert", "--", *torchrun], cwd=folder, capture_output=True, text=True,
                          check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "endpoints: 192.0.2.2:29400" in done.stdout  # the fixed host, as torchrun had it
    (folder / "job.yaml").write_text(done.stdout)
    job = slurm.submit(folder / "job.yaml", folder)
    state = slurm.wait_state(job, ENDED, 40, folder)  # a job waiting for 192.0.2.2 would wait join_timeout (600 s)
    text = output(folder)
    assert state == "COMPLETED", f"{text}\n{slurm.logs()}"
    assert "rendezvous.endpoints 192.0.2.2:29400 replaced by h1:29400" in text
    assert sorted(s["host"] for s in starts(folder)) == ["h1", "h2"]
    assert [float((folder / "out" / f"sum-rank{r}").read_text()) for r in range(2)] == [3.0, 3.0]
    wait_no_leftovers(list(slurm.hosts.values()), KILL_WAIT_S + 10)
