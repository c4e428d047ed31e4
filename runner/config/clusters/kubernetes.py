"""`runner template kubernetes job.yaml`: manifests built as dicts and dumped with yaml.safe_dump_all.

Objects: the job.yaml in a ConfigMap; a headless Service; the agents as an Indexed Job (node id = pod index);
with cluster.etcd: start, an etcd StatefulSet and its Service.
"""

from __future__ import annotations

import math
import re
from pathlib import PurePosixPath

import yaml

from runner.config.clusters.common import (
    ETCD_ENV,
    FIRST_NODE_ENV,
    MEMBER_NODES_ENV,
    SECRET_COPY,
    SECRET_FS_GROUP,
    SECRET_MOUNT,
    check_etcd,
    member_count,
    problem,
    provides_secret,
    secret_commands,
    secret_name,
)
from runner.config.clusters.fit import Fit, fit
from runner.config.spec import JobSpec
from runner.contract import HOSTED_ENDPOINT_ENV, SECRET_ENV
from runner.errors import EXIT_SPEC, EXIT_WORKERS_FAILED

AGENT_GRACE_MARGIN = 15  # seconds beyond shutdown.grace_period for the agent to report and exit
EXIT_GAVE_UP = (EXIT_WORKERS_FAILED, EXIT_SPEC)  # the restart policy gave up, or a bad spec: no pod retry


def dns_name(name: str) -> str:
    """A job name as a DNS-1123 label (lowercase, '-')."""
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:52] or "runner"


def labels(spec: JobSpec, role: str) -> dict[str, str]:
    """Labels shared by every object; `role` is agent or etcd."""
    return {"app.kubernetes.io/name": "runner", "app.kubernetes.io/instance": dns_name(spec.name),
            "runner/role": role}


def meta(spec: JobSpec, name: str, role: str) -> dict[str, object]:
    """Metadata of one object."""
    return {"name": name, "namespace": spec.cluster.kubernetes.namespace, "labels": labels(spec, role)}


def mount_path(spec: JobSpec, spec_path: str) -> str:
    """Where the job.yaml sits in the pod: WORKDIR/<path as given> when relative, so relative paths keep working."""
    path = PurePosixPath(spec_path)
    rel = path.name if path.is_absolute() or ".." in path.parts else str(path)
    return str(PurePosixPath(spec.cluster.kubernetes.workdir) / rel)


def etcd_endpoint(spec: JobSpec) -> str:
    """host:port of the etcd the manifests start."""
    k8s = spec.cluster.kubernetes
    return f"{dns_name(spec.name)}-etcd.{k8s.namespace}.svc:{spec.cluster.etcd_port}"


def first_node(spec: JobSpec, index: int = 0) -> str:
    """Pod `index`'s DNS name (an Indexed Job's pod is named <job>-<index>, under the headless Service <job>)."""
    name = dns_name(spec.name)
    return f"{name}-{index}.{name}.{spec.cluster.kubernetes.namespace}.svc"


def member_nodes(spec: JobSpec) -> str:
    """The stable names of the first pods, as many as the hosted etcd's members (comma-separated)."""
    return ",".join(first_node(spec, i) for i in range(member_count(spec)))


def config_map(spec: JobSpec, spec_text: str) -> dict[str, object]:
    """The job spec file, verbatim."""
    name = dns_name(spec.name)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(spec, f"{name}-spec", "agent"),
            "data": {"job.yaml": spec_text}}


def headless_service(spec: JobSpec, name: str, role: str, port: int | None) -> dict[str, object]:
    """A headless Service: stable DNS names for the pods of `role`."""
    body: dict[str, object] = {"clusterIP": "None", "selector": labels(spec, role)}
    if port is not None:
        body["ports"] = [{"name": "client", "port": port, "targetPort": port}]
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta(spec, name, role), "spec": body}


