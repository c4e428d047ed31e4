"""The chaos soak (bench/chaos.py), short: real agents, real etcd, real torch workers, seeded random faults.

Marked `soak` (and `integration`): `pytest -m soak` runs only these, `-m "not soak"` leaves them out. Each test runs
the soak for a window of faults of its own (FIXED_S, DISK_S, SOAK_S; the job running then must still end, within the
soak's own bound) with a few classes of its own, so that each class fires in so short a run (the soak fails when an enabled class never fired, or
when an invariant a fired class brings never held: bench/soak/verdict.py); together they cover every class of the
base mode, and the replica-group mode's faults on a group or the lighthouse: seed 1
with an external etcd and with a hosted one, seed 1 drawing only a full logs disk and worker kills, a random seed
with classes drawn from it (printed, with the command that replays it; a red one's failure names the seed and the
replay command and says to add the seed to tests/fixtures/failed_soak_seeds.txt, every seed of which
test_chaos_soak_failed_seed replays on every run), and seed 1 of the replica-group mode
(`--replica-groups`: single-node jobs of 2 TorchFT groups and the hosted lighthouse; skipped without torchft). The
soak exits non-zero on any broken invariant or untried class, naming the seed and what failed; its whole output is
printed, and its tail is the assertion message. Without root the soak skips the disk_full and partition classes and
says why; a test that asked for one of them then skips with that reason (it does not pass; under CI=true it fails:
tests/ci_skips.py).

A failure that is one of the runner bugs the soak found (KNOWN_BUGS: matched on the soak's output) is reported as
xfail with that bug's description instead (pytest.xfail, the same as an xfail(strict=False) mark, but only for that
bug); any other failure fails the test. Once a bug is fixed, delete its entry.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from ci_skips import need
from conftest import ROOT
from soak_helpers import failure_digest
from torchft_mark import needs_torchft

from bench.soak.verdict import skipped_from_output

# One soak at a time (xdist_group): each loads the machine on purpose, and its invariants' bounds assume no other.
pytestmark = [pytest.mark.integration, pytest.mark.soak, pytest.mark.timeout(480), pytest.mark.xdist_group("soak")]

# Seconds of faults per test, and the steps its job trains (enough to outlive the faults: a job that ends early is
# followed by another). The fixed seed's tests take what seed 1 needs to fire every class they ask for, with more than
# a fault interval (2-6 s) to spare, measured on 2 CPUs: the last class first fires at about 17 s with the external
# etcd, 16 s hosted, 15 s with replica groups, 8 s for disk_full and kill_worker. A random seed's 3 classes come in any
# order: it keeps 30 s, time for 5 to 7 faults.
SOAK_S = 30
FIXED_S = 24
DISK_S = 14
FIXED_STEPS = 120
SOAK_STEPS = 150
FIXED_SEED = 1
CHAOS = ROOT / "bench" / "chaos.py"
# Every seed test_chaos_soak_random_seed ever failed on: test_chaos_soak_failed_seed replays each on every run.
FAILED_SEEDS = ROOT / "tests" / "fixtures" / "failed_soak_seeds.txt"
# Each test's classes: few enough to fire each within its window (a fault every 4 s +-50 %, the first after the workers
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

KNOWN_BUGS: dict[str, Callable[[str], bool]] = {
    # (empty: seed 210341's two bugs, a wiped hosted etcd restarted without auth and a node starting while the
    # host's etcd restarted trying to host too, were fixed on 2026-11-28: tests/rendezvous/test_hosted_wipe.py)
}


def soak(tmp: Path, seed: int, classes: tuple[str, ...], *extra: str, window: int = SOAK_S,
         steps: int = SOAK_STEPS) -> tuple[int, str]:
    """Run bench/chaos.py with `window` seconds of faults, its folder under `tmp` (a failing soak keeps it there);
    (exit code, output). Stopped with SIGTERM (its cleanup runs) if it overruns, then SIGKILLed."""
    argv = [sys.executable, str(CHAOS), "--seed", str(seed), "--duration", str(window), "--job-window", str(window),
            "--steps", str(steps), "--failure-every", "4", "--classes", ",".join(classes), *extra]
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


def verdict(code: int, out: str, what: str, asked: tuple[str, ...], then: str = "") -> None:
    """Skip when the machine could not run a class the test asked for (tests/ci_skips.py: a failure under CI=true);
    pass on exit 0; xfail on a known runner bug; fail otherwise, with `then` (what to do next) before the output."""
    if code == 0 and (skipped := {c: why for c, why in skipped_from_output(out).items() if c in asked}):
        need("; ".join(f"class {c} skipped: {why}" for c, why in sorted(skipped.items())))
    if code == 0:
        assert "OK: every invariant held, every enabled class fired" in out
        return
    for bug, matches in KNOWN_BUGS.items():
        if matches(out):
            pytest.xfail(bug)
    pytest.fail(f"{what}: exit code {code}\n{then}{failure_digest(out)}")


@pytest.mark.parametrize("hosted", [False, True], ids=["external-etcd", "hosted-etcd"])
def test_chaos_soak_fixed_seed(hosted: bool, tmp_path: Path) -> None:
    classes = HOSTED if hosted else EXTERNAL
    code, out = soak(tmp_path, FIXED_SEED, classes, *(["--hosted"] if hosted else []), window=FIXED_S,
                     steps=FIXED_STEPS)
    verdict(code, out, f"seed {FIXED_SEED}", classes)


def test_chaos_soak_full_logs_disk(tmp_path: Path) -> None:
    """Seed 1 drawing only disk_full and kill_worker (it found the full-disk bugs: the agent ended with exit 3)."""
    classes = ("disk_full", "kill_worker")
    code, out = soak(tmp_path, FIXED_SEED, classes, window=DISK_S, steps=FIXED_STEPS)
    verdict(code, out, f"seed {FIXED_SEED}, disk_full and kill_worker", classes)


def failed_seeds(path: Path = FAILED_SEEDS) -> list[int]:
    """The seeds listed in FAILED_SEEDS: one a line, `#` starts a comment (the date, what broke); blank lines are
    ignored. Anything else is an error (a seed written wrong would otherwise never be replayed)."""
    seeds = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        if not text.isdigit() or not 0 < int(text) < 10**6:
            raise ValueError(f"{path}:{n}: not a seed (an integer 1..999999, then an optional # comment): {line!r}")
        seeds.append(int(text))
    return seeds


def random_mode(seed: int) -> tuple[bool, tuple[str, ...]]:
    """What a random seed's soak runs, from the seed alone: hosted or not, and its 3 classes."""
    hosted = seed % 2 == 1
    pool = [c for c in RANDOM_FROM if not (hosted and c in ("signal_agent", "kill_agent"))]
    return hosted, tuple(random.Random(seed).sample(pool, 3))


