"""Pure pieces of the etcd rendezvous: rank assignment, spec diff, key layout, round rules."""

from __future__ import annotations

import dataclasses

import pytest

from runner.config.spec import Entrypoint, JobSpec, Logs, Nodes
from runner.errors import RendezvousError
from runner.rendezvous.etcd.keys import JobKeys
from runner.rendezvous.etcd.round import build_result, pending
from runner.rendezvous.ranks import assign_ranks, leader_of
from runner.rendezvous.spec_check import diff_paths, shared_digest, shared_tree


class TestAssignRanks:
    def test_sorted_by_node_id_without_history(self) -> None:
        """With no previous round, group ranks follow node id order."""
        assert assign_ranks(["c", "a", "b"]) == ("a", "b", "c")

    def test_previous_members_keep_their_order_first(self) -> None:
        """Nodes of the previous round keep their relative order ahead of newcomers."""
        assert assign_ranks(["a", "z", "m", "b"], previous=["z", "gone", "m"]) == ("z", "m", "a", "b")

    def test_leader_is_rank_zero(self) -> None:
        """leader_of returns the node that gets group rank 0, None when empty."""
        assert leader_of(["b", "a"]) == "a"
        assert leader_of([]) is None


class TestRoundRules:
    def test_pending_ignores_ended_and_joined_nodes(self) -> None:
        """Only alive, not-yet-joined nodes of the previous round hold a round open."""
        states = {"a": {"state": "RUNNING"}, "b": {"state": "SHUTDOWN"}, "c": {"state": "FAILED"}}
        assert pending(["a", "b", "c", "d"], joined={"c": {}}, states=states) == ["a"]

    def test_build_result_truncates_to_max_and_uses_rank0_port(self) -> None:
        """The result keeps max nodes and takes the master address/port from group rank 0's record."""
        joined = {n: {"addr": f"10.0.0.{i}", "port": 1000 + i, "nproc": 2} for i, n in enumerate("cab")}
        record = build_result(joined, previous=["b"], max_nodes=2)
        assert record.nodes == ("b", "a")
        assert (record.master_addr, record.master_port, record.nproc) == ("10.0.0.2", 1002, 2)

    def test_build_result_refuses_a_master_join_record_runner_did_not_write(self) -> None:
        """Group rank 0's join record without an address, port and process count is refused with the node named."""
        for bad in (b"[]", b"not json", b'{"addr": "10.0.0.1", "port": "80", "nproc": 1}', {"addr": 1}):
            with pytest.raises(RendezvousError, match="node 'a'"):
                build_result({"a": bad}, previous=[], max_nodes=1)


class TestSpecCheck:
    def _spec(self, **kw: object) -> JobSpec:
        return JobSpec(name="j", entrypoint=Entrypoint(script="t.py"), **kw)  # type: ignore[arg-type]

    def test_node_local_fields_do_not_change_the_digest(self) -> None:
        """cwd and logs.dir differ between machines without breaking the spec check."""
        a = self._spec(cwd="/a", logs=Logs(dir="/x"))
        b = self._spec(cwd="/b", logs=Logs(dir="/y"))
        assert shared_digest(a) == shared_digest(b)

    def test_diff_names_the_dotted_paths(self) -> None:
        """diff_paths lists every differing field as a dotted path."""
        a = shared_tree(self._spec(nodes=Nodes(1, 2), nproc_per_node=2))
        b = shared_tree(dataclasses.replace(self._spec(nodes=Nodes(1, 3)), nproc_per_node=4))
        assert diff_paths(a, b) == ["nodes.max", "nproc_per_node"]


def test_job_keys_layout() -> None:
    """Keys follow the documented layout and leaf() recovers the node id."""
    keys = JobKeys("/runner/", "job")
    assert keys.join(3, "n1") == b"/runner/job/rounds/3/nodes/n1"
    assert keys.result(3) == b"/runner/job/rounds/3/result"
    assert keys.state("n1").startswith(keys.states)
    assert JobKeys.leaf(keys.join(3, "n1")) == "n1"
