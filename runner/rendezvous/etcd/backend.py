"""The etcd v3 rendezvous backend: per-node keys on a lease, watches, one result per round.

Key layout: runner.rendezvous.etcd.keys. Round closing: runner.rendezvous.etcd.round.
While a round runs, one watch turns etcd changes into agent events (PeerLost, MembershipChanged,
StopRequested): runner.rendezvous.etcd.monitor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import structlog

from runner.config.spec import Auth, JobSpec
from runner.errors import JobClosed, RendezvousError, RendezvousTimeout
from runner.rendezvous.base import RendezvousResult
from runner.rendezvous.etcd.client import (
    Credentials,
    EtcdSession,
    key_range,
    prefix_range,
    put_op,
    range_op,
)
from runner.rendezvous.etcd.keys import JobKeys, dump, load
from runner.rendezvous.etcd.lease import LeaseKeeper
from runner.rendezvous.etcd.monitor import RoundMonitor
from runner.rendezvous.etcd.round import RoundRules, RoundWaiter
from runner.rendezvous.spec_check import diff_paths, shared_tree, tree_digest

FINAL_STATE_TTL_S = 3600


def read_password(auth: Auth) -> str | None:
    """The etcd password from auth.password_env or auth.password_file (never logged)."""
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


def new_session(spec: JobSpec, log: Any = None) -> EtcdSession:
    """An unconnected session for the spec's endpoints, TLS and auth."""
    rdzv = spec.rendezvous
    creds = Credentials.load(rdzv.tls.ca, rdzv.tls.cert, rdzv.tls.key, rdzv.auth.user, read_password(rdzv.auth))
    keys = JobKeys(rdzv.prefix, spec.name)
    return EtcdSession(rdzv.endpoints, creds, connect_timeout=rdzv.connect_timeout, probe_key=keys.control, log=log)


