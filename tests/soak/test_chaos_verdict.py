"""The chaos soak's verdict (bench/soak/verdict.py, schedule.py, the replica soak's survivor check): a run passes only if
it tried. Real soak objects (Soak, Job, Agent, the tally, the deck), real files and a real process for an agent; no
agents, etcd or torch: these run in a second, beside tests/soak/test_chaos.py's real soaks (marked `soak`)."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import ROOT
from soak_helpers import soak_args

from bench.soak.bounds import ALL_CLASSES
from bench.soak.model import Agent, Job, Violation
from bench.soak.procs import ident
from bench.soak.replicas import DETECT_S, Down, ReplicaSoak
from bench.soak.schedule import Deck
from bench.soak.soak import Soak
from bench.soak.state import Options
from bench.soak.verdict import MIN_HELD, Tally, skipped_from_output


@pytest.fixture
def made(tmp_path):
    """Makes a soak whose folder is the test's own (a soak only built makes none: nothing is left under /tmp)."""
    def make(cls: type[Soak], args: Options) -> Soak:
        return cls(args, base=tmp_path)
    return make


def printed(soak: Soak, untried: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        soak.print_table(None, "", untried)
    return out.getvalue()


def test_a_class_that_never_finds_a_target_fails_the_run_and_is_named(made):
    """kill_worker enabled, no worker ever runs: every draw finds no target. The run fails naming the class (it used
    to count the draws as 'skipped' and pass)."""
    soak = made(Soak, soak_args(classes="kill_worker"))
    soak.select_classes()
    job = soak.new_job()  # a real job folder and spec (`runner validate` accepts it); no agent started
    soak.deck = Deck(soak.state.rng, [c for c in soak.classes if c not in soak.state.disabled])
    now = time.monotonic()
    for _ in range(15):  # 3 draws, each tried 5 times
        soak.fault_step(job, now)
        now = max(now, soak.next_fault)
    assert soak.state.tally.per_class["kill_worker"].drawn == 3
    assert soak.state.tally.per_class["kill_worker"].no_target == 3
    failures = soak.state.tally.failures()
    assert failures == ["no fault fired: the run tested nothing (skipped: none)",
                        "class kill_worker never fired: drawn 3 time(s), no target each time"]
    out = printed(soak, failures)
    assert "NEVER FIRED" in out
    assert "FAILED: seed 1: no invariant broke, but the run did not try everything" in out
    assert "class kill_worker never fired" in out
    assert "OK:" not in out


def test_an_enabled_class_never_drawn_fails_the_run():
    tally = Tally(("kill_worker", "kill_agent"))
    tally.drawn("kill_worker")
    tally.injected("kill_worker")
    assert tally.failures() == [("class kill_agent never fired: never drawn (the run was too short for its 2 enabled "
                                "classes: lengthen --duration or --job-window, or narrow --classes)")]


def test_a_run_whose_only_class_was_skipped_by_a_setting_fails_it_tested_nothing(made):
    """`bench/chaos.py --nodes 2 --classes late_join` said "every invariant held, every enabled class fired" with 0
    faults: late_join skipped (no room to join), nothing enabled, nothing required. No fault fired: the run fails."""
    tally = Tally(("late_join",))
    tally.disable("late_join", "nodes is 2: no room for a late node")
    why = "no fault fired: the run tested nothing (skipped: late_join (nodes is 2: no room for a late node))"
    assert tally.failures() == [why]


def test_a_class_the_machine_cannot_run_is_reported_skipped_with_its_reason_and_not_required(made):
    soak = made(Soak, soak_args(classes="disk_full,kill_worker"))
    soak.select_classes()
    soak.state.tally.disable("disk_full", "cannot mount a tmpfs for logs.dir (permission denied)")
    soak.state.tally.drawn("kill_worker")
    soak.state.tally.injected("kill_worker")
    assert soak.state.tally.failures() == []
    out = printed(soak, [])
    assert "skipped: cannot mount a tmpfs for logs.dir (permission denied)" in out
    # what tests/soak/test_chaos.py skips with when it asked for disk_full; classes left out by --classes are not listed
    assert skipped_from_output(out) == {"disk_full": "cannot mount a tmpfs for logs.dir (permission denied)"}


def test_per_invariant_counts_are_printed_and_an_expectation_that_did_not_apply_is_counted(made):
    """Every expectation ends held, broke or did not apply (its check returned None): all counted, by the class that
    set it up; the table prints them."""
    soak = made(Soak, soak_args(classes="kill_guard,kill_agent"))
    soak.select_classes()
    job = soak.new_job()
    soak.state.firing = "kill_guard"
    soak.state.expect(job, "guard_replaced", 10, lambda: None, lambda: "")
    soak.state.firing = "kill_agent"
    soak.state.expect(job, "lease_revoked", 10, lambda: True, lambda: "")
    soak.state.expect(job, "nothing_survives", 10, lambda: True, lambda: "")
    soak.state.firing = ""
    soak.checks.check_expects(job)
    assert job.expects == []
    guard = soak.state.tally.per_invariant["guard_replaced"]
    assert (guard.held, guard.broke, guard.did_not_apply, guard.classes) == (0, 0, 1, {"kill_guard"})
    assert soak.state.tally.per_invariant["lease_revoked"].held == 1
    for cls in ("kill_guard", "kill_agent"):
        soak.state.tally.drawn(cls)
        soak.state.tally.injected(cls)
    failures = soak.state.tally.failures()
    assert failures == [(f"invariant guard_replaced held 0 time(s), fewer than the minimum {MIN_HELD}, though "
                        "kill_guard fired and brought it, and nothing else it brings held (did not apply: 1 the agent "
                        "ended first)")]
    out = printed(soak, failures)
    header = next(line for line in out.splitlines() if line.startswith("| invariant"))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "invariant", "held", "broke", "did not apply", "min held", "brought by"]
    row = next(line for line in out.splitlines() if line.startswith("| guard_replaced"))
    assert [c.strip() for c in row.strip("|").split("|")] == [
        "guard_replaced", "0", "0", "1 (1 the agent ended first)", str(MIN_HELD), "kill_guard"]


