"""`runner template` renders jobs that run as rendered (runner/config/clusters/fit.py, docs/clusters.md):

- a hosted rendezvous on a fixed host (what `runner convert` makes of `torchrun --rdzv-endpoint 192.0.2.2:29400`)
  is moved to the allocation's first node ($RUNNER_HOSTED_ENDPOINT, which the loader puts in place of the field),
  and the template says so on stderr;
- GPUs asked for by nproc_per_node on a GPU job become the scheduler's request, an explicit cluster.gpus_per_node
  wins, and what the spec cannot tell (or contradicts) is refused naming cluster.gpus_per_node;
- the Kubernetes output says how to create the job's Secret (never its value) and mounts it so that a container
  running as any user reads it: the mount and the copy are run as the kubelet would leave them, as another user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from ci_skips import need
from conftest import RUNNER
from hypothesis import given, settings
from hypothesis import strategies as st

from runner.config.checks import unspecified
from runner.config.clusters.common import SECRET_COPY, SECRET_FS_GROUP, SECRET_MOUNT
from runner.config.hosted_endpoint import endpoint_problem
from runner.config.loader import load_spec_text
from runner.contract import HOSTED_ENDPOINT_ENV, SECRET_ENV
from runner.errors import SpecError

K8S_VERSION = "1.33.0"
TORCHRUN = ["--nnodes", "2", "--nproc-per-node", "8", "--rdzv-backend", "c10d", "--rdzv-endpoint",
            "192.0.2.2:29400", "train.py"]
IMAGE = 'cluster: {kubernetes: {image: "reg/train:1", namespace: ml}}\n'


def runner(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real CLI, bounded."""
    return subprocess.run([*RUNNER, *args], cwd=cwd, capture_output=True, text=True,
                          check=False, timeout=60, env=env)


def write(tmp_path: Path, text: str) -> Path:
    """A spec file (and an empty train.py beside it)."""
    (tmp_path / "train.py").write_text("")
    spec = tmp_path / "job.yaml"
    spec.write_text(textwrap.dedent(text))
    return spec


def template(kind: str, spec: Path) -> subprocess.CompletedProcess[str]:
    """`runner template KIND job.yaml`, run in the spec's folder."""
    return runner("template", kind, spec.name, cwd=spec.parent)


def agent_pod(text: str) -> dict[str, Any]:
    """The Indexed Job's pod spec, every document validated against the Kubernetes schemas (strict)."""
    docs = list(yaml.safe_load_all(text))
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    [job] = [d for d in docs if d["kind"] == "Job"]
    pod: dict[str, Any] = job["spec"]["template"]["spec"]
    return pod


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    """The agent container's environment (plain values)."""
    return {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}


