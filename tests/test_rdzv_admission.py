"""Admission into a job in etcd (runner/rendezvous/etcd/admission.py), against a real etcd: the first node creates
the job and its epoch, a later one adopts that epoch, another spec is refused naming the fields, a closed job admits
nobody, and a lost epoch is seen."""

from __future__ import annotations

import dataclasses

import pytest
import structlog
from rdzv_helpers import make_spec, run

from runner.errors import JobClosed, RendezvousError
from runner.rendezvous.etcd.admin import write_control
from runner.rendezvous.etcd.admission import admit, job_intact
from runner.rendezvous.etcd.connect import new_session
from runner.rendezvous.etcd.keys import JobKeys
from runner.testing.etcd_server import EtcdServer

pytestmark = pytest.mark.integration


def test_the_first_node_creates_the_job_and_the_others_adopt_its_epoch(etcd: EtcdServer) -> None:
    async def body() -> None:
        spec = make_spec(etcd.endpoint, name="adm1")
        keys = JobKeys(spec.rendezvous.prefix, spec.name)
        session = new_session(spec, structlog.get_logger())
        await session.connect()
        try:
            first = await admit(session, keys, spec)
            second = await admit(session, keys, spec)
            assert first.epoch == second.epoch and len(first.epoch) == 24
            assert (first.round_hint, second.round_hint) == (0, 0)
            assert await job_intact(session, keys, first.epoch)
            await session.call(lambda c: c.delete(keys.epoch))  # etcd lost the job's identity
            assert not await job_intact(session, keys, first.epoch)
        finally:
            await session.close()
    run(body)


def test_another_spec_is_refused_naming_the_field_and_a_closed_job_admits_nobody(etcd: EtcdServer) -> None:
    async def body() -> None:
        spec = make_spec(etcd.endpoint, name="adm2")
        keys = JobKeys(spec.rendezvous.prefix, spec.name)
        session = new_session(spec, structlog.get_logger())
        await session.connect()
        try:
            await admit(session, keys, spec)
            other = dataclasses.replace(spec, nproc_per_node=spec.nproc_per_node + 1)
            with pytest.raises(RendezvousError) as info:
                await admit(session, keys, other)
            assert "nproc_per_node" in info.value.message and "runner reset" in str(info.value.fix)
            await write_control(session, keys, {"state": "succeeded", "by": "n0"})
            with pytest.raises(JobClosed):
                await admit(session, keys, spec)
        finally:
            await session.close()
    run(body)
