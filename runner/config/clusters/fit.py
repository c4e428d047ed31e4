"""What a template changes, or refuses, so that the job runs as rendered on the allocation (docs/clusters.md).

- A hosted rendezvous on a fixed host (`runner convert` of `torchrun --rdzv-endpoint 192.0.2.2:29400` writes one):
  no node of the allocation may have that address, so every node would wait join_timeout for it. The template
  replaces it with the allocation's first node: it sets HOSTED_ENDPOINT_ENV on every node, which the loader puts in
  place of rendezvous.endpoints (runner/config/hosted_endpoint.py), and says so on stderr.
- GPUs: what the scheduler is asked for per node. An explicit `cluster.gpus_per_node` wins (fewer than a GPU job's
  workers per node is refused); else a GPU job (see `gpu_signal`) asks for its workers per node; `nproc_per_node:
  gpu` without `cluster.gpus_per_node` is refused (its count is known only on the nodes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runner.config.cluster_checks import classify, endpoint_host
from runner.config.clusters.common import FIRST_NODE_PLACEHOLDER
from runner.config.spec import JobSpec
from runner.config.yaml_source import Document
from runner.contract import HOSTED_ENDPOINT_ENV
from runner.errors import SpecError, SpecProblem

GPU_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_")  # a spec that tunes NCCL runs on GPUs


@dataclass(frozen=True)
class Fit:
    """The template's changes: the GPU request, the hosted endpoint's port when its host is replaced, and notes."""

    gpus_per_node: int = 0
    hosted_port: int | None = None  # set: the nodes get HOSTED_ENDPOINT_ENV = <first node>:<this port>
    notes: tuple[str, ...] = field(default=())


def refuse(source: str, doc: Document | None, message: str, fix: str) -> SpecError:
    """A SpecError naming cluster.gpus_per_node (at its line, or its section's, when the document is known)."""
    path = ("cluster", "gpus_per_node")
    found = doc.problem(path, message, fix) if doc is not None else SpecProblem(".".join(path), message, fix)
    return SpecError(source, [found])


def _data(doc: Document | None) -> dict[str, Any]:
    return doc.data if doc is not None and isinstance(doc.data, dict) else {}


def gpu_signal(spec: JobSpec, doc: Document | None) -> str | None:
    """What in the spec says its workers use GPUs (None: nothing does)."""
    data = _data(doc)
    if data.get("nproc_per_node") == "gpu":
        return "nproc_per_node: gpu"
    if spec.virtual_local_rank:
        return "virtual_local_rank: true (each worker sees its own GPU)"
    health = data.get("health")
    gpus = health.get("gpus") if isinstance(health, dict) else None
    if isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > 0:
        return f"health.gpus: {gpus}"
    tuned = sorted(name for name, _ in spec.env if name.startswith(GPU_ENV_PREFIXES))
    if tuned:
        return f"env {tuned[0]} (NCCL runs on GPUs)"
    return None


def gpus_per_node(spec: JobSpec, doc: Document | None, source: str, notes: list[str]) -> int:
    """GPUs per node to ask the scheduler for (0: none); notes added to `notes`.

    A SpecError naming cluster.gpus_per_node when the spec cannot tell, or when the explicit value is fewer than a
    GPU job's workers per node.
    """
    data = _data(doc)
    cluster = data.get("cluster")
    explicit = isinstance(cluster, dict) and "gpus_per_node" in cluster if doc is not None \
        else spec.cluster.gpus_per_node > 0
    raw = data.get("nproc_per_node", spec.nproc_per_node)
    counted = isinstance(raw, str) and spec.replica_groups is None  # auto|gpu|xpu|cpu: known on each node only
    workers = spec.workers_per_node
    why = gpu_signal(spec, doc)
    requested = spec.cluster.gpus_per_node
    if explicit:
        if why and not counted and 0 < requested < workers:
            raise refuse(source, doc,
                         f"cluster.gpus_per_node is {requested}, fewer than the {workers} workers per node of a GPU "
                         f"job ({why}): each worker needs a GPU of its own",
                         f"set cluster.gpus_per_node: {workers}, or run {requested} workers per node")
        if why and requested == 0:
            notes.append(f"cluster.gpus_per_node: 0 on a GPU job ({why}): the template asks the scheduler for no "
                         "GPU (right where the nodes' GPUs come without one)")
        return requested
    if raw == "cpu" or (why is None and raw != "gpu"):
        if raw == "auto":
            notes.append("nproc_per_node: auto counts each node's GPUs (else its CPUs), but the template asks the "
                         "scheduler for no GPU: on a cluster that allocates GPUs, set cluster.gpus_per_node")
        elif raw == "xpu":
            notes.append("nproc_per_node: xpu: the template asks for no Intel GPU; add the request with "
                         "cluster.slurm.sbatch_args (Slurm) or your device plugin's resource (Kubernetes)")
        elif not counted:
            notes.append(f"nproc_per_node: {workers} and nothing in the spec says the workers use GPUs: the template "
                         f"asks for none; for a GPU job set cluster.gpus_per_node: {workers}")
        return 0
    if counted:
        what = "nproc_per_node: gpu counts" if raw == "gpu" else f"a GPU job ({why}) whose nproc_per_node: {raw} counts"
        raise refuse(source, doc,
                     f"{what} each node's devices when it runs, but the scheduler must be told now how many GPUs to "
                     "give each node",
                     "set cluster.gpus_per_node to the GPUs of each node (e.g. 8), or write nproc_per_node as a number")
    notes.append(f"asking the scheduler for {workers} GPU(s) per node: the {workers} workers per node of a GPU job "
                 f"({why}); set cluster.gpus_per_node to ask for another number")
    return workers


def fixed_hosted_port(spec: JobSpec, doc: Document | None, first_node: str | None = None) -> int | None:
    """The port of a hosted rendezvous whose endpoint names a fixed host (None: nothing to replace).

    Not replaced: the templates' own first node (${RUNNER_FIRST_NODE}, or `first_node`), an endpoint written with a
    ${VAR} (the nodes resolve it), and a loopback one (cluster_checks refuses it on several nodes; one node is fine).
    """
    rdzv = spec.rendezvous
    if not rdzv.hosted or rdzv.backend != "etcd" or not rdzv.endpoints:
        return None
    first = rdzv.endpoints[0]
    host = endpoint_host(first)
    if host in (FIRST_NODE_PLACEHOLDER, first_node):
        return None
    if doc is not None and any(path[:2] == ("rendezvous", "endpoints") for path in doc.variables):
        return None
    if classify(first, lambda _: ()).this_machine_only:
        return None
    return int(first.rpartition(":")[2])


def hosted_note(spec: JobSpec, port: int, where: str) -> str:
    """What the template says when it replaces the hosted endpoint's fixed host."""
    fixed = ", ".join(spec.rendezvous.endpoints)
    return (f"rendezvous.endpoints: {fixed} names a fixed host, which the allocation may not have (every node would "
            f"wait join_timeout for it): the job's nodes use the allocation's first node instead ({HOSTED_ENDPOINT_ENV}"
            f'={where}:{port}, set by the template); write "${{RUNNER_FIRST_NODE}}:{port}" in the spec to say so '
            "there")


def fit(kind: str, spec: JobSpec, doc: Document | None, source: str, first_node: str | None = None) -> Fit:
    """The template's changes for `spec` (a SpecError for what it must refuse)."""
    notes: list[str] = []
    gpus = gpus_per_node(spec, doc, source, notes)
    port = fixed_hosted_port(spec, doc, first_node)
    if port is not None:
        where = "${RUNNER_FIRST_NODE}" if kind == "slurm" else (first_node or "pod 0")
        notes.insert(0, hosted_note(spec, port, where))
    return Fit(gpus_per_node=gpus, hosted_port=port, notes=tuple(notes))
