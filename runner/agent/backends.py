"""The rendezvous backend a spec asks for (the agent layer picks it: the rendezvous layer imports no backend)."""

from __future__ import annotations

from pathlib import Path

from runner.config.spec import JobSpec
from runner.rendezvous.base import Rendezvous


def make_rendezvous(spec: JobSpec, node: str, advertise_addr: str, run_dir: Path | None = None) -> Rendezvous:
    """The backend the spec asks for (imports etcd support only when used).

    `run_dir`: where a hosting node keeps its etcd's data and log (rendezvous.hosted); by default the run dir of
    the agent's log.
    """
    if spec.rendezvous.backend == "etcd" and spec.rendezvous.hosted:
        from runner.rendezvous.etcd.hosted import HostedRendezvous

        return HostedRendezvous(spec, node, advertise_addr=advertise_addr, run_dir=run_dir)
    if spec.rendezvous.backend == "etcd":
        from runner.rendezvous.etcd.backend import EtcdRendezvous

        return EtcdRendezvous(spec, node, advertise_addr=advertise_addr)
    from runner.rendezvous.local import LocalRendezvous

    return LocalRendezvous(
        node, spec.nproc_per_node, spec.rendezvous.master_addr or "127.0.0.1", spec.rendezvous.master_port
    )
