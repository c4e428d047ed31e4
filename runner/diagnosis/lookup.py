"""Where a worker's failure looks for its root cause next: the rule that tells a cause from a collateral, once.

A worker that exited with an error is its own root cause unless what it left says otherwise:
- its error is a collective mismatch: the rank whose call differed is the cause (the flight recorder names it);
- its error is a collective timeout: it gave up on a hang, whose culprit is the cause (the recorder names it);
- it died of a closed connection (evidence.COLLATERAL): another node's failure is the cause, heard of within a
  bounded wait (that node's FAILED state, or its lease lapsing with its host).
The first that applies decides (a mismatch often closes connections too, and says more). Without a flight recorder
(watchdog.flight_recorder: 0) neither mismatch nor timeout can be followed: the rank stays the root cause.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from runner.diagnosis.evidence import collateral
from runner.diagnosis.hang import collective_mismatch, collective_timeout

if TYPE_CHECKING:
    from runner.diagnosis.failure import Failure


class Look(enum.Enum):
    """What the state gathers next for a worker's failure."""

    MISMATCH = "mismatch"  # the recorder's records: the rank whose call differed
    TIMEOUT = "timeout"  # the recorder's records: the hang's culprit
    PEER = "peer"  # other nodes' news: the node whose failure closed the connection
    OWN = "own"  # nothing: the failure is its own root cause


def look_for(failure: Failure, *, recorder: bool) -> Look:
    """The next evidence `failure` needs (the module's rule); `recorder`: the flight recorder is on."""
    if recorder and collective_mismatch(failure):
        return Look.MISMATCH
    if recorder and collective_timeout(failure):
        return Look.TIMEOUT
    if collateral(failure.stderr_tail):
        return Look.PEER
    return Look.OWN
