"""`runner template`: Kubernetes manifests validate against the official schemas (offline), the sbatch script
encodes the spec's fault-tolerance settings, and the rendered examples under examples/templates/ are in sync."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from conftest import RUNNER

from runner.config.clusters.common import ETCD_ENV
from runner.config.clusters.render import render_file
from runner.errors import SpecError

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "examples" / "templates"
K8S_VERSION = "1.33.0"
# (spec, kind, checked-in file): paths relative to the repo root, as the commands in docs/clusters.md write them
RENDERED = [
    ("examples/jobs/hello.yaml", "slurm", "hello.sbatch"),
    ("examples/templates/ddp_cluster.yaml", "slurm", "ddp_cluster.sbatch"),
    ("examples/templates/ddp_cluster.yaml", "kubernetes", "ddp_cluster.k8s.yaml"),
]
BASE = """\
name: train_job.v2
entrypoint: {script: train.py, args: ["--lr", "0.1"]}
nproc_per_node: 4
shutdown: {grace_period: 45s}
"""


def rendered(kind: str, tmp_path: Path, extra: str) -> str:
    """Render BASE + `extra` (a spec written to tmp_path) with the same path handling as the CLI."""
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(BASE + textwrap.dedent(extra))
    return render_file(kind, str(spec_file))


def k8s_docs(tmp_path: Path, extra: str) -> list[dict[str, Any]]:
    """Manifests for BASE + `extra`, each validated against the Kubernetes schemas (strict: no unknown fields)."""
    docs = list(yaml.safe_load_all(rendered("kubernetes", tmp_path, extra)))
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The documents of one kind."""
    return [d for d in docs if d["kind"] == kind]


