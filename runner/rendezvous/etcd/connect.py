"""An etcd session for a job spec: endpoints, TLS and password, from the spec or from a hosted job's secret.

A hosted job's secret gives its CA and root's password (runner.rendezvous.etcd.job_secret).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from runner.config.spec import Auth, JobSpec
from runner.contract import SECRET_ENV
from runner.errors import RendezvousError
from runner.rendezvous.etcd.client import Credentials, Endpoint, EtcdSession
from runner.rendezvous.etcd.job_secret import NEW_FIX, ROOT_USER, job_trust, secret_source
from runner.rendezvous.etcd.keys import JobKeys

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger


def read_password(auth: Auth) -> str | None:
    """The etcd password from auth.password_env or auth.password_file (never logged, never published)."""
    if auth.password_env:
        value = os.environ.get(auth.password_env)
        if value is None:
            msg = f"environment variable {auth.password_env} (rendezvous.auth.password_env) is not set"
            raise RendezvousError(msg, fix=f"export {auth.password_env}=<etcd password> before starting the runner")
        return value
    if auth.password_file:
        try:
            return Path(auth.password_file).read_text().rstrip("\r\n")
        except OSError as exc:
            msg = f"cannot read rendezvous.auth.password_file '{auth.password_file}': {exc.strerror}"
            raise RendezvousError(msg, fix="fix the path or its permissions") from exc
    return None


def credentials(spec: JobSpec) -> Credentials:
    """The spec's etcd credentials: a hosted job's derive from its secret (CA, root, password); else tls and auth."""
    rdzv = spec.rendezvous
    trust = job_trust(rdzv, spec.name)
    if trust is not None:
        return Credentials(ca=trust.ca_pem, user=ROOT_USER, password=trust.password, trust_from=trust.named_by)
    return Credentials.load(rdzv.tls.ca, rdzv.tls.cert, rdzv.tls.key, rdzv.auth.user, read_password(rdzv.auth))


async def refuse_without_secret(spec: JobSpec) -> None:
    """A RendezvousError when the spec's hosted rendezvous needs the job's secret and none is given.

    Needed: a hosted job that more than one node may join, whose endpoint is not a loopback address (reached from
    other machines). A single-node job, or one on loopback (one machine), runs without, as before.
    """
    rdzv = spec.rendezvous
    if not rdzv.hosted or spec.nodes.max <= 1 or secret_source(rdzv) is not None:
        return
    endpoint = Endpoint.parse(rdzv.endpoints[0])
    if await resolves_to_loopback(endpoint.host):
        return
    msg = (f"a hosted rendezvous for up to {spec.nodes.max} nodes at {rdzv.endpoints[0]} needs the job's secret, "
           f"and neither rendezvous.secret_file nor {SECRET_ENV} is set: without it anyone who reaches the port "
           "could join, read or stop the job (docs/security.md)")
    raise RendezvousError(msg, fix=NEW_FIX)


async def resolves_to_loopback(host: str) -> bool:
    """Whether every address `host` resolves to is a loopback address (False when it does not resolve)."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    ips = {str(info[4][0]).split("%", 1)[0] for info in infos}
    return bool(ips) and all(ipaddress.ip_address(ip).is_loopback for ip in ips)


def new_session(spec: JobSpec, log: FilteringBoundLogger | None = None, *, probe: bool = True) -> EtcdSession:
    """An unconnected session for the spec's endpoints, TLS and auth.

    probe=False: connecting does not read the control key (the caller's first call finds out whether etcd answers).
    """
    creds = credentials(spec)
    rdzv = spec.rendezvous
    keys = JobKeys(rdzv.prefix, spec.name)
    return EtcdSession(rdzv.endpoints, creds, connect_timeout=rdzv.connect_timeout,
                       probe_key=keys.control if probe else None, log=log, learn_members=rdzv.hosted)
