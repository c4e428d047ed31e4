"""$RUNNER_HOSTED_ENDPOINT: the endpoint a cluster template gives a hosted rendezvous in place of the spec's own.

`runner template slurm|kubernetes` sets it on every node when the spec's hosted rendezvous names a fixed host (as
`runner convert` writes `torchrun --rdzv-endpoint 192.0.2.2:29400`), which the allocation may not have: it holds the
allocation's first node and the spec's port (runner/config/clusters/fit.py). Applied when the spec is loaded, after
${VAR} substitution, to a hosted rendezvous only (an etcd you run stays where the spec says); the value is checked as
the field's own would be, and a bad one is refused naming the variable.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from runner.config.yaml_source import Document
from runner.contract import HOSTED_ENDPOINT_ENV
from runner.errors import SpecProblem

# host:port as the schema's rendezvous.endpoints items (a name, an IPv4 address or a bracketed IPv6 one)
ENDPOINT = re.compile(r"\s*(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})\s*")
MAX_CHARS = 300


def endpoint_problem(value: str) -> str | None:
    """Why `value` is no host:port (None: it is one)."""
    match = ENDPOINT.fullmatch(value) if len(value) <= MAX_CHARS else None
    if match is None:
        return f"{value[:80]!r} is no host:port"
    if not 1 <= int(match.group(2)) <= 65535:
        return f"port {int(match.group(2))} of {value.strip()!r} is out of range"
    return None


def apply_hosted_endpoint(doc: Document, environ: Mapping[str, str]) -> list[SpecProblem]:
    """Put $RUNNER_HOSTED_ENDPOINT in place of a hosted rendezvous's endpoints (in `doc.data`); the problems."""
    value = environ.get(HOSTED_ENDPOINT_ENV, "")
    rdzv = doc.data.get("rendezvous") if isinstance(doc.data, dict) else None
    if not value.strip() or not isinstance(rdzv, dict) or rdzv.get("hosted") is not True:
        return []
    why = endpoint_problem(value)
    if why is not None:
        return [doc.problem(("rendezvous", "endpoints"),
                            f"${HOSTED_ENDPOINT_ENV} (set by the cluster template in place of this field): {why}",
                            f"unset {HOSTED_ENDPOINT_ENV}, or set it to the first node's host:port")]
    rdzv["endpoints"] = [value.strip()]
    doc.variables[("rendezvous", "endpoints")] = (HOSTED_ENDPOINT_ENV,)
    return []
