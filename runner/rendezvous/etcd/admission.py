"""Admission into a job in etcd.

The first node creates the job (spec digest, spec tree, epoch), every later node proves it runs the same spec and
adopts the epoch; a closed job admits nobody.

One transaction that creates the job or reads it: a read first would cost every node that races the job's creation
a second one, most nodes when they all start at once. The epoch is the job's identity in this etcd: a node that finds
another epoch (or none) later knows etcd lost the job (runner/rendezvous/etcd/backend.py recovers).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from runner.config.spec import JobSpec
from runner.errors import RendezvousError
from runner.rendezvous.etcd.client import EtcdSession, absent, key_range, put_op, range_op
from runner.rendezvous.etcd.keys import JobKeys, dump, load
from runner.rendezvous.spec_check import diff_paths, shared_tree, tree_digest

EPOCH_BYTES = 12


@dataclass(frozen=True)
class Admission:
    """What admission tells a node: the job's epoch, and the round it tries first (the round key's value)."""

    epoch: bytes
    round_hint: int


@functools.lru_cache(maxsize=4)
def spec_identity(spec: JobSpec) -> tuple[dict[str, object], bytes, bytes]:
    """The spec's shared tree (secrets as digests), its digest and the tree as stored, once per spec (read-only)."""
    tree = shared_tree(spec)
    return tree, tree_digest(tree).encode(), dump(tree)


async def admit(session: EtcdSession, keys: JobKeys, spec: JobSpec, *, restarts_known: int = 0) -> Admission:
    """Join the job in one transaction; RendezvousError when it runs another spec, JobClosed when it is closed.

    `restarts_known`: the job-wide restart count this node saw before etcd lost the job; a node recreating the job
    writes it, so the budget already spent stays spent.
    """
    tree, digest, stored = spec_identity(spec)
    epoch = new_epoch()
    puts = [put_op(keys.spec, digest), put_op(keys.spec_json, stored), put_op(keys.epoch, epoch)]
    if restarts_known:
        puts.append(put_op(keys.restarts, str(restarts_known).encode()))
    reads = [range_op(key_range(keys.control)), range_op(key_range(keys.round))]
    otherwise = [range_op(key_range(keys.spec)), range_op(key_range(keys.epoch)), *reads]
    done = await session.call(lambda c: c.txn([absent(keys.spec)], [*puts, *reads], otherwise))
    control, round_kv = done.kvs[-2:]
    if not done.succeeded:
        theirs, stored_epoch = done.kvs[:2]
        if not (theirs and bytes(theirs[0].value) == digest):
            spec_json = await session.call(lambda c: c.get(keys.spec_json))  # only now: names the fields
            raise mismatch(spec, tree, load(spec_json.value) if spec_json is not None else None)
        epoch = bytes(stored_epoch[0].value) if stored_epoch else await add_epoch(session, keys)
    keys.check_open(control[0].value if control else None)
    return Admission(epoch, int(round_kv[0].value) if round_kv else 0)


def new_epoch() -> bytes:
    """A fresh epoch token."""
    return os.urandom(EPOCH_BYTES).hex().encode()


async def add_epoch(session: EtcdSession, keys: JobKeys) -> bytes:
    """A job created without an epoch key (by an older runner) gets one; the epoch in place."""
    epoch = new_epoch()
    done = await session.call(lambda c: c.txn([absent(keys.epoch)], [put_op(keys.epoch, epoch)],
                                              [range_op(key_range(keys.epoch))]))
    return epoch if done.succeeded else bytes(done.kvs[0][0].value)


async def job_intact(session: EtcdSession, keys: JobKeys, epoch: bytes) -> bool:
    """Whether etcd still holds the job this node was admitted into (its epoch key, unchanged)."""
    kv = await session.call(lambda c: c.get(keys.epoch))
    return kv is not None and bytes(kv.value) == epoch


def mismatch(spec: JobSpec, tree: dict[str, object], theirs: object) -> RendezvousError:
    """The refusal of a node whose spec differs from the one the job runs: the differing fields, and the fix."""
    fields = diff_paths(tree, theirs) if isinstance(theirs, dict) else ["(unknown: no spec_json stored)"]
    msg = f"job '{spec.name}' already runs with a different spec; differing fields: {', '.join(fields)}"
    return RendezvousError(msg, fix="start every node with the same job spec; if the run that stored the other "
                           "spec is over, `runner reset job.yaml` forgets it (or give this job another name)")
