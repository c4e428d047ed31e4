"""The soak's own etcd, real: a signal no fault sent is a violation; etcd's own exit is restarted and counted as
infrastructure; the key-expiry check counts a lease's TTL from etcd's last start (etcd renews every lease then).

Found by CI: the soak's etcd ended unseen near a job's end, the check started it again and read a lease etcd had just
renewed (ttl 0 s, "still on a live lease"), and the soak blamed the runner for keys it could not have left.
"""

from __future__ import annotations

import contextlib
import io
import signal
import subprocess
import time
from pathlib import Path

import pytest
from soak_helpers import soak_args

from bench.soak.bounds import ETCD_CRASHED, LEASE_TTL_S, PREFIX
from bench.soak.infra import ChaosEtcd
from bench.soak.model import Agent, Violation
from bench.soak.procs import Proc
from bench.soak.soak import Soak


@pytest.fixture
def soak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A soak (external etcd) whose etcd runs; everything stopped and removed after the test."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    s = Soak(soak_args(hosted=False, classes="etcd_stop"), base=tmp_path)
    etcd = s.state.etcd = ChaosEtcd(tmp_path / "etcd-data", None)
    etcd.start()
    yield s
    etcd.kill()


def etcdctl(etcd: ChaosEtcd, *args: str) -> str:
    return etcd.etcdctl(*args).stdout


def test_a_signal_no_fault_sent_to_the_soaks_etcd_is_a_violation_with_its_log(soak: Soak) -> None:
    assert soak.state.etcd is not None and soak.state.etcd.proc is not None
    soak.checks.check_own_etcd()  # running: nothing to say
    soak.state.etcd.proc.send_signal(signal.SIGTERM)
    soak.state.etcd.proc.wait(15)
    with pytest.raises(Violation) as caught:
        soak.checks.check_own_etcd()
    assert caught.value.invariant == "etcd_unharmed"
    assert "died of SIGTERM and no fault sent it" in caught.value.detail
    assert "its log ends:" in caught.value.detail


def test_etcd_exiting_by_itself_is_restarted_counted_and_printed_not_blamed_on_the_runner(soak: Soak) -> None:
    etcd = soak.state.etcd
    assert etcd is not None and etcd.proc is not None
    # SIGQUIT: etcd does not handle it, so Go's runtime dumps its goroutines and exits with code 2 -- an exit of
    # etcd's own, with a stack in its log, as a panic ends it.
    etcd.proc.send_signal(signal.SIGQUIT)
    etcd.proc.wait(15)
    assert etcd.proc.returncode == 2
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        soak.checks.check_own_etcd()
    assert etcd.up and etcdctl(etcd, "endpoint", "health")  # started again, answering
    assert "the soak's etcd exited by itself with code 2" in out.getvalue()
    printed_tail = out.getvalue().split("its log ends:\n", 1)[1].strip()
    assert printed_tail and printed_tail.splitlines()[-1] in etcd.data_dir.parent.joinpath("etcd-data.log").read_text()
    assert len(soak.state.etcd_crashes) == 1
    with contextlib.redirect_stdout(out):
        soak.print_table(None, "", [])
    row = next(line for line in out.getvalue().splitlines() if ETCD_CRASHED in line)
    assert row.strip("| ").endswith("1")


def test_an_etcd_a_fault_holds_down_is_not_a_crash(soak: Soak) -> None:
    etcd = soak.state.etcd
    assert etcd is not None
    etcd.stop()  # what the etcd_stop fault does
    soak.checks.check_own_etcd()
    assert not etcd.up and soak.state.etcd_crashes == []
    etcd.start()
    assert etcd.exited_unasked() is None


def test_key_expiry_is_checked_a_lease_ttl_after_etcds_last_start(soak: Soak) -> None:
    """A lease left by an agent whose revoke found etcd down: etcd renews it when it starts again, so it expires a
    TTL after that start, not after the agent's end. The check waits for it (before, it read ttl 0 and failed)."""
    etcd = soak.state.etcd
    assert etcd is not None
    job = soak.new_job()
    lease = etcdctl(etcd, "lease", "grant", str(int(LEASE_TTL_S))).split()[1]
    etcdctl(etcd, "put", f"{PREFIX}/{job.name}/control/rounds/3/leader", "n0", f"--lease={lease}")
    proc = subprocess.Popen(["true"])
    proc.wait()
    agent_end = time.time() - LEASE_TTL_S  # the agents ended a TTL ago, while etcd was down
    etcd.kill()
    etcd.start()  # renews the lease: it lives about a TTL more
    job.agents.append(_ended_agent(proc, agent_end, job.dir))
    soak.checks.check_keys(job)  # waits for the renewed lease; raises if a key is still on a live lease
    assert time.time() >= etcd.started_at + LEASE_TTL_S
    assert "leader" not in etcdctl(etcd, "get", "--prefix", f"{PREFIX}/{job.name}/", "--keys-only")


def _ended_agent(proc: subprocess.Popen[bytes], ended: float, where: Path) -> Agent:
    """An agent record that ended at `ended` (its process a real one, already reaped)."""
    return Agent("n0", 0, proc, Proc(proc.pid, 0), where / "n0.out", ended, code=0, ended=ended)
