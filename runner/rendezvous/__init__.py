"""Rendezvous backends: `local` (embedded, one node) and `etcd` (v3 API)."""

from __future__ import annotations

from runner.config.spec import JobSpec
from runner.rendezvous.base import Rendezvous, RendezvousResult

__all__ = ["Rendezvous", "RendezvousResult", "make_rendezvous"]


def make_rendezvous(spec: JobSpec, node: str, advertise_addr: str) -> Rendezvous:
    """The backend the spec asks for (imports etcd support only when used)."""
    if spec.rendezvous.backend == "etcd":
        from runner.rendezvous.etcd.backend import EtcdRendezvous

        return EtcdRendezvous(spec, node, advertise_addr=advertise_addr)
    from runner.rendezvous.local import LocalRendezvous

    return LocalRendezvous(node, spec.nproc_per_node, spec.rendezvous.master_addr or "127.0.0.1")
