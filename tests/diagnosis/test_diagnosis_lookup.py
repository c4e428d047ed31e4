"""runner/diagnosis/lookup.py: where a worker's failure looks for its root cause next, the one rule that tells a cause
from a collateral (issue 41: the rule stated once, in the diagnosis, not spread over the states).

Each case is a failure built from a real worker's words (torch 2.13's gloo and c10d), as `worker_failure` builds it
from a log dir; the state (runner/states/running.py) gathers what the answer names and records the result; the
end-to-end paths are tests/diagnosis/test_root_cause.py (a collateral), tests/diagnosis/test_hang_culprit.py (a timeout) and
tests/diagnosis/test_hangs.py (a mismatch).

Seen failing: with the timeout checked before the mismatch (the mismatch case that also timed out), with the
recorder ignored (the two `recorder=False` cases), and with the collateral read from the reason instead of the
stderr tail (the closed-connection case).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.diagnosis.failure import worker_failure
from runner.diagnosis.lookup import Look, look_for

GLOO_CLOSED = """Traceback (most recent call last):
  File "/work/train.py", line 12, in <module>
    dist.all_reduce(t)
RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.3]:32904
"""
GLOO_TIMEOUT = """Traceback (most recent call last):
  File "/work/train.py", line 12, in <module>
    dist.all_reduce(t)
RuntimeError: [../gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 5000ms for recv operation to complete
"""
GLOO_MISMATCH = """Traceback (most recent call last):
  File "/work/train.py", line 14, in <module>
    dist.all_reduce(t)
RuntimeError: [../gloo/transport/tcp/pair.cc:504] op.preamble.length <= op.nbytes. 64 vs 32
Is there a distributed collective mismatch? Timed out waiting 5000ms for recv operation to complete
"""
OWN = """Traceback (most recent call last):
  File "/work/train.py", line 9, in <module>
    raise ValueError("bad batch 7")
ValueError: bad batch 7
"""


def failure_of(stderr: str, tmp_path: Path, code: int = 1):
    log_dir = tmp_path / "rank_0"
    log_dir.mkdir(exist_ok=True)
    (log_dir / "stderr.log").write_text(stderr)
    return worker_failure(0, 0, 0, code, str(log_dir), stderr)


@pytest.mark.parametrize(("stderr", "recorder", "look"), [
    (OWN, True, Look.OWN),
    (GLOO_CLOSED, True, Look.PEER),
    (GLOO_CLOSED, False, Look.PEER),  # another node's news needs no recorder
    (GLOO_TIMEOUT, True, Look.TIMEOUT),
    (GLOO_TIMEOUT, False, Look.OWN),  # without a recorder the rank that timed out stays the root cause
    (GLOO_MISMATCH, True, Look.MISMATCH),  # a mismatch also times out: the mismatch says more
    (GLOO_MISMATCH, False, Look.OWN),
])
def test_a_workers_failure_looks_where_its_words_point(stderr: str, recorder: bool, look: Look,
                                                       tmp_path: Path) -> None:
    assert look_for(failure_of(stderr, tmp_path), recorder=recorder) is look


def test_a_signal_with_no_words_is_its_own_root_cause(tmp_path: Path) -> None:
    assert look_for(failure_of("", tmp_path, code=-9), recorder=True) is Look.OWN


@given(st.text(max_size=300))
def test_any_stderr_gets_one_answer_and_words_without_a_sign_are_the_workers_own(text: str) -> None:
    """Bounded and total: any text gives one of the four answers; text with none of the signs gives OWN."""
    log_dir = Path("/nonexistent-rank-dir")
    failure = worker_failure(0, 0, 0, 1, str(log_dir), text)
    found = look_for(failure, recorder=True)
    assert found in set(Look)
    signs = ("Connection", "Broken pipe", "Timed out", "timeout", "mismatch", "Mismatch", "Received data size",
             "DistNetworkError", "recvValue", "failed to recv", "NCCL", "Socket Timeout", "connect()", "Watchdog",
             "DistBackendError", "wait timeout", "op.preamble")
    if not any(sign in text for sign in signs):
        assert found is Look.OWN
