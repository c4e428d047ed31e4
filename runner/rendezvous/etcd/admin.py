"""Admin operations on an etcd job, apart from the agent's backend: `runner status`, `runner stop`, `runner reset`.

Each opens its own short session (connect, one or two transactions, close), bounded by the spec's connect timeout.
`write_control` (the job's final outcome or a stop request) is shared with the backend, which closes the job when
its group-rank-0 node ends.
"""

from __future__ import annotations

import logging
import sys
import time
from functools import partial
from typing import TYPE_CHECKING, Any

import structlog

from runner.config.spec import JobSpec
from runner.errors import RendezvousError
from runner.rendezvous.etcd.client import (
    Connection,
    EtcdSession,
    absent,
    key_range,
    modified_at,
    prefix_range,
    put_op,
)
from runner.rendezvous.etcd.connect import new_session, refuse_without_secret
from runner.rendezvous.etcd.keys import JobKeys, dump, ledger_of, load
from runner.rendezvous.etcd.round import RoundResult, parse_result

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

    from runner.rendezvous.etcd.client import KeyValue


def quiet_log() -> FilteringBoundLogger:
    """A logger for `runner status` / `runner stop`: warnings to stderr, nothing on stdout (--json stays clean)."""
    log: FilteringBoundLogger = structlog.wrap_logger(
        structlog.PrintLogger(sys.stderr), wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    return log


async def write_control(session: EtcdSession, keys: JobKeys, value: dict[str, object]) -> None:
    """Set the control key unless a final outcome is already there ('stopping' may be overwritten)."""
    raw = await session.call(lambda c: c.get(keys.control))
    current = load(raw.value) if raw is not None else None
    if isinstance(current, dict) and current.get("state") != "stopping":
        return
    guard = modified_at(keys.control, int(raw.mod_revision)) if raw is not None else absent(keys.control)
    await session.call(lambda c: c.txn([guard], [put_op(keys.control, dump(value))]))


def job_keys(spec: JobSpec) -> list[JobKeys]:
    """The key spaces of the job's rendezvous: its own, or each replica group's (several nodes)."""
    keys = JobKeys(spec.rendezvous.prefix, spec.name)
    groups = spec.replica_groups
    return [keys.group(k) for k in range(groups.count)] if groups is not None else [keys]


async def read_status(spec: JobSpec) -> dict[str, Any]:
    """Job status for `runner status`: control, round, master, restarts, each node's last state.

    Replica groups on several nodes: each group's status under "groups", and every node (tagged with its group).
    """
    if spec.replica_groups is None:
        return await read_keys_status(spec, JobKeys(spec.rendezvous.prefix, spec.name))
    groups = [await read_keys_status(spec, keys) for keys in job_keys(spec)]
    for k, group in enumerate(groups):
        group["group"] = k
        for node in group["nodes"]:
            node["group"] = k
    statuses = {g["status"] for g in groups}
    status = statuses.pop() if len(statuses) == 1 else "running" if "running" in statuses else "mixed"
    return {"job": spec.name, "status": status, "round": max(g["round"] for g in groups),
            "result_round": None, "nodes_in_round": [n for g in groups for n in g["nodes_in_round"]],
            "world_size": sum(g["world_size"] for g in groups), "master_addr": None, "master_port": None,
            "restarts": sum(g["restarts"] for g in groups), "backend": "etcd",
            "nodes": [n for g in groups for n in g["nodes"]], "groups": groups,
            "ledger": [rec for g in groups for rec in g["ledger"]]}


async def read_keys_status(spec: JobSpec, keys: JobKeys) -> dict[str, Any]:
    """The status of the rendezvous whose keys are `keys` (the job's, or one replica group's)."""
    await refuse_without_secret(spec)
    session = new_session(spec, quiet_log())
    await session.connect()
    try:
        _, (rnd, control, restarts, live, finals, ledger) = await session.call(lambda c: c.snapshot(
            [key_range(keys.round), key_range(keys.control), key_range(keys.restarts),
             prefix_range(keys.states), prefix_range(keys.finals), prefix_range(keys.ledgers)]))
        r = int(rnd[0].value) if rnd else 0
        result, result_round = None, None
        for candidate in (r, r - 1):
            if candidate < 0:
                continue
            raw = await session.call(partial(Connection.get, key=keys.result(candidate)))
            if raw is not None:
                result, result_round = parse_result(load(raw.value)), candidate
                break
    finally:
        await session.close()
    status = status_dict(spec, r, result_round, result, control, restarts, live, finals)
    status["ledger"] = [rec.to_json() for rec in ledger_of(ledger).values()]  # the node ledger (docs/hangs.md)
    return status


def status_dict(spec: JobSpec, r: int, result_round: int | None, result: RoundResult | None, control: list[KeyValue],
                restarts: list[KeyValue], live: list[KeyValue], finals: list[KeyValue]) -> dict[str, Any]:
    """The status document from the keys read (node ids decoded from their keys; a state that is no object, none)."""
    nodes: dict[str, Any] = {}
    for kv, is_live in [*((kv, False) for kv in finals), *((kv, True) for kv in live)]:
        state = load(kv.value)
        if not isinstance(state, dict):
            state = {}
        name = JobKeys.leaf(kv.key)
        nodes[name] = {
            "node": name, "state": state.get("state"), "outcome": state.get("outcome"),
            "attempt": state.get("attempt"), "round": state.get("round"), "heartbeat": state.get("time"),
            "workers": state.get("workers"), "live": is_live,
            "launch": state.get("launch"), "recovery": state.get("recovery"),
            "ledger": state.get("ledger"),  # ETTR so far (docs/goodput.md)
            # out of the round for its health checks: why (docs/health.md); absent once healthy, as published
            **({"unhealthy": state["unhealthy"]} if state.get("unhealthy") is not None else {})}
    ctl = load(control[0].value) if control else None
    live_nodes = any(n["live"] for n in nodes.values())
    if isinstance(ctl, dict):
        status = "stopped" if ctl.get("state") == "stopping" and not live_nodes else str(ctl.get("state"))
    elif nodes and not live_nodes:  # every node left without closing the job (each stopped by a signal)
        outcomes = {n["outcome"] for n in nodes.values()}
        status = outcomes.pop() if len(outcomes) == 1 and None not in outcomes else "stopped"
    else:
        status = "running" if result_round == r else "rendezvous"
    return {"job": spec.name, "status": status, "round": r, "result_round": result_round,
            "nodes_in_round": list(result.nodes) if result else [],
            "world_size": len(result.nodes) * result.nproc if result else 0,
            "master_addr": result.master_addr if result else None,
            "master_port": result.master_port if result else None,
            "restarts": int(restarts[0].value) if restarts else 0, "backend": "etcd",
            "nodes": [nodes[name] for name in sorted(nodes)]}


async def request_stop(spec: JobSpec, graceful: bool) -> None:
    """Ask every node of the job to stop and close the rendezvous (harmless when repeated)."""
    await refuse_without_secret(spec)
    session, root = new_session(spec, quiet_log()), JobKeys(spec.rendezvous.prefix, spec.name)
    await session.connect()
    try:
        value = dump({"state": "stopping", "graceful": graceful, "time": time.time()})
        for control in dict.fromkeys([root.control, *(k.control for k in job_keys(spec))]):  # each group's too
            await session.call(partial(stop_txn, key=control, value=value))
    finally:
        await session.close()


async def stop_txn(c: Connection, key: bytes, value: bytes) -> None:
    """Put a stop request at `key` unless a control value is there already."""
    await c.txn([absent(key)], [put_op(key, value)])


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
        return await session.call(lambda c: c.delete(keys.root, prefix=True))
    finally:
        await session.close()
