"""How an etcd call's failure is read (runner/rendezvous/etcd/client.py `translate`): a broken connection is retried,
a refusal of etcd's is a refusal.

The class of problem: gRPC reports a connection that broke under a call in several ways, and not always with code
UNAVAILABLE. CI (2026-12-01) saw "Internal error from Core" (code INTERNAL) while a member host was lost during a
rendezvous; read as "etcd refused the request", it ended a survivor with exit 3 where a retry on the next member
would have gone on. So: every code etcd never answers with, and every transport message under any code, is retried;
every code etcd refuses with, with etcd's own words, stays a refusal naming the fix.

Seen failing: with INTERNAL out of RETRY_CODES (the first test, on "Internal error from Core"), and with the transport
signs out of BUSY_SIGNS (the second, on "Stream removed" with code UNKNOWN).
"""

from __future__ import annotations

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.errors import RendezvousError
from runner.rendezvous.etcd.client import LeaseNotFound, MembersBusy, Unavailable, translate


def failed(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


# What gRPC's transport says when the connection under a call breaks (seen here and in grpc's issue tracker).
TRANSPORT = ("Internal error from Core", "Stream removed", "Socket closed", "Connection reset by peer",
             "Broken pipe", ("failed to connect to all addresses; last error: UNKNOWN: ipv4:10.0.0.2:2379: "
                            "Failed to connect to remote host: Connection refused"), "No status received",
             # a member that stops (it left the cluster): another member answers (README's fresh-clone run: a node's
             # final state refused with "raft: stopped" was then read as its loss by a slower node)
             "raft: stopped", "etcdserver: server stopped")

# What etcd 3.5 answers when it refuses a request (server/etcdserver/api/v3rpc/rpctypes), with its code.
REFUSALS = ((grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied"),
            (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: user name is empty"),
            (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: request is too large"),
            (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: authentication failed, invalid user ID or password"),
            (grpc.StatusCode.FAILED_PRECONDITION, "etcdserver: user name not found"),
            (grpc.StatusCode.OUT_OF_RANGE, "etcdserver: mvcc: required revision has been compacted"))


@pytest.mark.parametrize("code", [grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE,
                                  grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED])
def test_a_connection_broken_under_a_call_is_retried_whatever_its_code(code: grpc.StatusCode) -> None:
    """The CI case first: INTERNAL, "Internal error from Core"; then the other transport codes."""
    for details in TRANSPORT:
        assert isinstance(translate(failed(code, details)), Unavailable), (code, details)


@given(code=st.sampled_from(list(grpc.StatusCode)), details=st.sampled_from(TRANSPORT),
       around=st.text(max_size=40))
def test_a_transport_message_is_retried_under_any_code(code: grpc.StatusCode, details: str, around: str) -> None:
    """gRPC puts the transport's words in the details under UNKNOWN too ("Stream removed"); a message that carries
    them, with anything around, is a lost connection, never a refusal."""
    assert isinstance(translate(failed(code, around + details + around)), (Unavailable, MembersBusy))


@pytest.mark.parametrize(("code", "details"), REFUSALS)
def test_etcds_own_refusals_stay_refusals_that_name_the_fix(code: grpc.StatusCode, details: str) -> None:
    error = translate(failed(code, details))
    assert not isinstance(error, Unavailable)
    assert isinstance(error, RendezvousError)
    assert details in str(error)


def test_a_lost_lease_is_its_own_error() -> None:
    assert isinstance(translate(failed(grpc.StatusCode.NOT_FOUND, "etcdserver: requested lease not found")),
                      LeaseNotFound)
