"""An etcd session for a job spec: endpoints, TLS files and the password (from the environment or a file)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from runner.config.spec import Auth, JobSpec
from runner.errors import RendezvousError
from runner.rendezvous.etcd.client import Credentials, EtcdSession
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


def new_session(spec: JobSpec, log: FilteringBoundLogger | None = None, *, probe: bool = True) -> EtcdSession:
    """An unconnected session for the spec's endpoints, TLS and auth.

    probe=False: connecting does not read the control key (the caller's first call finds out whether etcd answers).
    """
    rdzv = spec.rendezvous
    creds = Credentials.load(rdzv.tls.ca, rdzv.tls.cert, rdzv.tls.key, rdzv.auth.user, read_password(rdzv.auth))
    keys = JobKeys(rdzv.prefix, spec.name)
    return EtcdSession(rdzv.endpoints, creds, connect_timeout=rdzv.connect_timeout,
                       probe_key=keys.control if probe else None, log=log)
