"""Admission into a job in etcd (runner/rendezvous/etcd/admission.py), against a real etcd: the first node creates
the job and its epoch, a later one adopts that epoch, another spec is refused naming the fields, a closed job admits
nobody, and a lost epoch is seen."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator

import pytest
import structlog
from rdzv_helpers import make_spec, run

from runner.config.spec import JobSpec
from runner.errors import JobClosed, RendezvousError
from runner.rendezvous.etcd.admin import write_control
from runner.rendezvous.etcd.admission import admit, job_intact
from runner.rendezvous.etcd.client import EtcdSession
from runner.rendezvous.etcd.connect import new_session
from runner.rendezvous.etcd.keys import JobKeys
from runner.testing.etcd_server import EtcdServer

pytestmark = pytest.mark.integration


@contextlib.asynccontextmanager
async def job_session(endpoint: str, name: str) -> AsyncIterator[tuple[JobSpec, JobKeys, EtcdSession]]:
    """A spec of job `name` on `endpoint`, its keys, and a connected session (closed at the end)."""
    spec = make_spec(endpoint, name=name)
    session = new_session(spec, structlog.get_logger())
    await session.connect()
    try:
        yield spec, JobKeys(spec.rendezvous.prefix, spec.name), session
    finally:
        await session.close()


def test_the_first_node_creates_the_job_and_the_others_adopt_its_epoch(etcd: EtcdServer) -> None:
    async def body() -> None:
        async with job_session(etcd.endpoint, "adm1") as (spec, keys, session):
            first = await admit(session, keys, spec)
            second = await admit(session, keys, spec)
            assert first.epoch == second.epoch and len(first.epoch) == 24
            assert (first.round_hint, second.round_hint) == (0, 0)
            assert await job_intact(session, keys, first.epoch)
            await session.call(lambda c: c.delete(keys.epoch))  # etcd lost the job's identity
            assert not await job_intact(session, keys, first.epoch)
    run(body)


def test_another_spec_is_refused_naming_the_field_and_a_closed_job_admits_nobody(etcd: EtcdServer) -> None:
    async def body() -> None:
        async with job_session(etcd.endpoint, "adm2") as (spec, keys, session):
            await admit(session, keys, spec)
            other = dataclasses.replace(spec, nproc_per_node=spec.nproc_per_node + 1)
            with pytest.raises(RendezvousError) as info:
                await admit(session, keys, other)
            assert "nproc_per_node" in info.value.message and "runner reset" in str(info.value.fix)
            await write_control(session, keys, {"state": "succeeded", "by": "n0"})
            with pytest.raises(JobClosed):
                await admit(session, keys, spec)
    run(body)
