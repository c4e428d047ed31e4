"""Cluster templates rendered from the same job spec: `runner template slurm|kubernetes job.yaml`.

The sbatch script comes from a Jinja2 template (runner/config/clusters/templates/); Kubernetes manifests are built as
dicts and dumped with yaml.safe_dump. Both are pure functions of the spec and the spec's path as given.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from runner.config.spec import JobSpec
from runner.config.yaml_source import Document
from runner.contract import HOSTED_ENDPOINT_ENV, HOSTED_NODES_ENV
from runner.errors import SpecError, SpecProblem

TEMPLATES = Path(__file__).with_name("templates")
ETCD_ENV = "RUNNER_ETCD_ENDPOINTS"  # set by a template that starts etcd (cluster.etcd: start)
ETCD_PLACEHOLDER = "runner-etcd.invalid:2379"  # its value while the spec is loaded to render a template
# The allocation's first node, set by both templates on every node (Slurm: the first host of SLURM_JOB_NODELIST, the
# one that runs the batch script; Kubernetes: pod 0's name under the headless Service): a hosted rendezvous on it is
# `endpoints: ["${RUNNER_FIRST_NODE}:29400"]`, with no host name in the spec (docs/clusters.md).
FIRST_NODE_ENV = "RUNNER_FIRST_NODE"
FIRST_NODE_PLACEHOLDER = "runner-first-node.invalid"  # its value while the spec is loaded to render a template
# The allocation's first rendezvous.hosted_members nodes (host names, comma-separated), set by both templates for a
# hosted rendezvous: the hosts its etcd's members run on, where a node that starts after the first node was lost
# finds them (runner.rendezvous.etcd.hosted reads it; docs/clusters.md).
MEMBER_NODES_ENV = HOSTED_NODES_ENV


def member_count(spec: JobSpec) -> int:
    """How many hosts a hosted rendezvous's etcd members may run on: hosted_members, at most nodes.max, odd."""
    count = min(spec.rendezvous.hosted_members, spec.nodes.max)
    return max(1, count if count % 2 else count - 1)


def environment() -> Any:
    """A Jinja2 environment for shell templates: strict undefined, `q` = shell quoting."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,  # noqa: S701 - shell scripts, not HTML: values are quoted with the `q` filter
    )
    env.filters["q"] = shlex.quote
    return env


def problem(source: str, path: str, message: str, fix: str) -> SpecError:
    """A SpecError naming one field (the CLI prints it with the fix and exits 2)."""
    return SpecError(source, [SpecProblem(path, message, fix)])


def check_etcd(spec: JobSpec, source: str) -> None:
    """Multi-node needs etcd; cluster.etcd: start needs the spec to read the address the template exports."""
    if spec.nodes.max > 1 and spec.rendezvous.backend != "etcd":
        raise problem(source, "rendezvous.backend", "a multi-node job needs the etcd backend",
                      "set rendezvous.backend: etcd")
    if spec.cluster.etcd != "start":
        return
    if spec.rendezvous.backend != "etcd" or ETCD_PLACEHOLDER not in spec.rendezvous.endpoints:
        raise problem(source, "rendezvous.endpoints",
                      f"cluster.etcd is start, but the spec does not read the etcd address from ${{{ETCD_ENV}}}",
                      f"set rendezvous.backend: etcd and rendezvous.endpoints: ${{{ETCD_ENV}}}")


def load_for_template(path: str) -> tuple[JobSpec, Document, str]:
    """Load the spec at `path` as the nodes will: the spec, its parsed document and its text.

    ${RUNNER_ETCD_ENDPOINTS} and ${RUNNER_FIRST_NODE} stand for what the template sets on the nodes, and devices
    (`nproc_per_node: gpu`) are counted there, not on this machine (a login node may have none).
    """
    import os

    from runner.config.loader import load_spec_document

    environ = {ETCD_ENV: ETCD_PLACEHOLDER, FIRST_NODE_ENV: FIRST_NODE_PLACEHOLDER, **os.environ}
    environ.pop(HOSTED_ENDPOINT_ENV, None)  # the nodes' own (a template sets it): the spec is rendered as written
    spec, doc = load_spec_document(path, environ=environ, devices_here=False)
    return spec, doc, Path(path).read_text(encoding="utf-8")


# A hosted rendezvous's secret (docs/security.md): the template provides it when the spec does not name one.
SECRET_MOUNT = "/etc/runner-secret"  # noqa: S105 - a folder. Kubernetes: the Secret's folder in each pod (key `secret`)
# Kubernetes mounts a Secret's files owned by root, group fsGroup when the pod sets one (mode defaultMode | 0440): a
# container running as another user reads it through that group only, and the runner refuses a secret its group can
# read. So the pod sets fsGroup (a supplementary group of its containers' user, whoever that is), and the container
# copies the secret to a file of its own user, mode 0600, in a memory volume before it starts the agent.
SECRET_FS_GROUP = 2000
SECRET_COPY = "/var/run/runner-secret"  # noqa: S105 - a folder: the memory volume holding the agent's copy


def provides_secret(spec: JobSpec) -> bool:
    """Whether the template must give the agents the job's secret: a hosted job for several nodes, no secret_file."""
    rdzv = spec.rendezvous
    return rdzv.hosted and spec.nodes.max > 1 and rdzv.secret_file is None


def secret_name(job: str) -> str:
    """The Kubernetes Secret holding a job's secret (made by `kubectl create secret generic`, docs/clusters.md)."""
    return f"{job}-runner-secret"


def secret_commands(job: str, namespace: str) -> str:
    """The commands that make a Kubernetes job's Secret: a new secret file, then the Secret from it (not its value)."""
    name = secret_name(job)
    return (f"runner secret --new {job}.secret && kubectl create secret generic {name} --namespace {namespace} "
            f"--from-file=secret={job}.secret")
