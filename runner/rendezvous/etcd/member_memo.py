"""The members a node last knew, kept on its machine, so that a node started again there finds the job's etcd.

The hosted etcd's members move as hosts are lost (runner.rendezvous.etcd.members): once the first endpoint's member
was lost and replaced, the job's etcd serves only on other machines. A node started again on the first endpoint's
machine (a requeue, an agent killed and started again) knows only the spec's endpoints; when the spec names that
machine alone, nothing answers there, and the node would host an etcd of its own, empty: a second job under the
job's name. So each node keeps the client URLs of the members it learnt (no secret: addresses only; 0600) in its
per-user state folder (runner.rundir.layout `members_memo_path`), and a node of the same job (name and identity)
started again on that machine tries them as it tries the spec's other endpoints. The memo goes when the node ends
with the job (it succeeded, or was stopped): a later run of the job starts as a fresh one.

Bounded on any input: at most MAX_BYTES read, MAX_ENDPOINTS kept, each a valid `host:port`; a damaged or foreign
file reads as no memo, and a memo that cannot be written costs a line in agent.jsonl, never the job.
"""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING

from runner.errors import RendezvousError
from runner.rendezvous.etcd.client import Endpoint
from runner.system.private_files import write_private

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from structlog.typing import FilteringBoundLogger

MAX_BYTES = 4096
MAX_ENDPOINTS = 16


def recall(path: Path) -> list[Endpoint]:
    """The endpoints remembered at `path`, in order; [] when there is none or it cannot be read as a memo."""
    try:
        with path.open("rb") as f:
            data = json.loads(f.read(MAX_BYTES))
    except (OSError, ValueError, RecursionError):
        return []
    urls = data.get("endpoints") if isinstance(data, dict) else None
    found: list[Endpoint] = []
    for url in urls if isinstance(urls, list) else []:
        if not isinstance(url, str) or len(found) == MAX_ENDPOINTS:
            continue
        try:
            endpoint = Endpoint.parse(url)
        except (RendezvousError, ValueError):
            continue
        if endpoint not in found:
            found.append(endpoint)
    return found


class MemberMemo:
    """This node's memo of the members: written when they change, removed when the node ends with the job."""

    def __init__(self, path: Path, log: FilteringBoundLogger) -> None:
        self.path, self._log = path, log
        self._written: tuple[str, ...] = ()

    def remember(self, client_urls: Sequence[str]) -> None:
        """Keep `client_urls` (the members serving now), when they changed since the last write."""
        urls = tuple(client_urls)[:MAX_ENDPOINTS]
        if not urls or urls == self._written:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_private(self.path, json.dumps({"endpoints": list(urls)}))
        except OSError as e:
            self._log.info("rendezvous_members_not_remembered", path=str(self.path), error=str(e))
            return
        self._written = urls

    def forget(self) -> None:
        """Remove the memo: the job is over for this node's machine."""
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)
        self._written = ()