def resources(spec: JobSpec, gpus: int) -> dict[str, object]:
    """Requests = limits (CPU, memory) and `gpus` per node."""
    k8s, amounts = spec.cluster.kubernetes, {}
    if k8s.cpu:
        amounts["cpu"] = k8s.cpu
    if k8s.memory:
        amounts["memory"] = k8s.memory
    limits: dict[str, object] = dict(amounts)
    if gpus:
        limits["nvidia.com/gpu"] = gpus
    return {"requests": amounts, "limits": limits} if limits else {}


def agent_container(spec: JobSpec, spec_path: str, fitted: Fit | None = None) -> dict[str, object]:
    """The runner agent: node id from the pod index, advertised at the pod IP (`fitted`: None = from `spec`)."""
    fitted = fitted or fit("kubernetes", spec, None, spec_path, first_node(spec))
    k8s, path = spec.cluster.kubernetes, mount_path(spec, spec_path)
    env = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
           {"name": FIRST_NODE_ENV, "value": first_node(spec)}]
    if spec.rendezvous.hosted:
        env.append({"name": MEMBER_NODES_ENV, "value": member_nodes(spec)})
    if spec.cluster.etcd == "start":
        env.append({"name": ETCD_ENV, "value": etcd_endpoint(spec)})
    if fitted.hosted_port is not None:  # a fixed host in rendezvous.endpoints: pod 0 hosts instead (fit.py)
        env.append({"name": HOSTED_ENDPOINT_ENV, "value": f"{first_node(spec)}:{fitted.hosted_port}"})
    mounts: list[dict[str, object]] = [{"name": "spec", "mountPath": path, "subPath": "job.yaml", "readOnly": True},
                                       {"name": "dshm", "mountPath": "/dev/shm"}]  # noqa: S108 - a memory volume for NCCL
    command = ["runner", "run", path, "--node", "node$(JOB_COMPLETION_INDEX)", "--advertise-addr", "$(POD_IP)"]
    container: dict[str, object] = {
        "name": "runner",
        "image": k8s.image,
        "workingDir": k8s.workdir,
        "command": command,
        "env": env,
        "volumeMounts": mounts,
    }
    if provides_secret(spec):  # the hosted rendezvous's secret, from the job's Secret (docs/security.md)
        env.append({"name": SECRET_ENV, "value": f"{SECRET_COPY}/secret"})
        mounts += [{"name": "runner-secret", "mountPath": SECRET_MOUNT, "readOnly": True},
                   {"name": "runner-secret-copy", "mountPath": SECRET_COPY}]
        # the Secret's file is readable through fsGroup (0440): the agent gets a copy of its own user's, mode 0600
        copy = f'umask 077 && cat {SECRET_MOUNT}/secret > "${SECRET_ENV}" && exec "$@"'
        container["command"] = ["sh", "-c", copy, "runner-agent", *command]
    if resources(spec, fitted.gpus_per_node):
        container["resources"] = resources(spec, fitted.gpus_per_node)
    if spec.metrics.enabled and spec.metrics.port:
        container["ports"] = [{"name": "metrics", "containerPort": spec.metrics.port}]
    return container


def agent_job(spec: JobSpec, spec_path: str, fitted: Fit | None = None) -> dict[str, object]:
    """The agents as an Indexed Job: one pod per node; the restart policy runs inside, pods retry infra exits."""
    name, nodes = dns_name(spec.name), spec.nodes.max
    volumes: list[dict[str, object]] = [{"name": "spec", "configMap": {"name": f"{name}-spec"}},
                                        {"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    pod: dict[str, object] = {
        "subdomain": name,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": math.ceil(spec.shutdown.grace_period) + AGENT_GRACE_MARGIN,
        "containers": [agent_container(spec, spec_path, fitted)],
        "volumes": volumes,
    }
    if provides_secret(spec):  # made by secret_commands; readable by the container's user through fsGroup
        volumes += [{"name": "runner-secret", "secret": {"secretName": secret_name(name), "defaultMode": 0o440}},
                    {"name": "runner-secret-copy", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}]
        pod["securityContext"] = {"fsGroup": SECRET_FS_GROUP}
    if spec.cluster.kubernetes.service_account:
        pod["serviceAccountName"] = spec.cluster.kubernetes.service_account
    metadata: dict[str, object] = {"labels": labels(spec, "agent")}
    template: dict[str, object] = {"metadata": metadata, "spec": pod}
    if spec.metrics.enabled and spec.metrics.port:
        metadata["annotations"] = {"prometheus.io/scrape": "true", "prometheus.io/port": str(spec.metrics.port)}
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": meta(spec, name, "agent"),
        "spec": {
            "completionMode": "Indexed", "completions": nodes, "parallelism": nodes,
            "backoffLimit": spec.restart.max_restarts,
            "podFailurePolicy": {"rules": [
                {"action": "FailJob", "onExitCodes": {"containerName": "runner", "operator": "In",
                                                      "values": list(EXIT_GAVE_UP)}},
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            ]},
            "template": template,
        },
    }


