"""The rendezvous store as the soak's faults and checks see it: which etcd a job uses, its keys and leases, when it
last renewed every lease, and starting it again after a fault (bench/soak/hosts.py has the variant on hosts)."""

from __future__ import annotations

from bench.soak.bounds import ETCD_RENEW_EXTRA_S, PREFIX
from bench.soak.etcd_reads import EtcdReader
from bench.soak.model import Job
from bench.soak.state import SoakState


class EtcdView:
    """The default mode's etcd: the soak's own (state.etcd), or with --hosted the one an agent hosts."""

    def __init__(self, state: SoakState) -> None:
        self.state = state

    def reader(self, job: Job) -> EtcdReader | None:
        """The etcd the job uses: ours (None while it is down), or the hosted one at the job's endpoint."""
        if self.state.args.hosted:
            return EtcdReader(job.endpoint, job.trust)
        etcd = self.state.etcd
        if etcd is None or not etcd.up:
            return None
        return EtcdReader(job.endpoint)

    def keys(self, job: Job) -> list[tuple[str, int]] | None:
        """(key, lease) of every key of the job; None when etcd cannot be read."""
        reader = self.reader(job)
        return reader.keys(f"{PREFIX}/{job.name}/") if reader else None

    def lease_ttl(self, job: Job, lease: int) -> int | None:
        """Remaining TTL of a lease (-1: gone); None when etcd cannot be read."""
        reader = self.reader(job)
        return reader.lease_ttl(lease) if reader else None

    def lease_gone(self, job: Job, lease: int) -> bool | None:
        """True once the lease is gone; None (moot) while etcd cannot be read."""
        ttl = self.lease_ttl(job, lease)
        return None if ttl is None else ttl < 0

    def renewed_at(self) -> float:
        """time.time() from which etcd counts every lease's TTL again: its last start, plus an election timeout."""
        return self.state.etcd.started_at + ETCD_RENEW_EXTRA_S if self.state.etcd is not None else 0.0

    def start(self) -> None:
        """Start our etcd again (same data, same ports) if it is down."""
        if self.state.etcd is not None and not self.state.etcd.up:
            self.state.etcd.start()
            self.state.say("etcd started again")