def test_an_expectation_past_its_deadline_breaks_and_is_counted(made):
    soak = made(Soak, soak_args(classes="kill_guard"))
    job = soak.new_job()
    soak.state.firing = "kill_guard"
    soak.state.expect(job, "guard_replaced", -1, lambda: False, lambda: "no successor")
    with pytest.raises(Violation, match="guard_replaced: no successor"):
        soak.checks.check_expects(job)
    soak.state.tally.broke("guard_replaced")
    assert soak.state.tally.per_invariant["guard_replaced"].broke == 1


def test_the_deck_deals_every_enabled_class_within_its_first_round_and_puts_back_one_with_no_target():
    classes = [c for c in ALL_CLASSES if c != "late_join"]
    deck = Deck(random.Random("7:1"), classes)
    first = [deck.draw() for _ in classes]
    assert sorted(first) == sorted(classes)
    again = Deck(random.Random("7:1"), classes)
    assert [again.draw() for _ in classes] == first  # seeded: the same job draws the same order
    deck.put_back("etcd_wipe")
    assert deck.draw() == "etcd_wipe"  # the round was dealt: the put-back class comes next
    assert Deck(random.Random(1), []).draw() is None


def test_bench_chaos_is_only_an_entry():
    """`python bench/chaos.py` defines nothing: the soak's modules load once, under bench.soak (it used to load as
    __main__ and again as bench.chaos with --replica-groups)."""
    tree = ast.parse((ROOT / "bench" / "chaos.py").read_text())
    assert not [n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    assert not (ROOT / "bench" / "chaos_replicas.py").exists()


# ---------------------------------------------------------------------------------------- survivor_advanced


def step_lines(out: Path, run_dir: str, group: int, pid: int, attempt: int, lines: list[tuple[float, int, int]]):
    """A worker's start marker and its step lines (time, step, groups), as bench/workers/chaos_ft.py writes them."""
    (out / f"start-g{group}-{pid}.json").write_text(json.dumps(
        {"pid": pid, "start_ticks": 0, "job_run_dir": run_dir, "run_dir": run_dir, "group": group,
         "attempt": attempt, "rank": 0, "node": "n0"}))
    (out / f"steps-g{group}-{pid}.log").write_text(
        "".join(f"step={s} commit=1 groups={g} time={t}\n" for t, s, g in lines))


@pytest.fixture
def replica_job(tmp_path, made):
    """A replica soak and one job with one finished agent (a real process), its folders made."""
    soak = made(ReplicaSoak, soak_args(replica_groups=True, hosted=False, steps=1000))
    d = tmp_path / "job1"
    job = Job(1, "chaos-rg-1-1", "tok", d, d / "logs", d / "job.yaml", ["n0"], "")
    job.out.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    me = ident(proc.pid)
    proc.wait()
    assert me is not None
    agent = Agent("n0", 0, proc, me, d / "agent.log", time.time())
    soak.state.jobs.append(job)
    soak.world.add_job(1)
    return soak, job, agent


def survivor_case(soak, job, agent, back_after: float, alone_at: float | None):
    """Group 0's worker killed at t0; group 1 stepped every 0.1 s with both groups before it; group 0 commits again
    `back_after` s later; group 1 commits alone at t0 + `alone_at` (None: never, it waited for group 0)."""
    t0 = time.time() - 100
    run_dir = str(job.dir / "run")
    before = [(t0 - 5 + 0.1 * i, 100 + i, 2) for i in range(50)]
    after = [(t0 + back_after + 0.1 * i, 150 + i, 2) for i in range(1, 20)]
    alone = [(t0 + alone_at, 150, 1)] if alone_at is not None else []
    step_lines(job.out, run_dir, 1, 1001, 0, before + alone + after)
    step_lines(job.out, run_dir, 0, 1000, 0, [(t, s, g) for t, s, g in before])
    step_lines(job.out, run_dir, 0, 1002, 1, [(t0 + back_after, 150, 2)])
    down = Down(agent, run_dir, 0, 0, 1000, t0, "kill")
    soak.world.downs[1].append(down)
    return down


def test_a_survivor_that_waits_for_the_dead_group_breaks_survivor_advanced(replica_job):
    """Group 0 down 4 s after a kill (lighthouse detection 2.1 s + slack + two 0.1 s steps is 2.8 s): the other group
    committed nothing alone, it waited. This used to be 'not applicable' (anything back within 6 s was)."""
    soak, job, agent = replica_job
    down = survivor_case(soak, job, agent, back_after=4.0, alone_at=None)
    with pytest.raises(Violation) as caught:
        soak.checks.check_survivor(job, down)
    assert caught.value.invariant == "survivor_advanced"
    assert "committed no step alone" in caught.value.detail
    assert soak.state.tally.per_invariant["survivor_advanced"].broke == 1


def test_a_survivor_that_commits_alone_holds(replica_job):
    soak, job, agent = replica_job
    down = survivor_case(soak, job, agent, back_after=4.0, alone_at=2.3)
    soak.checks.check_survivor(job, down)
    count = soak.state.tally.per_invariant["survivor_advanced"]
    assert (count.held, count.classes) == (1, {"kill_worker"})


def test_a_group_back_before_the_lighthouse_could_drop_it_does_not_apply_and_says_why(replica_job):
    soak, job, agent = replica_job
    down = survivor_case(soak, job, agent, back_after=DETECT_S["kill"] - 0.5, alone_at=None)
    soak.checks.check_survivor(job, down)
    count = soak.state.tally.per_invariant["survivor_advanced"]
    assert (count.held, count.did_not_apply) == (0, 1)
    assert list(count.moot) == ["the killed group was back before the quorum could drop it and two normal steps passed"]


def moot_after_kill(soak, job, agent, run_dir: str, t0: float):
    """Group 0's worker 1002 (attempt 1) killed at t0, judged: survivor_advanced neither held nor broke, it did not
    apply; its count (the reason is each test's)."""
    down = Down(agent, run_dir, 0, 1, 1002, t0, "kill")
    soak.world.downs[1].append(down)
    soak.checks.check_survivor(job, down)
    count = soak.state.tally.per_invariant["survivor_advanced"]
    assert (count.held, count.broke, count.did_not_apply) == (0, 0, 1)
    return count


def test_a_worker_killed_while_joining_is_held_to_the_collective_timeout(replica_job):
    """CI's seed 1 of --replica-groups: group 0's new worker (attempt 1) was killed 2 s after its start, before it ended
    a step; the other group, in the new quorum's collective with it, was silent for 3.8 s until a lighthouse kill cut
    the window. The collective's timeout holds the other group there, as for a hang: not a broken survivor. The same
    3.8 s after a worker that had stepped in its attempt still breaks it (the test above)."""
    soak, job, agent = replica_job
    t0 = time.time() - 100
    run_dir = str(job.dir / "run")
    before = [(t0 - 5 + 0.1 * i, 100 + i, 1) for i in range(50)]  # group 1 alone, group 0's attempt 0 long gone
    step_lines(job.out, run_dir, 1, 1001, 0, before + [(t0 + 3.8 + 0.1 * i, 150 + i, 2) for i in range(5)])
    step_lines(job.out, run_dir, 0, 1000, 0, [(t0 - 20, 60, 2)])
    step_lines(job.out, run_dir, 0, 1002, 1, [])  # killed before its first step ended
    step_lines(job.out, run_dir, 0, 1003, 2, [(t0 + 3.8, 150, 2)])
    count = moot_after_kill(soak, job, agent, run_dir, t0)
    assert "it was joining" in next(iter(count.moot))
    assert DETECT_S["kill"] + 0.5 + 0.2 < 3.8 < DETECT_S["hang"]


def test_a_group_already_still_before_the_fault_was_not_stepping(replica_job):
    """A README run's seed 1: the other group's last commit 2 s before the kill (0.1 s steps: it was already still,
    in a quorum with the killed group's joining worker); it does not apply, where a 3 s window called it stepping."""
    soak, job, agent = replica_job
    t0 = time.time() - 100
    run_dir = str(job.dir / "run")
    step_lines(job.out, run_dir, 1, 1001, 0, [(t0 - 7 + 0.1 * i, 100 + i, 1) for i in range(50)])  # the last: t0-2.1
    step_lines(job.out, run_dir, 0, 1000, 0, [(t0 - 20, 60, 2)])
    step_lines(job.out, run_dir, 0, 1002, 1, [(t0 - 1.5, 149, 2)])
    step_lines(job.out, run_dir, 0, 1003, 2, [(t0 + 9.1, 150, 2)])
    count = moot_after_kill(soak, job, agent, run_dir, t0)
    assert next(iter(count.moot)).startswith("the other group was not stepping")


def test_a_class_is_tested_when_one_invariant_it_brings_held() -> None:
    """stop_worker's stop branch brought hang_detected (held), its pause branch pause_went_on (did not apply: the
    worker was restarted before its SIGCONT): the class was tested and the run passes; had neither held, it fails."""
    tally = Tally(("stop_worker",))
    tally.drawn("stop_worker")
    tally.injected("stop_worker")
    tally.moot("pause_went_on", "the paused worker was gone before its SIGCONT", "stop_worker")
    assert len(tally.failures()) == 1 and "pause_went_on held 0" in tally.failures()[0]
    tally.held("hang_detected", "stop_worker")
    assert tally.failures() == []


# ---------------------------------------------------------------------------------------- the soak's folder


@pytest.mark.parametrize("cls", [Soak, ReplicaSoak], ids=["default", "replica_groups"])
def test_a_soak_only_built_leaves_no_folder_and_teardown_removes_the_one_it_made(cls, tmp_path, monkeypatch):
    """Building a soak made its chaos-SEED-* folder under TMPDIR at once, so every test that built one without
    running it left an empty folder in /tmp. The folder is made by the run (make_folder, before setup) and removed
    by its teardown; a folder given to the soak is its caller's, and teardown leaves it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # (tempfile reads TMPDIR once per process)
    soak = cls(soak_args(hosted=False, replica_groups=cls is ReplicaSoak))
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError, match="made by its setup"):
        _ = soak.state.base
    made_now = soak.state.make_folder()
    assert made_now.parent == tmp_path and made_now.name.startswith("chaos-1-") and made_now.is_dir()
    soak.teardown(keep=False)
    assert list(tmp_path.iterdir()) == []
    given = tmp_path / "given"
    given.mkdir()
    owned = cls(soak_args(hosted=False), base=given)
    assert owned.state.make_folder() == given
    owned.teardown(keep=False)
    assert given.is_dir()


class PlannedSoak(Soak):
    """The soak's own loop (run, owed, the verdict) over jobs whose faults are planned: no etcd, no agent. Each job
    fires the classes `plan` gives for its turn, out of those it was allowed to draw."""

    def __init__(self, args: Options, base: Path, plan: list[set[str]]) -> None:
        super().__init__(args, base=base)
        self.plan = plan
        self.drew: list[list[str] | None] = []

    def setup(self) -> None:
        self.select_classes()

    def teardown(self, keep: bool) -> None:
        pass

    def run_job(self, soak_end: float, only: list[str] | None = None) -> None:
        self.state.jobs.append(self.new_job())
        self.drew.append(only)
        allowed = only or self.state.tally.enabled()
        for cls in allowed:
            self.state.tally.drawn(cls)
            if cls in self.plan[len(self.drew) - 1]:
                self.state.tally.injected(cls)
            else:
                self.state.tally.no_target(cls)


@pytest.mark.parametrize(("plan", "drew", "code"), [
    ([{"kill_worker", "kill_agent"}], [None], 0),  # everything fired: no make-up job
    ([{"kill_worker"}, {"kill_agent"}], [None, ["kill_agent"]], 0),  # the missed class fired in its make-up job
    ([{"kill_worker"}, set(), {"kill_agent"}], [None, ["kill_agent"]], 1),  # missed twice: one make-up, then it fails
])
def test_a_class_the_draw_left_unfired_gets_one_make_up_job_then_fails_the_run(tmp_path, plan, drew, code):
    """A random seed drew etcd_restart only while an etcd_stop held etcd down; the job then trained and the run failed
    "did not try everything" by the luck of the draw (CI). Such a class gets one more job, drawing only the classes
    that never fired; a class that misses that one too still fails the run, named."""
    soak = PlannedSoak(soak_args(classes="kill_worker,kill_agent", duration=0.0), tmp_path, plan)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert soak.run() == code
    assert soak.drew == drew
    if code:
        assert "class kill_agent never fired: drawn 2 time(s), no target each time" in out.getvalue()
    else:
        assert "OK: every invariant held, every enabled class fired" in out.getvalue()