def etcd_statefulset(spec: JobSpec) -> dict[str, object]:
    """One etcd member for the rendezvous (state is ephemeral: an emptyDir)."""
    name, port = f"{dns_name(spec.name)}-etcd", spec.cluster.etcd_port
    fqdn = f"$(POD_NAME).{name}.{spec.cluster.kubernetes.namespace}.svc"
    container = {
        "name": "etcd", "image": spec.cluster.kubernetes.etcd_image,
        "command": ["etcd", "--name", "$(POD_NAME)", "--data-dir", "/var/lib/etcd",
                    "--listen-client-urls", f"http://0.0.0.0:{port}", "--advertise-client-urls", f"http://{fqdn}:{port}",
                    "--listen-peer-urls", f"http://0.0.0.0:{port + 1}",
                    "--initial-advertise-peer-urls", f"http://{fqdn}:{port + 1}",
                    "--initial-cluster", f"$(POD_NAME)=http://{fqdn}:{port + 1}"],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [{"name": "client", "containerPort": port}, {"name": "peer", "containerPort": port + 1}],
        "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 2},
        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/etcd"}],
    }
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta(spec, name, "etcd"),
        "spec": {
            "serviceName": name, "replicas": 1, "selector": {"matchLabels": labels(spec, "etcd")},
            "template": {"metadata": {"labels": labels(spec, "etcd")},
                         "spec": {"containers": [container], "volumes": [{"name": "data", "emptyDir": {}}]}},
        },
    }


def documents(spec: JobSpec, spec_path: str, spec_text: str, fitted: Fit | None = None) -> list[dict[str, object]]:
    """Every object, in the order `kubectl apply` should create them (`fitted`: None = from `spec` alone)."""
    if not spec.cluster.kubernetes.image:
        raise problem(spec_path, "cluster.kubernetes.image", "no container image for the runner pods",
                      "set cluster.kubernetes.image to an image with Python, runner and your code")
    check_etcd(spec, spec_path)
    fitted = fitted or fit("kubernetes", spec, None, spec_path, first_node(spec))
    name = dns_name(spec.name)
    docs = [config_map(spec, spec_text)]
    if spec.cluster.etcd == "start":
        docs += [headless_service(spec, f"{name}-etcd", "etcd", spec.cluster.etcd_port), etcd_statefulset(spec)]
    docs += [headless_service(spec, name, "agent", None), agent_job(spec, spec_path, fitted)]
    return docs


class _Dumper(yaml.SafeDumper):
    """SafeDumper that writes multi-line strings (the job.yaml) as literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def manifests(spec: JobSpec, spec_path: str, spec_text: str, fitted: Fit | None = None) -> str:
    """The manifests as one multi-document YAML stream (`kubectl apply -f`)."""
    docs = documents(spec, spec_path, spec_text, fitted)
    text = yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, width=120)
    if not provides_secret(spec):
        return text
    name, namespace = dns_name(spec.name), spec.cluster.kubernetes.namespace
    return (f"# Before `kubectl apply -f` of this file, create the job's Secret {secret_name(name)} once (the hosted\n"
            "# rendezvous's secret, docs/security.md; the value never appears here):\n"
            f"#   {secret_commands(name, namespace)}\n{text}")
