"""`runner template`: Kubernetes manifests validate against the official schemas (offline), the sbatch script
encodes the spec's fault-tolerance settings, and the rendered examples under examples/templates/ are in sync."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from runner.config.clusters.common import ETCD_ENV, load_for_template
from runner.config.clusters.render import render
from runner.errors import SpecError

ROOT = Path(__file__).resolve().parents[1]
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
    spec, source = load_for_template(str(spec_file))
    return render(kind, spec, str(spec_file), source)


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
    text = rendered("slurm", tmp_path, 'nodes: "2:4"\nrendezvous: {backend: etcd}\n')
    assert "#SBATCH --nodes=2-4\n" in text and "#SBATCH --no-kill\n" in text
    assert "--kill-on-bad-exit=0" in text


@pytest.mark.parametrize(("spec", "kind", "name"), RENDERED, ids=[r[2] for r in RENDERED])
def test_checked_in_examples_match_the_renderer(spec: str, kind: str, name: str) -> None:
    """examples/templates/ holds exactly what `runner template` prints for the example specs (run from the repo
    root); regenerate with the commands in docs/clusters.md."""
    done = subprocess.run([sys.executable, "-m", "runner", "template", kind, spec], cwd=ROOT,
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
