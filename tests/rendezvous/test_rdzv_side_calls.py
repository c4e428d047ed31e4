"""Side calls never hang and never leak: publish / charge_restart / close with etcd gone, and secrets in etcd.

- etcd killed: each side call returns or raises RendezvousError (never anything else) within the connect timeout.
- the spec tree stored in etcd holds no secret env value in clear, yet a differing secret is still a mismatch.
- the etcd password appears in no key or value of etcd and in no log line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable
from typing import Any

import pytest
import structlog
from rdzv_helpers import Node, close_all, make_spec, open_nodes, rounds, run

from runner.config.spec import Auth
from runner.errors import RendezvousError
from runner.rendezvous.etcd.client import prefix_range
from runner.rendezvous.etcd.keys import JobKeys, load
from runner.rendezvous.spec_check import SECRET_DIGEST_PREFIX, shared_tree
from runner.testing.etcd_server import EtcdServer

pytestmark = pytest.mark.integration
CONNECT_TIMEOUT_S = 2.0
SLACK_S = 3.0  # event-loop scheduling and process teardown around the bound, not a performance target


async def bounded(call: Awaitable[Any]) -> tuple[BaseException | None, float]:
    """(the exception `call` raised or None, seconds it took)."""
    start = time.monotonic()
    try:
        await call
    except BaseException as exc:
        return exc, time.monotonic() - start
    return None, time.monotonic() - start


def test_side_calls_with_etcd_gone_end_within_the_connect_timeout(etcd: EtcdServer) -> None:
    """etcd killed under a running round: publish, charge_restart and close each end with RendezvousError (or
    return) within connect_timeout, and close releases the session anyway."""
    async def body() -> None:
        spec = make_spec(etcd.endpoint, connect_timeout=CONNECT_TIMEOUT_S, lease_ttl=2.0)
        nodes = await open_nodes(spec, ["a", "b"])
        await rounds(nodes)
        await asyncio.to_thread(etcd.kill)
        a = nodes[0].rdzv
        for call in (a.publish({"state": "RUNNING"}), a.charge_restart(3), a.close("succeeded")):
            error, took = await bounded(call)
            assert error is None or isinstance(error, RendezvousError), repr(error)
            assert took <= CONNECT_TIMEOUT_S + SLACK_S, took
        assert isinstance(error, RendezvousError) and "etcd" in error.message
        assert not a.session.connected  # released even though etcd never answered
        error, took = await bounded(nodes[1].rdzv.close("succeeded"))
        assert isinstance(error, RendezvousError) and took <= CONNECT_TIMEOUT_S + SLACK_S
    run(body)


SECRET_VALUE = "hf_9bS3cretTokenValue-do-not-store"


def test_secret_env_values_are_stored_as_digests_yet_compared(etcd: EtcdServer) -> None:
    """HF_TOKEN's value is not in etcd (a digest is); plain values are. A node whose secret differs is refused,
    the message naming env.HF_TOKEN but not either value."""
    async def body() -> None:
        spec = dataclasses.replace(make_spec(etcd.endpoint, nmin=1, nmax=2),
                                   env=(("HF_TOKEN", SECRET_VALUE), ("URL", "https://u:pw-in-url@h/x"),
                                        ("MODE", "fast")))
        (a,) = await open_nodes(spec, ["a"])
        keys = JobKeys(spec.rendezvous.prefix, spec.name)
        _, (kvs,) = await a.rdzv.session.call(lambda c: c.snapshot([prefix_range(keys.root)]))
        stored = b"".join(bytes(kv.key) + bytes(kv.value) for kv in kvs)
        assert SECRET_VALUE.encode() not in stored and b"pw-in-url" not in stored
        tree = load(next(kv.value for kv in kvs if bytes(kv.key) == keys.spec_json))
        assert tree["env"]["HF_TOKEN"].startswith(SECRET_DIGEST_PREFIX)
        assert tree["env"]["URL"].startswith(SECRET_DIGEST_PREFIX) and tree["env"]["MODE"] == "fast"
        assert tree == shared_tree(spec)
        other = dataclasses.replace(spec, env=(("HF_TOKEN", SECRET_VALUE + "x"), *spec.env[1:]))
        refused = Node(other, "b")
        with pytest.raises(RendezvousError, match=r"env\.HF_TOKEN") as info:
            await refused.open()
        await refused.rdzv.close("error")  # as SHUTDOWN does: releases the session, writes nothing
        assert SECRET_VALUE not in info.value.message and "runner reset" in info.value.fix
        same = await Node(spec, "c").open()  # the same secret matches
        await close_all([a, same])
    run(body)


def test_etcd_password_is_never_stored_or_logged(etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """With auth on, a whole round: the password is in no etcd key or value and in no log event."""
    password = "Pw-4-etcd-never-logged"
    etcd.enable_auth(password)
    monkeypatch.setenv("RDZV_SECRET_PW", password)
    spec = make_spec(etcd.endpoint, auth=Auth(user="root", password_env="RDZV_SECRET_PW"))

    async def body() -> list[Any]:
        with structlog.testing.capture_logs() as logs:
            nodes = await open_nodes(spec, ["a", "b"])
            await rounds(nodes)
            await nodes[0].rdzv.publish({"state": "RUNNING"})
            keys = JobKeys(spec.rendezvous.prefix, spec.name)
            _, (kvs,) = await nodes[0].rdzv.session.call(lambda c: c.snapshot([prefix_range(keys.root)]))
            await close_all(nodes)
        assert kvs and all(password.encode() not in bytes(kv.key) + bytes(kv.value) for kv in kvs)
        return logs
    logs = run(body)
    assert logs and password not in repr(logs)
