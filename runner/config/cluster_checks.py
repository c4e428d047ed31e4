"""What in a valid spec cannot work once its nodes are separate machines.

`runner template` refuses it (exit 2); `runner validate` warns (the same spec can be right for several agents on one
machine, each started with --node).

- A rendezvous endpoint on the loopback (`127.0.0.1`, `::1`, `localhost`, a name that resolves only to loopback
  here, or the unspecified `0.0.0.0`) while `nodes` allows more than one node: every machine has its own loopback,
  so each node would reach its own etcd, and with `hosted: true` each would host one and train alone.
- For Kubernetes, an absolute `cwd` or script path written on the machine that renders: the pod works in
  `cluster.kubernetes.workdir` (/workspace), where that folder does not exist.
- `nproc_per_node: gpu|xpu` where this machine has none (a login node): counted on each node when it runs, so only
  a note for `runner validate`.

Each finding names the field and the fix; `classify` is the endpoint classification (a pure function of the text and
of a resolver, which tests replace).
"""

from __future__ import annotations

import concurrent.futures
import ipaddress
import os
import socket
from collections.abc import Callable, Iterator, Mapping
from enum import Enum
from typing import Any

from runner.config.devices import count as count_devices
from runner.config.spec import JobSpec
from runner.config.yaml_source import Document, Path, dotted
from runner.errors import SpecProblem
from runner.system.thread_signals import SignalFreeExecutor

Resolver = Callable[[str], tuple[str, ...]]  # a host name -> the addresses it resolves to here (empty: none)
Finding = tuple[Path, str, str]  # field, message, fix
RESOLVE_TIMEOUT_S = 2.0  # a name whose lookup takes longer is taken to be another machine's
NEVER_RESOLVED = (".invalid",)  # RFC 6761: never resolves (the templates' placeholders end so)
FIRST_NODE_FIX = ('"${RUNNER_FIRST_NODE}:29400" with hosted: true (`runner template` sets RUNNER_FIRST_NODE to the '
                  "allocation's first node), or the address of an etcd every node reaches")


class Reach(Enum):
    """Where an endpoint's host is, seen from one node."""

    LOOPBACK = "loopback"  # 127.0.0.0/8, ::1, localhost, *.localhost: every machine has its own
    UNSPECIFIED = "unspecified"  # 0.0.0.0, ::: "this machine" to a client
    LOOPBACK_NAME = "loopback_name"  # a name that resolves, here, to loopback addresses only
    NETWORK = "network"  # anything else: an address or a name other machines can reach (or unknown here)

    @property
    def this_machine_only(self) -> bool:
        """Whether every node would reach a different machine (its own) through it."""
        return self is not Reach.NETWORK


def endpoint_host(endpoint: str) -> str:
    """The host part of `host:port`, `http(s)://host:port[/]`, `[v6]:port` (lowercase, no brackets or final dot)."""
    bare = endpoint.strip().split("://", 1)[-1].split("/", 1)[0]
    if bare.startswith("["):
        host = bare[1:].partition("]")[0]
    elif bare.count(":") == 1:
        host = bare.partition(":")[0]
    else:
        host = bare  # no port, or a bare IPv6 address
    return host.strip().rstrip(".").lower()


def resolve_here(host: str) -> tuple[str, ...]:
    """The addresses `host` resolves to on this machine, within RESOLVE_TIMEOUT_S (empty when it does not)."""
    pool = SignalFreeExecutor(max_workers=1)  # may outlive the call (a stuck lookup): it never takes a signal
    future = pool.submit(socket.getaddrinfo, host, None, type=socket.SOCK_STREAM)
    try:
        infos = future.result(timeout=RESOLVE_TIMEOUT_S)
    except (OSError, UnicodeError, concurrent.futures.TimeoutError):
        return ()
    finally:
        pool.shutdown(wait=False)
    return tuple(dict.fromkeys(str(info[4][0]) for info in infos))


def _address_reach(text: str) -> Reach | None:
    """The reach of a literal address; None when `text` is no address."""
    try:
        ip = ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return Reach.LOOPBACK
    if ip.is_unspecified:
        return Reach.UNSPECIFIED
    return Reach.NETWORK