def free_port() -> int:
    """A TCP port free on this machine right now (published as MASTER_PORT candidate)."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class EtcdRendezvous:
    """Rendezvous through etcd v3. No I/O until open()."""

    def __init__(self, spec: JobSpec, node: str, *, advertise_addr: str, log: Any = None) -> None:
        self._spec, self._node, self._addr = spec, node, advertise_addr
        self._keys = JobKeys(spec.rendezvous.prefix, spec.name)
        self._log = log or structlog.get_logger("runner.rendezvous.etcd.backend").bind(node=node)
        self._session: EtcdSession | None = None
        self._lease: LeaseKeeper | None = None
        self._events: asyncio.Queue[Any] | None = None
        self._monitor: RoundMonitor | None = None
        self._result: RendezvousResult | None = None
        self._state: dict[str, Any] = {}
        self._admitted = False  # open() passed the spec and closed-job checks: this node belongs to the job
        self._round_hint = 0  # the round this node expects to be open (checked, not trusted)

    @property
    def session(self) -> EtcdSession:
        """The open session."""
        if self._session is None:
            msg = "EtcdRendezvous.open() was not called"
            raise RendezvousError(msg)
        return self._session

    @property
    def lease(self) -> LeaseKeeper:
        """This node's lease."""
        if self._lease is None:
            msg = "EtcdRendezvous.open() was not called"
            raise RendezvousError(msg)
        return self._lease

    async def open(self, events: asyncio.Queue[Any]) -> None:
        """Connect, grant the lease, check the spec and that the job is still open."""
        self._events = events
        self._session = new_session(self._spec, self._log)
        await self._session.connect()
        self._lease = LeaseKeeper(self._session, self._spec.rendezvous.lease_ttl, self._log)
        await self._lease.grant()
        await self._check_spec_and_open()
        self._admitted = True

    async def _check_spec_and_open(self) -> None:
        """One transaction: store the spec digest (first node) or compare with it, and read the control key."""
        tree = shared_tree(self._spec)
        digest, k = tree_digest(tree), self._keys
        ok, _, (*spec, control) = await self.session.call(lambda c: c.txn(
            [c.transactions.create(k.spec) == 0],
            [put_op(k.spec, digest.encode()), put_op(k.spec_json, dump(tree)), range_op(key_range(k.control))],
            [range_op(key_range(k.spec)), range_op(key_range(k.spec_json)), range_op(key_range(k.control))]))
        if not ok and not (spec[0] and spec[0][0].value.decode() == digest):
            theirs = load(spec[1][0].value) if spec[1] else None
            fields = diff_paths(tree, theirs) if isinstance(theirs, dict) else ["(unknown: no spec_json stored)"]
            msg = f"job '{self._spec.name}' already runs with a different spec; differing fields: {', '.join(fields)}"
            raise RendezvousError(msg, fix="start every node with the same job spec (or give this job another name)")
        self._raise_if_closed(control)

    def _raise_if_closed(self, control_kvs: list[Any]) -> None:
        control = load(control_kvs[0].value) if control_kvs else None
        if control:
            raise JobClosed(self._spec.name, str(control.get("state", "closed")))

    async def next_round(self, attempt: int) -> RendezvousResult:
        """Join the next round and wait for it to close."""
        await self._stop_monitor()
        started = time.monotonic()
        waiter: list[RoundWaiter] = []
        try:
            async with asyncio.timeout(self._spec.rendezvous.join_timeout):
                result, since = await self._join(attempt, waiter)
        except TimeoutError:
            joined = waiter[-1].joined_seen if waiter else 0
            raise RendezvousTimeout(self._spec.name, time.monotonic() - started, joined,
                                    self._spec.nodes.min) from None
        self._result = result
        self._monitor = RoundMonitor(self.session, self._keys, result, self._spec.nodes.max, self._events, self._log,
                                     since=since)
        await self._monitor.start()
        self._log.info("rendezvous_complete", round=result.round, group_rank=result.group_rank,
                       nodes=result.group_world_size, master_addr=result.master_addr, master_port=result.master_port)
        return result

    async def _join(self, attempt: int, waiter: list[RoundWaiter]) -> tuple[RendezvousResult, int]:
        """Join the open round; (result, revision from which the round's members are watched)."""
        rules = RoundRules(self._spec.nodes.min, self._spec.nodes.max, self._spec.rendezvous.last_call)
        while True:
            r, previous = await self._open_round()
            join_key = self._keys.join(r, self._node)
            record: dict[str, Any] = {"addr": self._addr, "nproc": self._spec.nproc_per_node, "port": free_port(),
                      "joined": time.time(), "attempt": attempt}
            waiter.append(RoundWaiter(self.session, self._keys, self._node, r, rules, previous, self._log))
            state = self._state_record({**self._state, "state": "RENDEZVOUS", "attempt": attempt, "joining": r})
            # one transaction: live state + join record on the lease, and what the waiter reads first
            first = await self.lease.put_and_read({self._keys.state(self._node): dump(state), join_key: dump(record)},
                                                  waiter[-1].reads())
            self._log.info("rendezvous_joined", round=r, attempt=attempt)
            closed = await waiter[-1].wait(first)
            self._round_hint = r + 1
            if self._node in closed["nodes"]:
                return self._to_result(r, closed), int(closed.get("rev", 0))
            self._log.info("rendezvous_round_missed", round=r)
            self.lease.forget(join_key)
            await self.session.call(lambda c, k=join_key: c.delete(k))

    async def _open_round(self) -> tuple[int, tuple[str, ...]]:
        """The round open for joining (the current one, or the next, bumped, when it already closed) and the
        nodes of the round before it. Raises JobClosed when the job is closed.

        One transaction when the round hint (0, then the round after the last one joined) is right: it reads
        the control key, the round's result and the previous round's result if the round key holds the hint.
        """
        k, r = self._keys, self._round_hint
        while True:
            t = self.session.client.transactions
            guard = _round_is(t, k, r)
            reads = [range_op(key_range(k.control)), range_op(key_range(k.result(r))),
                     range_op(key_range(k.result(r - 1))), range_op(key_range(k.round))]
            ok, _, kvs = await self.session.call(lambda c, g=guard, q=reads: c.txn([g], q[:3], [q[0], q[3]]))
            self._raise_if_closed(kvs[0])
            if not ok:  # the hint was wrong: now we know the round
                r = int(kvs[1][0].value) if kvs[1] else 0
                continue
            result, before = kvs[1], kvs[2]
            if not result:
                record = load(before[0].value) if before and r > 0 else None
                return r, tuple(record["nodes"]) if record else ()
            await self.session.call(lambda c, g=guard, r=r: c.transaction(
                compare=[g], success=[c.transactions.put(k.round, str(r + 1).encode())], failure=[]))
            r += 1

    def _to_result(self, r: int, record: dict[str, Any]) -> RendezvousResult:
        nodes = tuple(record["nodes"])
        return RendezvousResult(round=r, node=self._node, group_rank=nodes.index(self._node),
                                group_world_size=len(nodes), nproc_per_node=int(record["nproc"]),
                                master_addr=str(record["master_addr"]), master_port=int(record["master_port"]),
                                nodes=nodes, extra={"backend": "etcd"})

    async def charge_restart(self, max_restarts: int) -> int | None:
        """Charge the failure of the current round once, job-wide; the new count or None when spent."""
        r = self._result.round if self._result else -1
        k, charge = self._keys, self._keys.restart_charge(r)
        while True:
            _, (marker, total) = await self.session.call(
                lambda c: c.snapshot([key_range(charge), key_range(k.restarts)]))
            if marker:
                return load(marker[0].value)["count"]
            count = int(total[0].value) if total else 0
            new = count + 1 if count < max_restarts else None
            t = self.session.client.transactions
            guard = t.value(k.restarts) == str(count) if total else t.create(k.restarts) == 0
            puts = [t.put(charge, dump({"count": new, "by": self._node}))]
            if new is not None:
                puts.append(t.put(k.restarts, str(new).encode()))
            ok, _ = await self.session.call(lambda c, g=guard, p=puts: c.transaction(
                compare=[c.transactions.create(charge) == 0, g], success=p, failure=[]))
            if ok:
                self._log.info("restart_charged", round=r, count=new, max_restarts=max_restarts)
                return new

    async def publish(self, state: dict[str, Any]) -> None:
        """Put this node's live state (plus node, round, time) on the lease."""
        if not self._admitted:
            return  # refused (other spec, closed job) or never connected: not a node of this job
        await self.lease.put(self._keys.state(self._node), dump(self._state_record(state)))

    def _state_record(self, state: dict[str, Any]) -> dict[str, Any]:
        """`state` plus node, round, time; remembered as this node's last state."""
        r = self._result.round if self._result else None
        self._state = {**state, "node": self._node, "round": r, "time": time.time()}
        return self._state

    async def close(self, outcome: str) -> None:
        """Publish the final state, close the job when this node decides it, revoke the lease."""
        await self._stop_monitor()
        if self._session is None:
            return
        try:
            final = {**self._state, "state": "SHUTDOWN", "outcome": outcome}
            with contextlib.suppress(RendezvousError):
                if not self._admitted:
                    return
                await self.publish(final)
                # Only the job's end closes it. A node stopped by a signal just leaves: the others go on with
                # the nodes left (elastic), and a scheduler's requeue can rejoin. `runner stop` closes it.
                if outcome != "stopped" and self._result is not None and self._result.group_rank == 0:
                    await _write_control(self.session, self._keys, {"state": outcome, "by": self._node})
                long = await self.session.call(lambda c: c.lease(FINAL_STATE_TTL_S))
                await self.session.call(lambda c: c.put(self._keys.final(self._node), dump(self._state), lease=long))
        finally:
            if self._lease is not None:
                await self._lease.stop(revoke=True)
            await self._session.close()
            self._log.info("rendezvous_closed", outcome=outcome)

    async def _stop_monitor(self) -> None:
        if self._monitor is not None:
            await self._monitor.stop()
            self._monitor = None