def converted(tmp_path: Path) -> Path:
    """`runner convert -- torchrun ... --rdzv-endpoint 192.0.2.2:29400 train.py`, written as job.yaml (relative cwd,
    as a Kubernetes spec must have it)."""
    done = runner("convert", "--", "torchrun", *TORCHRUN, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    text = "\n".join(line for line in done.stdout.splitlines() if not line.startswith("cwd:"))
    return write(tmp_path, text + "\n" + IMAGE)


# --- a hosted rendezvous on a fixed host -------------------------------------------------------------------------


def test_converted_torchrun_endpoint_is_moved_to_the_allocations_first_node(tmp_path: Path) -> None:
    """The converted spec keeps 192.0.2.2:29400; both templates render (exit 0) with the first node in its place, and
    say so on stderr naming the field."""
    spec = converted(tmp_path)
    assert "endpoints: 192.0.2.2:29400" in spec.read_text()
    slurm = template("slurm", spec)
    assert slurm.returncode == 0, slurm.stderr
    assert f'export {HOSTED_ENDPOINT_ENV}="${{RUNNER_FIRST_NODE}}:29400"' in slurm.stdout
    assert slurm.stdout.index(HOSTED_ENDPOINT_ENV) < slurm.stdout.index("${RUNNER} run")
    assert "runner template: note: rendezvous.endpoints: 192.0.2.2:29400 names a fixed host" in slurm.stderr
    assert subprocess.run(["bash", "-n"], input=slurm.stdout, text=True, check=False).returncode == 0
    k8s = template("kubernetes", spec)
    assert k8s.returncode == 0, k8s.stderr
    first = "train-794e11-0.train-794e11.ml.svc"  # pod 0 under the headless Service
    assert env_of(agent_pod(k8s.stdout))[HOSTED_ENDPOINT_ENV] == f"{first}:29400"
    assert "rendezvous.endpoints: 192.0.2.2:29400" in k8s.stderr


def test_a_node_loads_the_converted_spec_with_the_first_node_in_place(tmp_path: Path) -> None:
    """What each node loads: the variable's host:port is rendezvous.endpoints (the fixed host is gone)."""
    text = converted(tmp_path).read_text()
    spec = load_spec_text(text, environ={HOSTED_ENDPOINT_ENV: "node007:29400"})
    assert spec.rendezvous.endpoints == ("node007:29400",)
    assert load_spec_text(text, environ={}).rendezvous.endpoints == ("192.0.2.2:29400",)


@pytest.mark.parametrize("endpoints", ['["${RUNNER_FIRST_NODE}:29400"]', '"${HEAD:-node1}:29400"',
                                       '"train-794e11-0.train-794e11.ml.svc:29400"'])
def test_an_endpoint_the_nodes_resolve_is_kept(tmp_path: Path, endpoints: str) -> None:
    """The templates' first node, a ${VAR} the nodes set, or (Kubernetes) pod 0's own name: nothing replaced."""
    spec = write(tmp_path, f"""\
        name: train-794e11
        entrypoint: {{script: train.py}}
        nodes: 2
        rendezvous: {{backend: etcd, hosted: true, endpoints: {endpoints}}}
        """ + IMAGE)
    for kind in ("slurm", "kubernetes"):
        done = template(kind, spec)
        assert done.returncode == 0, done.stderr
        if kind == "kubernetes" or "svc" not in endpoints:
            assert HOSTED_ENDPOINT_ENV not in done.stdout and "names a fixed host" not in done.stderr


def test_an_etcd_of_ones_own_is_kept(tmp_path: Path) -> None:
    """rendezvous.hosted false: the endpoint is an etcd the user runs, reachable from every node: kept, and a node
    that has the variable (set for another job) still loads the spec's own endpoint."""
    text = """\
        name: own
        entrypoint: {script: train.py}
        nodes: 2
        rendezvous: {backend: etcd, endpoints: "etcd.infra:2379"}
        """ + IMAGE
    spec = write(tmp_path, text)
    for kind in ("slurm", "kubernetes"):
        done = template(kind, spec)
        assert done.returncode == 0 and HOSTED_ENDPOINT_ENV not in done.stdout, done.stderr
    loaded = load_spec_text(textwrap.dedent(text), environ={HOSTED_ENDPOINT_ENV: "node1:29400"})
    assert loaded.rendezvous.endpoints == ("etcd.infra:2379",)


HOSTED = "name: h\nentrypoint: {script: train.py}\nnodes: 2\nrendezvous: {backend: etcd, hosted: true, endpoints: a:1}\n"
def reachable(host: str) -> bool:
    """Not an address no other node can reach (0.0.0.0, 0, [::]...: refused by the spec check, tested there)."""
    return not unspecified(host.strip("[]"))


hosts = st.from_regex(r"[A-Za-z0-9_.-]{1,40}|\[[0-9a-f:]{2,20}\]", fullmatch=True).filter(reachable)


@settings(max_examples=150, deadline=None)
@given(host=hosts, port=st.integers(1, 65535), pad=st.sampled_from(["", " "]))
def test_any_host_port_in_the_variable_becomes_the_endpoint(host: str, port: int, pad: str) -> None:
    """Every host:port the schema accepts is applied as it is (spaces around it dropped)."""
    spec = load_spec_text(HOSTED, environ={HOSTED_ENDPOINT_ENV: f"{pad}{host}:{port}{pad}"})
    assert spec.rendezvous.endpoints == (f"{host}:{port}",)


@settings(max_examples=300, deadline=None)
@given(value=st.text(max_size=400))
def test_any_value_of_the_variable_is_applied_or_refused_naming_it(value: str) -> None:
    """Any text: the spec loads with it, or a SpecError names the variable at rendezvous.endpoints; nothing else."""
    try:
        spec = load_spec_text(HOSTED, environ={HOSTED_ENDPOINT_ENV: value})
    except SpecError as err:
        assert endpoint_problem(value) is not None
        [found] = err.problems
        assert found.path == "rendezvous.endpoints" and HOSTED_ENDPOINT_ENV in found.message
        return
    assert spec.rendezvous.endpoints == ((value.strip(),) if value.strip() else ("a:1",))


# --- GPUs ------------------------------------------------------------------------------------------------------

GPU_BASE = "name: g\nentrypoint: {script: train.py}\nnproc_per_node: 8\n"


def gpus_of(tmp_path: Path, extra: str) -> tuple[str | None, Any, str]:
    """(the sbatch --gpus-per-node value, the pod's nvidia.com/gpu limit, stderr) for GPU_BASE + `extra`."""
    spec = write(tmp_path, GPU_BASE + textwrap.dedent(extra) + IMAGE)
    slurm, k8s = template("slurm", spec), template("kubernetes", spec)
    assert slurm.returncode == 0 and k8s.returncode == 0, slurm.stderr + k8s.stderr
    lines = [line.split("=", 1)[1] for line in slurm.stdout.splitlines() if line.startswith("#SBATCH --gpus-per-node=")]
    limits = agent_pod(k8s.stdout)["containers"][0].get("resources", {}).get("limits", {})
    return (lines[0] if lines else None), limits.get("nvidia.com/gpu"), slurm.stderr


@pytest.mark.parametrize(("nproc", "extra", "explicit", "gpus"), [
    ("8", "virtual_local_rank: true\n", None, 8),
    ("8", "env: {NCCL_DEBUG: INFO}\n", None, 8),
    ("8", "health: {gpus: 8}\n", None, 8),
    ("8", "virtual_local_rank: true\n", 16, 16),  # an explicit request wins when it covers the workers
    ("gpu", "", 4, 4),  # counted on the nodes: the explicit request says how many
    ("1", "replica_groups: {count: 2, nproc_per_node: 2}\nenv: {NCCL_DEBUG: INFO}\n", None, 4),  # both groups here
])
def test_a_gpu_job_asks_the_scheduler_for_its_gpus(tmp_path: Path, nproc: str, extra: str, explicit: int | None,
                                                   gpus: int) -> None:
    """nproc_per_node on a GPU job (or an explicit cluster.gpus_per_node) is `#SBATCH --gpus-per-node=N` and the
    pod's `nvidia.com/gpu: N` limit."""
    request = "" if explicit is None else f"gpus_per_node: {explicit}, "
    spec = write(tmp_path, f"name: g\nentrypoint: {{script: train.py}}\nnproc_per_node: {nproc}\n{extra}"
                 f'cluster: {{{request}kubernetes: {{image: "reg/train:1", namespace: ml}}}}\n')
    slurm, k8s = template("slurm", spec), template("kubernetes", spec)
    assert slurm.returncode == 0 and k8s.returncode == 0, slurm.stderr + k8s.stderr
    assert f"#SBATCH --gpus-per-node={gpus}\n" in slurm.stdout
    assert agent_pod(k8s.stdout)["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == gpus


def test_a_number_with_nothing_that_says_gpu_asks_for_none_and_says_how(tmp_path: Path) -> None:
    """nproc_per_node: 8 alone may be a CPU job: no request, and a note naming cluster.gpus_per_node."""
    slurm_gpus, k8s_gpus, err = gpus_of(tmp_path, "")
    assert slurm_gpus is None and k8s_gpus is None
    assert "set cluster.gpus_per_node: 8" in err


def test_an_explicit_zero_wins(tmp_path: Path) -> None:
    """cluster.gpus_per_node: 0 on a GPU job: no request (a cluster that gives the nodes' GPUs without one)."""
    spec = write(tmp_path, GPU_BASE + "virtual_local_rank: true\n"
                 'cluster: {gpus_per_node: 0, kubernetes: {image: "reg/train:1", namespace: ml}}\n')
    done = template("slurm", spec)
    assert done.returncode == 0 and "--gpus-per-node" not in done.stdout, done.stderr
    assert "cluster.gpus_per_node: 0 on a GPU job" in done.stderr


@pytest.mark.parametrize(("text", "says"), [
    ("name: g\nentrypoint: {script: train.py}\nnproc_per_node: gpu\n" + IMAGE, "nproc_per_node: gpu counts"),
    ("name: g\nentrypoint: {script: train.py}\nnproc_per_node: auto\nvirtual_local_rank: true\n" + IMAGE,
     "nproc_per_node: auto counts"),
    (GPU_BASE + "virtual_local_rank: true\n"
     'cluster: {gpus_per_node: 4, kubernetes: {image: "reg/train:1"}}\n', "fewer than the 8 workers per node"),
])
def test_what_the_spec_cannot_tell_or_contradicts_is_refused(tmp_path: Path, text: str, says: str) -> None:
    """Both templates exit 2 naming cluster.gpus_per_node and the fix; nothing on stdout."""
    spec = write(tmp_path, text)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # whatever this machine has
    for kind in ("slurm", "kubernetes"):
        done = runner("template", kind, spec.name, cwd=tmp_path, env=env)
        assert done.returncode == 2, done.stdout
        assert "cluster.gpus_per_node" in done.stderr and says in done.stderr, done.stderr
        assert "set cluster.gpus_per_node" in done.stderr
        assert done.stdout == ""


# --- the Kubernetes Secret -------------------------------------------------------------------------------------


def test_kubernetes_output_says_how_to_create_the_secret_and_never_holds_it(tmp_path: Path) -> None:
    """The stream starts with the exact commands (a comment: `kubectl apply -f` still takes it); the pod sets
    fsGroup, mounts the Secret 0440 and points RUNNER_SECRET_FILE at the agent's own copy."""
    spec = converted(tmp_path)
    done = template("kubernetes", spec)
    assert done.returncode == 0, done.stderr
    head = done.stdout.split("apiVersion", 1)[0]
    assert ("#   runner secret --new train-794e11.secret && kubectl create secret generic train-794e11-runner-secret "
            "--namespace ml --from-file=secret=train-794e11.secret\n") in head
    pod = agent_pod(done.stdout)
    assert pod["securityContext"] == {"fsGroup": SECRET_FS_GROUP}
    assert {"name": "runner-secret", "secret": {"secretName": "train-794e11-runner-secret", "defaultMode": 0o440}} \
        in pod["volumes"]
    assert env_of(pod)[SECRET_ENV] == f"{SECRET_COPY}/secret"
    assert "secret:" not in done.stdout.split("kind: Job", 1)[0].split("data:", 1)[-1].split("job.yaml")[0]
    own = spec.read_text().replace("hosted: true", "hosted: true\n  secret_file: /etc/s")
    spec.write_text(own)
    done = template("kubernetes", spec)
    assert "kubectl create secret" not in done.stdout and "fsGroup" not in done.stdout


def test_a_container_of_another_user_reads_the_mounted_secret(tmp_path: Path) -> None:
    """The mount as the kubelet leaves it (root-owned, group fsGroup, defaultMode 0440) and the container's own
    command, run as a user who is not root with fsGroup as a supplementary group: the agent's secret check accepts
    the copy. Before, the file was root's 0400, which that user cannot read at all."""
    need("needs root" if os.geteuid() != 0 else "needs setpriv (util-linux)" if shutil.which("setpriv") is None
         else None)
    done = template("kubernetes", converted(tmp_path))
    container = agent_pod(done.stdout)["containers"][0]
    base = Path(tempfile.mkdtemp(prefix="runner-k8s-secret-"))  # tmp_path is 0700: the other user could not reach it
    try:
        run_as_another_user(container, base)
    finally:
        shutil.rmtree(base)


def run_as_another_user(container: dict[str, Any], base: Path) -> None:
    """The container's command with its secret mount at `base`/mount, as uid 65534 with fsGroup."""
    from runner.errors import RendezvousError
    from runner.rendezvous.etcd.job_secret import SecretSource, new_secret_file, read_secret

    base.chmod(0o755)
    mount, copy = base / "mount", base / "copy"
    mount.mkdir()
    copy.mkdir(mode=0o777)
    copy.chmod(0o777)  # an emptyDir
    secret = mount / "secret"
    new_secret_file(secret)
    os.chown(secret, 0, SECRET_FS_GROUP)
    secret.chmod(0o440)
    argv = [arg.replace(SECRET_MOUNT, str(mount)) for arg in container["command"]]
    assert argv[:2] == ["sh", "-c"] and argv[4:6] == ["runner", "run"]
    argv = [*argv[:4], "cat", f"{copy}/secret"]  # the agent in its place: it reads the copy as that user
    env = {**os.environ, SECRET_ENV: str(copy / "secret")}
    user = ["setpriv", "--reuid=65534", "--regid=65534", f"--groups={SECRET_FS_GROUP}"]
    ran = subprocess.run([*user, *argv], env=env, capture_output=True, text=True, check=False, timeout=60)
    assert ran.returncode == 0 and ran.stdout == secret.read_text(), ran.stderr
    info = (copy / "secret").stat()
    assert info.st_uid == 65534 and info.st_mode & 0o777 == 0o600
    assert len(read_secret(SecretSource(str(copy / "secret"), SECRET_ENV))) == 32  # the agent's check accepts it
    with pytest.raises(RendezvousError, match="can be read by others"):  # the mount itself is refused
        read_secret(SecretSource(str(secret), SECRET_ENV))
    secret.chmod(0o400)  # the old mount: root's alone, mode 0400
    os.chown(secret, 0, 0)
    (copy / "secret").unlink()
    ran = subprocess.run([*user, *argv], env=env, capture_output=True, text=True, check=False, timeout=60)
    assert ran.returncode != 0 and "Permission denied" in ran.stderr
