"""Turning on etcd's authentication in a freshly started hosted etcd (rendezvous.hosted with the job's secret).

The hosting agent runs this against its etcd while that etcd listens on a loopback port only (hosted_server's
`_secure`): user `root` with the password derived from the job's secret, role `root` granted to it, auth enabled.
Then, as root, it checks that nothing else was created in the moment before auth was on (another local user could
have reached the loopback port): exactly one user and one role, no key, no lease; anything else is refused (that
etcd is discarded, the start fails). Only public names of aetcd.rpc are used (RPC_SURFACE lists them).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aetcd import rpc

from runner.errors import RendezvousError
from runner.rendezvous.etcd.client import ClusterIdentity, Connection, Credentials, Endpoint, Unavailable, rpc_errors
from runner.rendezvous.etcd.job_secret import ROOT_USER

if TYPE_CHECKING:
    from runner.rendezvous.etcd.job_secret import JobTrust

RETRY_PAUSE_S = 0.05


async def enable_auth(port: int, trust: JobTrust, timeout: float) -> None:
    """Create root (the derived password), enable auth and audit, on the etcd at 127.0.0.1:`port`, within timeout."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                try:
                    await _enable(port, trust, timeout)
                except Unavailable:
                    await asyncio.sleep(RETRY_PAUSE_S)  # listening, not yet serving
                else:
                    return
    except TimeoutError:
        msg = f"the hosted etcd did not accept its users and auth within {timeout:g} s"
        raise RendezvousError(msg, fix="raise rendezvous.connect_timeout if the machine is slow") from None


async def _enable(port: int, trust: JobTrust, timeout: float) -> None:
    endpoint = Endpoint("127.0.0.1", port, secure=True)
    conn = Connection(endpoint, Credentials(ca=trust.ca_pem), ClusterIdentity(), timeout)
    try:
        auth = rpc.AuthStub(conn.channel)
        with rpc_errors():
            await auth.UserAdd(rpc.AuthUserAddRequest(name=ROOT_USER, password=trust.password), timeout=timeout)
            await auth.RoleAdd(rpc.AuthRoleAddRequest(name=ROOT_USER), timeout=timeout)
            await auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user=ROOT_USER, role=ROOT_USER), timeout=timeout)
            await auth.AuthEnable(rpc.AuthEnableRequest(), timeout=timeout)
    finally:
        await conn.close()
    root = Connection(endpoint, Credentials(ca=trust.ca_pem, user=ROOT_USER, password=trust.password),
                      ClusterIdentity(), timeout)
    try:
        await root.authenticate()
        auth = rpc.AuthStub(root.channel)
        with rpc_errors():
            users = await auth.UserList(rpc.AuthUserListRequest(), timeout=timeout, metadata=root.metadata)
            roles = await auth.RoleList(rpc.AuthRoleListRequest(), timeout=timeout, metadata=root.metadata)
            leases = await root.leases.LeaseLeases(rpc.LeaseLeasesRequest(), timeout=timeout, metadata=root.metadata)
        keys = await root.range(rpc.RangeRequest(key=b"\0", range_end=b"\0", count_only=True))
    finally:
        await root.close()
    found = {"users": list(users.users), "roles": list(roles.roles), "keys": int(keys.count),
             "leases": len(leases.leases)}
    if found != {"users": [ROOT_USER], "roles": [ROOT_USER], "keys": 0, "leases": 0}:
        msg = f"the hosted etcd was changed by someone else before its auth was on (found {found})"
        raise RendezvousError(msg, fix="another user of this machine reached its loopback port: start the job again, "
                              "and see docs/security.md")
