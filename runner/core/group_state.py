"""Where a group's agent is: the states of the group machine (runner/core/machine.py), apart from the machine.

Its own module so that the context (runner/core/context.py), which the machine's handlers receive, can name a state
without importing the machine: no import runs both ways between the two.
"""

from __future__ import annotations

import enum


class GroupState(enum.Enum):
    """Where a group's agent is (the group machine's state; the job's own is JobPhase). SHUTDOWN is terminal."""

    INIT = "INIT"
    RENDEZVOUS = "RENDEZVOUS"
    RUNNING = "RUNNING"
    FAILED = "FAILED"
    RESTARTING = "RESTARTING"
    SHUTDOWN = "SHUTDOWN"
