"""Is this still the etcd that holds our job? Every reply's header says which cluster answered and at what revision.

A cluster that lost its data (data dir wiped, cluster replaced, restored from an old snapshot) shows it in one of two
ways: the cluster id in the header changes, or a reply's revision is lower than one this client already saw before
it sent the request (etcd's revision never goes back: every KV reply is linearizable). Pure logic, no I/O: the
client feeds it each header with the floor it captured before sending.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Header(Protocol):
    """The fields of etcd's ResponseHeader this check reads."""

    cluster_id: int
    revision: int


class ClusterIdentity:
    """The cluster id and highest revision seen; calls every listener once per detected loss."""

    def __init__(self) -> None:
        self.cluster_id: int | None = None
        self.revision = 0
        self._listeners: list[Callable[[str], None]] = []

    def on_loss(self, listener: Callable[[str], None]) -> None:
        """Call `listener(reason)` whenever a reply shows the data was lost."""
        self._listeners.append(listener)

    def check(self, header: Header, floor: int | None) -> str | None:
        """Record `header`; the reason when it shows data loss (listeners are told), else None.

        `floor`: self.revision captured before the request was sent (None for replies whose revision is
        not linearizable, e.g. lease replies: only their cluster id is checked).
        """
        cluster, rev = int(header.cluster_id), int(header.revision)
        reason = None
        if self.cluster_id is not None and cluster and cluster != self.cluster_id:
            reason = f"the cluster id changed from {self.cluster_id:x} to {cluster:x} (another etcd cluster)"
        elif floor is not None and 0 < rev < floor:
            reason = f"the revision went back from {floor} to {rev} (etcd restarted without its data)"
        if reason is not None:  # a new baseline: the new cluster's history starts here
            self.cluster_id, self.revision = cluster, rev
            for listener in list(self._listeners):
                listener(reason)
            return reason
        if cluster:
            self.cluster_id = cluster
        self.revision = max(self.revision, rev)
        return None