def _round_is(t: Any, keys: JobKeys, r: int) -> Any:
    """Comparison: the round key says `r` (round 0: the key does not exist yet)."""
    return t.value(keys.round) == str(r) if r > 0 else t.create(keys.round) == 0


async def _write_control(session: EtcdSession, keys: JobKeys, value: dict[str, Any]) -> None:
    """Set the control key unless a final outcome is already there ('stopping' may be overwritten)."""
    raw = await session.call(lambda c: c.get(keys.control))
    current = load(raw.value) if raw else None
    if current and current.get("state") != "stopping":
        return
    t = session.client.transactions
    guard = t.mod(keys.control) == raw.mod_revision if raw else t.create(keys.control) == 0
    await session.call(lambda c: c.transaction(compare=[guard], success=[t.put(keys.control, dump(value))],
                                               failure=[]))


def quiet_log() -> Any:
    """A logger for `runner status` / `runner stop`: warnings to stderr, nothing on stdout (--json stays clean)."""
    return structlog.wrap_logger(structlog.PrintLogger(sys.stderr),
                                 wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


async def read_status(spec: JobSpec) -> dict[str, Any]:
    """Job status for `runner status`: control, round, master, restarts, each node's last state."""
    session, keys = new_session(spec, quiet_log()), JobKeys(spec.rendezvous.prefix, spec.name)
    await session.connect()
    try:
        _, (rnd, control, restarts, live, finals) = await session.call(lambda c: c.snapshot(
            [key_range(keys.round), key_range(keys.control), key_range(keys.restarts),
             prefix_range(keys.states), prefix_range(keys.finals)]))
        r = int(rnd[0].value) if rnd else 0
        result, result_round = None, None
        for candidate in (r, r - 1):
            raw = await session.call(lambda c, x=candidate: c.get(keys.result(x))) if candidate >= 0 else None
            if raw is not None:
                result, result_round = load(raw.value), candidate
                break
    finally:
        await session.close()
    return _status_dict(spec, r, result_round, result, control, restarts, live, finals)


def _status_dict(spec: JobSpec, r: int, result_round: int | None, result: dict[str, Any] | None,
                 control: list[Any], restarts: list[Any], live: list[Any], finals: list[Any]) -> dict[str, Any]:
    nodes: dict[str, Any] = {}
    for kv, is_live in [*((kv, False) for kv in finals), *((kv, True) for kv in live)]:
        state = load(kv.value) or {}
        nodes[JobKeys.leaf(kv.key)] = {
            "node": JobKeys.leaf(kv.key), "state": state.get("state"), "outcome": state.get("outcome"), "attempt": state.get("attempt"),
            "round": state.get("round"), "heartbeat": state.get("time"), "workers": state.get("workers"),
            "live": is_live}
    ctl = load(control[0].value) if control else None
    live_nodes = any(n["live"] for n in nodes.values())
    if ctl:
        status = "stopped" if ctl["state"] == "stopping" and not live_nodes else ctl["state"]
    elif nodes and not live_nodes:  # every node left without closing the job (each stopped by a signal)
        outcomes = {n["outcome"] for n in nodes.values()}
        status = outcomes.pop() if len(outcomes) == 1 and None not in outcomes else "stopped"
    else:
        status = "running" if result_round == r else "rendezvous"
    group = len(result["nodes"]) if result else 0
    return {"job": spec.name, "status": status, "round": r, "result_round": result_round,
            "nodes_in_round": list(result["nodes"]) if result else [],
            "world_size": group * int(result["nproc"]) if result else 0,
            "master_addr": result["master_addr"] if result else None,
            "master_port": result["master_port"] if result else None,
            "restarts": int(restarts[0].value) if restarts else 0, "backend": "etcd",
            "nodes": [nodes[name] for name in sorted(nodes)]}


async def request_stop(spec: JobSpec, graceful: bool) -> None:
    """Ask every node of the job to stop and close the rendezvous (harmless when repeated)."""
    session, keys = new_session(spec, quiet_log()), JobKeys(spec.rendezvous.prefix, spec.name)
    await session.connect()
    try:
        t = session.client.transactions
        value = dump({"state": "stopping", "graceful": graceful, "time": time.time()})
        await session.call(lambda c: c.transaction(compare=[t.create(keys.control) == 0],
                                                   success=[t.put(keys.control, value)], failure=[]))
    finally:
        await session.close()


async def reset_job(spec: JobSpec, force: bool) -> int:
    """Delete every key of the job (so its name can run again); refuses while a node is live unless `force`.

    Returns the number of keys deleted.
    """
    status = await read_status(spec)
    live = [n["node"] for n in status["nodes"] if n.get("live")]
    if live and not force:
        raise RendezvousError(
            f"job '{spec.name}' still has live node(s): {', '.join(live)}",
            fix="stop it first (`runner stop job.yaml`), or add --force",
        )
    session, keys = new_session(spec, quiet_log()), JobKeys(spec.rendezvous.prefix, spec.name)
    await session.connect()
    try:
        deleted = await session.call(lambda c: c.delete_prefix(keys.root))
    finally:
        await session.close()
    return int(getattr(deleted, "deleted", 0))