def replay_line(seed: int) -> str:
    """The command that replays a random seed's soak in the suite."""
    return f"CHAOS_SEED={seed} .venv/bin/python -m pytest -q tests/soak/test_chaos.py::test_chaos_soak_random_seed"


def random_seed_soak(tmp_path: Path, seed: int, then: str) -> None:
    hosted, classes = random_mode(seed)
    print(f"chaos soak: random seed {seed} ({'hosted' if hosted else 'external'} etcd), classes {classes}; "
          f"replay: {replay_line(seed)}", flush=True)
    code, out = soak(tmp_path, seed, classes, *(["--hosted"] if hosted else []))
    verdict(code, out, f"random seed {seed}", classes, then)


def test_chaos_soak_random_seed(tmp_path: Path) -> None:
    """A new seed every run (CHAOS_SEED=N replays seed N). A red run names its seed and the replay command, and says
    to add the seed to FAILED_SEEDS, which test_chaos_soak_failed_seed replays on every run after."""
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1, 10**6))
    listed = seed in failed_seeds()
    random_seed_soak(tmp_path, seed, f"Replay: {replay_line(seed)}\n" + (
        f"Seed {seed} is already in {FAILED_SEEDS.relative_to(ROOT)}.\n" if listed else
        f"Add {seed} to {FAILED_SEEDS.relative_to(ROOT)} (a line: the seed, then # the date and what broke), so that "
        f"test_chaos_soak_failed_seed replays it on every run from now on.\n"))


@pytest.mark.parametrize("seed", failed_seeds() or [None], ids=lambda s: f"seed-{s}" if s else "none-listed")
def test_chaos_soak_failed_seed(seed: int | None, tmp_path: Path) -> None:
    """Every seed a random-seed soak ever failed on (FAILED_SEEDS), replayed as that test ran it. With none listed
    yet, the one case checks that the file is there and parses to no seed."""
    if seed is None:
        assert failed_seeds() == []
        return
    random_seed_soak(tmp_path, seed, f"Replay: .venv/bin/python -m pytest -q "
                     f"'tests/soak/test_chaos.py::test_chaos_soak_failed_seed[seed-{seed}]'\n"
                     f"A seed of {FAILED_SEEDS.relative_to(ROOT)} that failed before fails again.\n")


def test_a_red_random_seed_names_its_seed_the_replay_command_and_the_list(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    """The failure message of a red random seed (the soak itself stood in for): its seed, the command that replays it
    in the suite, and where to add it so that every later run replays it."""
    monkeypatch.setenv("CHAOS_SEED", "4242")
    monkeypatch.setattr(sys.modules[__name__], "soak", lambda *a, **k: (1, "FAILED: seed 4242: invariant x broke"))
    with pytest.raises(pytest.fail.Exception) as failed:
        test_chaos_soak_random_seed(tmp_path)
    text = str(failed.value)
    assert text.startswith("random seed 4242: exit code 1\n")
    assert f"Replay: {replay_line(4242)}\n" in text
    assert replay_line(4242) == "CHAOS_SEED=4242 .venv/bin/python -m pytest -q tests/soak/test_chaos.py::test_chaos_soak_random_seed"
    assert "Add 4242 to tests/fixtures/failed_soak_seeds.txt" in text and "FAILED: seed 4242" in text


def test_the_failed_seeds_file_parses_and_a_bad_line_is_refused(tmp_path: Path) -> None:
    """FAILED_SEEDS parses (a seed written wrong would be replayed never); a line that is not a seed is an error."""
    assert all(0 < s < 10**6 for s in failed_seeds())
    good = tmp_path / "good.txt"
    good.write_text("# comment\n\n12  # 2026-01-01, one_world broke\n345\n")
    assert failed_seeds(good) == [12, 345]
    bad = tmp_path / "bad.txt"
    bad.write_text("12\nseed 7\n")
    with pytest.raises(ValueError, match=r"bad\.txt:2: not a seed"):
        failed_seeds(bad)


@needs_torchft
def test_chaos_soak_replica_groups(tmp_path: Path) -> None:
    """Seed 1 of --replica-groups: one agent, 2 groups of a real TorchFT worker, the hosted lighthouse; worker kills and
    hangs, lighthouse and guard kills. Beyond the soak's invariants: the other group commits alone while a killed group
    is down for the quorum, report.json lists each group's restarts."""
    code, out = soak(tmp_path, FIXED_SEED, REPLICAS, "--replica-groups", window=FIXED_S, steps=FIXED_STEPS)
    verdict(code, out, f"seed {FIXED_SEED}, replica groups", REPLICAS)