def test_kubernetes_manifests_validate_and_carry_the_spec(tmp_path: Path) -> None:
    """External etcd: ConfigMap with the spec verbatim, headless Service, Indexed Job; grace period and GPUs."""
    docs = k8s_docs(tmp_path, """\
        nodes: 4
        rendezvous: {backend: etcd, endpoints: "etcd.infra:2379"}
        restart: {max_restarts: 5}
        cluster:
          gpus_per_node: 4
          kubernetes: {image: "reg/train:1", namespace: ml, cpu: "16", memory: 64Gi}
        """)
    assert [d["kind"] for d in docs] == ["ConfigMap", "Service", "Job"]
    job = by_kind(docs, "Job")[0]
    assert job["metadata"]["name"] == "train-job-v2" and job["metadata"]["namespace"] == "ml"
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 4
    assert job["spec"]["backoffLimit"] == 5
    pod = job["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 45 + 15
    assert pod["subdomain"] == by_kind(docs, "Service")[0]["metadata"]["name"]
    container = pod["containers"][0]
    assert container["resources"]["limits"] == {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": 4}
    assert "node$(JOB_COMPLETION_INDEX)" in container["command"]
    assert container["volumeMounts"][0]["mountPath"] == "/workspace/job.yaml"
    assert yaml.safe_load(by_kind(docs, "ConfigMap")[0]["data"]["job.yaml"])["name"] == "train_job.v2"
    assert not any(e["name"] == ETCD_ENV for e in container["env"])


def test_kubernetes_started_etcd_is_a_statefulset_the_agents_point_at(tmp_path: Path) -> None:
    """cluster.etcd: start adds an etcd StatefulSet + Service, and the agents get its address in the env."""
    docs = k8s_docs(tmp_path, """\
        nodes: "2:4"
        rendezvous: {backend: etcd, endpoints: "${RUNNER_ETCD_ENDPOINTS}"}
        cluster: {etcd: start, kubernetes: {image: "reg/train:1"}}
        """)
    assert [d["kind"] for d in docs] == ["ConfigMap", "Service", "StatefulSet", "Service", "Job"]
    env = by_kind(docs, "Job")[0]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": ETCD_ENV, "value": "train-job-v2-etcd.default.svc:2379"} in env
    assert by_kind(docs, "Job")[0]["spec"]["parallelism"] == 4


@pytest.mark.parametrize(
    ("kind", "extra", "field"),
    [
        ("kubernetes", "", "cluster.kubernetes.image"),
        ("kubernetes", "cluster: {etcd: start, kubernetes: {image: x}}\nrendezvous: {backend: etcd}\n",
         "rendezvous.endpoints"),
        ("slurm", "cluster: {etcd: start}\nrendezvous: {backend: etcd, endpoints: 'h:2379'}\n", "rendezvous.endpoints"),
        ("slurm", "cluster: {slurm: {signal_lead: 30s}}\n", "cluster.slurm.signal_lead"),
    ],
)
def test_settings_that_cannot_work_name_the_field(tmp_path: Path, kind: str, extra: str, field: str) -> None:
    """A template that could not work is refused with a problem naming the field to change."""
    with pytest.raises(SpecError) as err:
        rendered(kind, tmp_path, extra)
    assert err.value.problems[0].path == field


def test_sbatch_script_encodes_the_fault_tolerance_settings(tmp_path: Path) -> None:
    """Nodes, time limit, signal lead, requeue, kill-on-bad-exit and extra lines come from the spec."""
    text = rendered("slurm", tmp_path, """\
        nodes: 8
        rendezvous: {backend: etcd, endpoints: "head:2379"}
        cluster:
          gpus_per_node: 4
          slurm: {partition: gpu, account: ml, time_limit: 1h30m, signal_lead: 5m, requeue: false,
                  sbatch_args: ["--exclusive"]}
        """)
    for line in ("--nodes=8", "--gpus-per-node=4", "--partition=gpu", "--account=ml", "--time=0-01:30:00",
                 "--signal=B:USR1@300", "--no-requeue", "--exclusive"):
        assert f"#SBATCH {line}\n" in text
    assert "--kill-on-bad-exit=1" in text and "--no-kill" not in text
    assert "requeue_now=0" in text
    assert subprocess.run(["bash", "-n"], input=text, text=True, check=False).returncode == 0


def test_elastic_sbatch_keeps_the_allocation_when_a_node_fails(tmp_path: Path) -> None:
    """MIN:MAX nodes: --no-kill and --kill-on-bad-exit=0, so the other agents re-rendezvous."""
    text = rendered("slurm", tmp_path, 'nodes: "2:4"\nrendezvous: {backend: etcd, endpoints: "etcd.infra:2379"}\n')
    assert "#SBATCH --nodes=2-4\n" in text and "#SBATCH --no-kill\n" in text
    assert "--kill-on-bad-exit=0 --no-kill ${RUNNER} run" in text  # else Slurm ends the step with a lost node


def test_hosted_rendezvous_on_the_first_node_renders_for_both(tmp_path: Path) -> None:
    """endpoints: ${RUNNER_FIRST_NODE}:29400 names no host: the sbatch script sets it from the allocation (the
    first host of SLURM_JOB_NODELIST), the manifests to pod 0's name under the headless Service."""
    extra = """\
    nodes: 3
    rendezvous: {backend: etcd, hosted: true, endpoints: ["${RUNNER_FIRST_NODE}:29400"]}
    cluster: {kubernetes: {image: "reg/train:1", namespace: ml}}
    """
    text = rendered("slurm", tmp_path, extra)
    assert 'export RUNNER_FIRST_NODE="$(scontrol show hostnames "${SLURM_JOB_NODELIST}" | head -n 1)"' in text
    job = by_kind(k8s_docs(tmp_path, extra), "Job")[0]
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RUNNER_FIRST_NODE"] == "train-job-v2-0.train-job-v2.ml.svc"


def test_hosted_rendezvous_gets_the_jobs_secret_from_both_templates(tmp_path: Path) -> None:
    """A hosted job for several nodes: the sbatch script makes a secret per job id (kept across requeues, mode 0600)
    and exports RUNNER_SECRET_FILE before srun; each pod mounts the job's Secret (0440, group fsGroup) and points the
    variable at the agent's copy of it. A spec naming rendezvous.secret_file gets neither."""
    extra = """\
    nodes: 3
    rendezvous: {backend: etcd, hosted: true, endpoints: ["${RUNNER_FIRST_NODE}:29400"]}
    cluster: {kubernetes: {image: "reg/train:1", namespace: ml}}
    """
    text = rendered("slurm", tmp_path, extra)
    made = 'export RUNNER_SECRET_FILE="${SLURM_SUBMIT_DIR}/.runner-secret-${SLURM_JOB_ID}"'
    assert made in text and '${RUNNER} secret --new "${RUNNER_SECRET_FILE}"' in text
    assert text.index(made) < text.index("${RUNNER} run")
    assert 'if [ ! -e "${RUNNER_SECRET_FILE}" ]' in text  # a requeue keeps the job id, and so the secret
    pod = by_kind(k8s_docs(tmp_path, extra), "Job")[0]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["RUNNER_SECRET_FILE"] == "/var/run/runner-secret/secret"  # the agent's own copy (test_template_fit.py)
    assert {"name": "runner-secret", "mountPath": "/etc/runner-secret", "readOnly": True} in container["volumeMounts"]
    assert {"name": "runner-secret", "secret": {"secretName": "train-job-v2-runner-secret", "defaultMode": 0o440}} \
        in pod["volumes"]
    own = extra.replace("hosted: true,", "hosted: true, secret_file: /etc/s,")
    assert "RUNNER_SECRET_FILE" not in rendered("slurm", tmp_path, own)
    assert "RUNNER_SECRET_FILE" not in json.dumps(k8s_docs(tmp_path, own))


@pytest.mark.parametrize("kind", ["slurm", "kubernetes"])
@pytest.mark.parametrize("endpoint", ["127.0.0.1:29400", "localhost:29400", "[::1]:29400", "0.0.0.0:2379"])
def test_loopback_endpoint_with_several_nodes_is_refused(tmp_path: Path, kind: str, endpoint: str) -> None:
    """A loopback endpoint is every machine's own: with nodes > 1 both templates refuse it, naming the field and
    the first-node form; the CLI exits 2."""
    hosted = "true" if not endpoint.startswith("0.0.0.0") else "false"
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(BASE + textwrap.dedent(f"""\
        nodes: "1:2"
        rendezvous: {{backend: etcd, hosted: {hosted}, endpoints: ["{endpoint}"]}}
        cluster: {{kubernetes: {{image: "reg/train:1"}}}}
        """))
    done = subprocess.run([*RUNNER, "template", kind, str(spec_file)], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 2, done.stdout
    assert "rendezvous.endpoints" in done.stderr and "RUNNER_FIRST_NODE" in done.stderr
    assert "nodes allows 2 nodes" in done.stderr
    assert done.stdout == ""


def test_one_node_on_loopback_renders(tmp_path: Path) -> None:
    """nodes: 1 on a loopback etcd is fine anywhere: no refusal."""
    assert "#SBATCH --nodes=1" in rendered("slurm", tmp_path, 'rendezvous: {backend: etcd, endpoints: "127.0.0.1:2379"}\n')


def test_kubernetes_refuses_absolute_cwd_and_script(tmp_path: Path) -> None:
    """An absolute cwd or script of the rendering machine does not exist in the pod (it works in /workspace)."""
    with pytest.raises(SpecError) as err:
        rendered("kubernetes", tmp_path, f"""\
        cwd: {tmp_path}
        cluster: {{kubernetes: {{image: "reg/train:1"}}}}
        """)
    assert [p.path for p in err.value.problems] == ["cwd"]
    assert "relative to the spec file's folder" in err.value.problems[0].fix
    spec_file = tmp_path / "abs.yaml"
    spec_file.write_text(f"name: abs\nentrypoint: {{script: {tmp_path}/train.py}}\n"
                         'cluster: {kubernetes: {image: "reg/train:1"}}\n')
    with pytest.raises(SpecError) as err:
        render_file("kubernetes", str(spec_file))
    assert [p.path for p in err.value.problems] == ["entrypoint.script"]
    assert "#SBATCH" in render_file("slurm", str(spec_file))  # Slurm's nodes share the file system: no refusal


def test_gpu_per_node_renders_without_a_gpu(tmp_path: Path) -> None:
    """nproc_per_node: gpu on a machine without one (a login node): counted on each node, so both templates render
    (with the GPUs to ask for in cluster.gpus_per_node); `runner validate` says so as a warning."""
    extra = """\
    cluster: {gpus_per_node: 4, kubernetes: {image: "reg/train:1"}}
    """
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(BASE.replace("nproc_per_node: 4", "nproc_per_node: gpu") + textwrap.dedent(extra))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU visible, whatever this machine has
    for kind in ("slurm", "kubernetes"):
        done = subprocess.run([*RUNNER, "template", kind, str(spec_file)],
                              capture_output=True, text=True, check=False, env=env)
        assert done.returncode == 0, done.stderr
    done = subprocess.run([*RUNNER, "validate", str(spec_file)], capture_output=True,
                          text=True, check=False, env=env)
    assert done.returncode == 0, done.stderr
    assert "warning: nproc_per_node: nproc_per_node: gpu but no GPU is visible" in done.stderr


@pytest.mark.parametrize(("spec", "kind", "name"), RENDERED, ids=[r[2] for r in RENDERED])
def test_checked_in_examples_match_the_renderer(spec: str, kind: str, name: str) -> None:
    """examples/templates/ holds exactly what `runner template` prints for the example specs (run from the repo
    root); regenerate with the commands in docs/clusters.md."""
    done = subprocess.run([*RUNNER, "template", kind, spec], cwd=ROOT,
                          capture_output=True, text=True, check=False, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert (TEMPLATES / name).read_text() == done.stdout


def test_replica_groups_render_for_both_clusters(tmp_path: Path) -> None:
    """A spec with replica groups renders as any one-node job: the groups live inside the one agent per node."""
    extra = """\
    replica_groups: {count: 4, nproc_per_node: 2, min_active: 2}
    cluster: {kubernetes: {image: "example.com/train:1"}, gpus_per_node: 8}
    """
    docs = k8s_docs(tmp_path, extra)  # schema-valid (strict)
    config = by_kind(docs, "ConfigMap")[0]
    assert "replica_groups: {count: 4, nproc_per_node: 2, min_active: 2}" in next(iter(config["data"].values()))
    script = rendered("slurm", tmp_path, extra)
    assert "#SBATCH --nodes=1" in script


def test_replica_groups_on_several_nodes_render_one_agent_per_node(tmp_path: Path) -> None:
    """Groups over etcd: nodes = count x nodes_per_group agents, one per node/pod; the manifests stay schema-valid."""
    extra = """\
    nodes: 4
    rendezvous: {backend: etcd, endpoints: ["etcd.example:2379"]}
    replica_groups: {count: 2, nodes_per_group: 2, nproc_per_node: 8}
    cluster: {kubernetes: {image: "example.com/train:1"}, gpus_per_node: 8}
    """
    docs = k8s_docs(tmp_path, extra)
    [indexed] = [d for d in docs if d["kind"] == "Job"]
    assert indexed["spec"]["completions"] == indexed["spec"]["parallelism"] == 4
    script = rendered("slurm", tmp_path, extra)
    assert "#SBATCH --nodes=4" in script and "#SBATCH --ntasks-per-node=1" in script


def test_every_refusal_of_a_template_comes_at_once(tmp_path: Path) -> None:
    """A converted torchrun job (`runner convert`: absolute cwd, no image) rendered for Kubernetes: the missing
    image and the absolute cwd in one refusal, not one, then the other after the first fix; with them a GPU request
    the spec cannot tell (nproc_per_node: gpu, no cluster.gpus_per_node), which a later stage used to raise alone."""
    spec_file = tmp_path / "converted.yaml"
    spec_file.write_text(f"name: conv\nentrypoint: {{script: train.py}}\ncwd: {tmp_path}\nnodes: 2\n"
                         "nproc_per_node: gpu\nrendezvous: {backend: etcd, endpoints: [etcd.example:2379]}\n")
    with pytest.raises(SpecError) as err:
        render_file("kubernetes", str(spec_file))
    assert sorted(p.path for p in err.value.problems) == [
        "cluster.gpus_per_node", "cluster.kubernetes.image", "cwd"], err.value.problems