def classify(endpoint: str, resolve: Resolver = resolve_here) -> Reach:
    """Where `endpoint` leads from a node: see Reach.

    A name is resolved (with `resolve`) only when it is no address and no loopback name; one that does not resolve
    here is taken to be another machine's.
    """
    host = endpoint_host(endpoint)
    literal = _address_reach(host)
    if literal is not None:
        return literal
    if host == "localhost" or host.endswith(".localhost"):
        return Reach.LOOPBACK
    if not host or host.endswith(NEVER_RESOLVED):
        return Reach.NETWORK
    reaches = {_address_reach(ip) for ip in resolve(host)}
    if reaches and reaches <= {Reach.LOOPBACK, Reach.UNSPECIFIED}:
        return Reach.LOOPBACK_NAME
    return Reach.NETWORK


def _loopback(spec: JobSpec, fix: str, resolve: Resolver) -> Iterator[Finding]:
    rdzv = spec.rendezvous
    if rdzv.backend != "etcd" or spec.nodes.max <= 1:
        return
    for endpoint in rdzv.endpoints:
        reach = classify(endpoint, resolve)
        if not reach.this_machine_only:
            continue
        what = {Reach.LOOPBACK: "a loopback address", Reach.UNSPECIFIED: "the unspecified address (this machine)",
                Reach.LOOPBACK_NAME: "a name that resolves to loopback on this machine"}[reach]
        then = (" and hosts an etcd of its own: each node would form a job of its own" if rdzv.hosted
                else ": each node would reach a different etcd, or none")
        yield (("rendezvous", "endpoints"),
               (f"'{endpoint}' is {what}, but nodes allows {spec.nodes.max} nodes: on separate machines every "
                f"node has its own loopback{then}"), fix)
        return


def _kubernetes_image(spec: JobSpec) -> Iterator[Finding]:
    if not spec.cluster.kubernetes.image:
        yield (("cluster", "kubernetes", "image"), "no container image for the runner pods",
               "set cluster.kubernetes.image to an image with Python, runner and your code")


def _kubernetes_paths(doc: Document) -> Iterator[Finding]:
    data: Mapping[str, Any] = doc.data if isinstance(doc.data, dict) else {}
    cwd = data.get("cwd")
    if isinstance(cwd, str) and os.path.isabs(os.path.expanduser(cwd)):
        yield (("cwd",), (f"cwd '{cwd}' is an absolute path of this machine, but the pod runs in "
                          "cluster.kubernetes.workdir, where the spec is mounted"),
               ("write cwd relative to the spec file's folder (e.g. `.`, or remove it), and put that folder at "
                "cluster.kubernetes.workdir in the image"))
    entry = data.get("entrypoint")
    script = entry.get("script") if isinstance(entry, dict) else None
    if isinstance(script, str) and os.path.isabs(os.path.expanduser(script)):
        yield (("entrypoint", "script"), (f"script '{script}' is an absolute path of this machine, but the pod "
                                          "runs in cluster.kubernetes.workdir"),
               "write the script relative to cwd (itself relative to the spec file's folder)")


def _devices(doc: Document, environ: Mapping[str, str]) -> Iterator[Finding]:
    raw = doc.data.get("nproc_per_node") if isinstance(doc.data, dict) else None
    if isinstance(raw, str) and raw in ("gpu", "xpu") and count_devices(raw, environ) < 1:
        device = "GPU" if raw == "gpu" else "Intel GPU (xpu)"
        yield (("nproc_per_node",), (f"nproc_per_node: {raw} but no {device} is visible on this machine: each "
                                     "node counts its own when it runs (runner run refuses a node without one)"),
               "run on a node with one (check CUDA_VISIBLE_DEVICES), or write a number")


def template_problems(kind: str, spec: JobSpec, doc: Document, resolve: Resolver = resolve_here) -> list[SpecProblem]:
    """What `runner template KIND` refuses (exit 2): each with its field, line and fix."""
    found = [*_loopback(spec, f"write {FIRST_NODE_FIX}", resolve)]
    if kind == "kubernetes":
        found += [*_kubernetes_image(spec), *_kubernetes_paths(doc)]
    return [doc.problem(path, message, fix) for path, message, fix in found]


def validate_warnings(spec: JobSpec, doc: Document | None, environ: Mapping[str, str] | None = None,
                      resolve: Resolver = resolve_here) -> list[SpecProblem]:
    """What `runner validate` warns about (the spec may be right on one machine, or for another machine)."""
    fix = (f"for several machines write {FIRST_NODE_FIX}; for several agents on this one machine keep it and start "
           "each with --node NAME")
    found = [*_loopback(spec, fix, resolve)]
    if doc is not None:
        found += _devices(doc, os.environ if environ is None else environ)
        return [doc.problem(path, message, fix) for path, message, fix in found]
    return [SpecProblem(dotted(path), message, fix) for path, message, fix in found]
