"""runner/system/supervised.py: the one restart loop of the helpers the agent hosts (lighthouse, hosted etcd), its
policy as data; driven here through a hand-written helper that records what the loop asked of it."""

from __future__ import annotations

import asyncio

import structlog
from structlog.testing import capture_logs

from runner.agent.lighthouse import LIGHTHOUSE_POLICY
from runner.rendezvous.etcd.hosted_server import ETCD_POLICY
from runner.system.supervised import RestartPolicy, StartFailed, supervise


class Helper:
    """Exits `exits` times; each start fails when the next entry of `starts` is False."""

    def __init__(self, exits: int, starts: list[bool], stop_after: int | None = None) -> None:
        self.restarts = 0
        self.exits, self.starts, self.stop_after = exits, list(starts), stop_after
        self.calls: list[str] = []

    def stopping(self) -> bool:
        return self.stop_after is not None and len(self.calls) >= self.stop_after

    async def exited(self) -> None:
        self.calls.append("exited")
        if self.exits == 0:
            await asyncio.Event().wait()  # runs for ever: the test ends it by cancelling
        self.exits -= 1

    def reaped(self) -> str:
        self.calls.append("reaped")
        return "exit code 1"

    async def respawn(self) -> None:
        self.calls.append("respawn")
        if self.starts and not self.starts.pop(0):
            raise StartFailed("did not listen")

    def discard(self) -> None:
        self.calls.append("discard")


def run(helper: Helper, policy: RestartPolicy, timeout: float = 5.0) -> str | None:
    async def go() -> str | None:
        try:
            return await asyncio.wait_for(supervise(helper, policy, structlog.get_logger()), timeout)
        except TimeoutError:
            return "still supervising"

    return asyncio.run(go())


FAST = RestartPolicy("x_restarting", max_restarts=3, max_failed_starts=2)


def test_an_exit_is_answered_by_a_restart_and_the_loop_goes_on():
    helper = Helper(exits=2, starts=[True, True])
    with capture_logs() as logs:
        assert run(helper, FAST, timeout=0.5) == "still supervising"
    assert helper.restarts == 2
    assert [e["event"] for e in logs] == ["x_restarting", "x_restarting"]
    assert helper.calls == ["exited", "reaped", "respawn", "exited", "reaped", "respawn", "exited"]


def test_the_restarts_in_all_are_bounded():
    helper = Helper(exits=9, starts=[True] * 9)
    assert run(helper, FAST) == "after 3 restart(s): exit code 1"
    assert helper.restarts == 3


def test_failed_starts_in_a_row_give_it_up_and_each_is_discarded():
    helper = Helper(exits=1, starts=[False, False])
    assert run(helper, FAST) == "after 2 restart(s): did not listen"
    assert helper.calls.count("discard") == 2


def test_a_stop_ends_the_loop_without_a_restart():
    helper = Helper(exits=1, starts=[True], stop_after=1)
    assert run(helper, FAST) is None
    assert helper.restarts == 0


def test_the_helpers_policies_as_documented():
    """docs/replica_groups.md: up to 5 failed starts in a row and 20 restarts; the hosted etcd: 3 restarts after
    1, 2, 4 s, one try each."""
    assert (LIGHTHOUSE_POLICY.max_restarts, LIGHTHOUSE_POLICY.max_failed_starts) == (20, 5)
    assert [LIGHTHOUSE_POLICY.pause(n) for n in (1, 2)] == [0.0, 0.0]
    assert (ETCD_POLICY.max_restarts, ETCD_POLICY.max_failed_starts) == (3, 1)
    assert [ETCD_POLICY.pause(n) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
