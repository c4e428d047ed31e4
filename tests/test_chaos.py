"""The chaos soak (bench/chaos.py), short: real agents, real etcd, real torch workers, seeded random faults.

Marked `soak` (and `integration`): `pytest -m soak` runs only these, `-m "not soak"` leaves them out. Each test runs
the soak for SOAK_S seconds of faults (the job running then must still end, within the soak's own bound) with a few
classes of its own, so that each class fires in so short a run (the soak fails when an enabled class never fired, or
when an invariant a fired class brings never held: bench/soak/verdict.py); together they cover every class of the
base mode, and the replica-group mode's faults on a group or the lighthouse: seed 1
with an external etcd and with a hosted one, seed 1 drawing only a full logs disk and worker kills, a random seed
with classes drawn from it (printed, with the command that replays it), and seed 1 of the replica-group mode
(`--replica-groups`: single-node jobs of 2 TorchFT groups and the hosted lighthouse; skipped without torchft). The
soak exits non-zero on any broken invariant or untried class, naming the seed and what failed; its whole output is
printed, and its tail is the assertion message. Without root the soak skips the disk_full and partition classes and
says why; a test that asked for one of them then skips with that reason (it does not pass).

A failure that is one of the runner bugs the soak found (KNOWN_BUGS: matched on the soak's output) is reported as
xfail with that bug's description instead (pytest.xfail, the same as an xfail(strict=False) mark, but only for that
bug); any other failure fails the test. Once a bug is fixed, delete its entry.
"""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import ROOT

from bench.soak.verdict import skipped_from_output

pytestmark = [pytest.mark.integration, pytest.mark.soak, pytest.mark.timeout(480)]

SOAK_S = 30  # seconds of faults; the job running then must still end (typically within 30 s)
FIXED_SEED = 1
CHAOS = ROOT / "bench" / "chaos.py"
# Each test's classes: few enough to fire each within SOAK_S (a fault every 4 s +-50 %, the first after the workers
# start; a class with no target is dealt again later), and together every class of the base mode.
EXTERNAL = ("kill_worker", "kill_agent", "etcd_wipe", "partition", "late_join")
HOSTED = ("stop_worker", "kill_guard", "etcd_stop", "etcd_restart")
# A random seed's draw: not signal_agent or kill_agent with --hosted (either may take the hosting node, which ends the
# job, a documented loss, before the other classes fired).
RANDOM_FROM = ("kill_worker", "stop_worker", "kill_agent", "kill_guard", "signal_agent", "etcd_stop", "etcd_restart",
               "etcd_wipe", "partition")
# The replica-group mode's faults on a group or the lighthouse (its signal_agent, kill_agent and disk_full each cost a
# whole run or more of the window: all 7 classes do not fire in 30 s; the base mode's tests draw those three).
REPLICAS = ("kill_worker", "stop_worker", "kill_lighthouse", "kill_guard")

KNOWN_BUGS: dict[str, Callable[[str], bool]] = {}


def soak(tmp: Path, seed: int, classes: tuple[str, ...], *extra: str) -> tuple[int, str]:
    """Run bench/chaos.py for SOAK_S seconds, its folder under `tmp` (a failing soak keeps it there); (exit code,
    output). Stopped with SIGTERM (its cleanup runs) if it overruns, then SIGKILLed."""
    argv = [sys.executable, str(CHAOS), "--seed", str(seed), "--duration", str(SOAK_S), "--job-window", str(SOAK_S),
            "--steps", "150", "--failure-every", "4", "--classes", ",".join(classes), *extra]
    print("replay: python " + " ".join(argv[1:]), flush=True)
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TMPDIR": str(tmp)})
    try:
        out, _ = proc.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        out += "\n(the soak overran its 400 s and was stopped)"
    print(out)
    return proc.returncode, out


def verdict(code: int, out: str, what: str, asked: tuple[str, ...]) -> None:
    """Skip when the machine could not run a class the test asked for; pass on exit 0; xfail on a known runner bug;
    fail otherwise."""
    if code == 0 and (skipped := {c: why for c, why in skipped_from_output(out).items() if c in asked}):
        pytest.skip("; ".join(f"class {c} skipped: {why}" for c, why in sorted(skipped.items())))
    if code == 0:
        assert "OK: every invariant held, every enabled class fired" in out
        return
    for bug, matches in KNOWN_BUGS.items():
        if matches(out):
            pytest.xfail(bug)
    pytest.fail(f"{what}: exit code {code}\n{out[-6000:]}")


@pytest.mark.parametrize("hosted", [False, True], ids=["external-etcd", "hosted-etcd"])
def test_chaos_soak_fixed_seed(hosted: bool, tmp_path: Path) -> None:
    classes = HOSTED if hosted else EXTERNAL
    code, out = soak(tmp_path, FIXED_SEED, classes, *(["--hosted"] if hosted else []))
    verdict(code, out, f"seed {FIXED_SEED}", classes)


def test_chaos_soak_full_logs_disk(tmp_path: Path) -> None:
    """Seed 1 drawing only disk_full and kill_worker (it found the full-disk bugs: the agent ended with exit 3)."""
    classes = ("disk_full", "kill_worker")
    code, out = soak(tmp_path, FIXED_SEED, classes)
    verdict(code, out, f"seed {FIXED_SEED}, disk_full and kill_worker", classes)


def test_chaos_soak_random_seed(tmp_path: Path) -> None:
    seed = random.SystemRandom().randrange(1, 10**6)
    hosted = seed % 2 == 1
    pool = [c for c in RANDOM_FROM if not (hosted and c in ("signal_agent", "kill_agent"))]
    classes = tuple(random.Random(seed).sample(pool, 3))
    print(f"chaos soak: random seed {seed} ({'hosted' if hosted else 'external'} etcd), classes {classes}", flush=True)
    code, out = soak(tmp_path, seed, classes, *(["--hosted"] if hosted else []))
    verdict(code, out, f"random seed {seed}", classes)


@pytest.mark.skipif(importlib.util.find_spec("torchft") is None or
                    not (Path(sys.executable).parent / "torchft_lighthouse").exists(),
                    reason="torchft is not installed (pip install -e '.[ft]'): --replica-groups runs real TorchFT")
def test_chaos_soak_replica_groups(tmp_path: Path) -> None:
    """Seed 1 of --replica-groups: one agent, 2 groups of a real TorchFT worker, the hosted lighthouse; worker kills and
    hangs, lighthouse and guard kills. Beyond the soak's invariants: the other group commits alone while a killed group
    is down for the quorum, report.json lists each group's restarts."""
    code, out = soak(tmp_path, FIXED_SEED, REPLICAS, "--replica-groups")
    verdict(code, out, f"seed {FIXED_SEED}, replica groups", REPLICAS)
