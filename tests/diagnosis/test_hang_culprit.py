"""A hang names its culprit (docs/hangs.md): real gloo workers hang four ways; the root cause names the rank.

Each run is examples/jobs/hang_culprit.py under the defaults (workers forked warm from a fork server that preloaded
torch; the flight recorder on): the watchdog finds the heartbeat silence of the ranks that wait, reads every
rank's flight recorder through torch's worker server, and the root cause on the console and in report.json is the
culprit, not the rank that waited.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES, alive

pytestmark = pytest.mark.integration

SPEC = """\
version: 1
name: hc
entrypoint:
  script: {script}
  args: {args}
nproc_per_node: {nproc}
logs:
  dir: ${{LOGS}}
watchdog:
  heartbeat_timeout: 3s
{extra}restart:
  max_restarts: 0
shutdown:
  grace_period: 20s
"""


def run_hang(job, mode: str, *, nproc: int = 2, extra: str = "") -> tuple[dict[str, object], str, object]:
    """Run one hang to its end (no restart): (the failure in report.json, stderr, the Job)."""
    j = job(SPEC.format(script=EXAMPLES / "hang_culprit.py", args=json.dumps([mode]), nproc=nproc, extra=extra))
    res = j.run(timeout=120)
    assert res.returncode == 1, res.stderr[-3000:]
    report = json.loads((j.run_dir() / "report.json").read_text())
    (failure,) = report["failures"]
    assert failure["kind"] == "watchdog" and failure["class"] == "hang"
    return failure, res.stderr, j


@pytest.mark.parametrize(
    ("mode", "finding", "words"),
    [
        ("sleep", "never_entered", "rank 1 (node {node}) never entered all_reduce #4 (process group 0); rank 0 waited"),
        ("skip", "never_entered", "rank 1 (node {node}) never entered all_reduce #4 (process group 0); rank 0 waited"),
        ("stop", "stopped", "rank 1 (node {node}) is stopped (SIGSTOP or SIGTSTP: process state T); rank 0 waited"),
    ],
)
def test_the_root_cause_names_the_rank_that_held_the_others_up(job, mode, finding, words):
    """Rank 1 sleeps, computes without the collective (still beating), or is SIGSTOPped; rank 0 waits in all_reduce.

    Before the flight recorder, the root cause was "rank 0 sent no heartbeat": the rank that waited.
    """
    failure, stderr, j = run_hang(job, mode)
    hang = failure["hang"]
    node = hang["culprits"][0]["node"]
    assert hang["finding"] == finding
    assert [c["rank"] for c in hang["culprits"]] == [1]
    assert failure["rank"] == 1
    assert f"root cause (attempt 0): hang: {words.format(node=node)}" in stderr
    assert "detected: watchdog: rank" in stderr  # what the watchdog itself saw is kept
    # One node: that it stays in the next round only restates the job's shape (agent.jsonl keeps it)
    assert "culprit_kept_in" not in stderr and '"culprit_kept_in"' in (j.run_dir() / "agent.jsonl").read_text()
    if mode != "stop":  # a stopped process cannot answer: its records are not read
        assert hang["waiting"] == [{"rank": 0, "node": node}]
        assert hang["collective"] == "all_reduce [[10]]" and hang["collective_seq"] == 4
        assert 2.0 < hang["waited_s"] < 60
        rank0 = json.loads((j.run_dir() / "attempt_0" / "rank_0" / "flight_recorder.json").read_text())
        assert [e["collective_seq_id"] for e in rank0["entries"]][-1] == 4  # torch's own record, kept as it came
    if mode == "sleep":
        assert "rank 1 (culprit)" in failure["stacks"] and "hang_culprit.py" in failure["stacks"]
        page = j.cli("report")  # `runner report job.yaml`: the page shows the culprit and what the watchdog saw
        assert page.returncode == 0, page.stderr
        html = Path(page.stdout.strip()).read_text()
        # both ranks fall silent at step 3: either may be the one the watchdog timed out first
        assert f"culprit: rank 1 (node {node})" in html and "detected: watchdog: rank " in html


def test_a_mismatched_collective_names_the_odd_rank_out(job):
    """Three ranks: rank 2 calls all_gather where ranks 0 and 1 call all_reduce; gloo hangs, the odd one is named."""
    failure, stderr, _ = run_hang(job, "mismatch", nproc=3)
    hang = failure["hang"]
    assert hang["finding"] == "mismatch"
    assert [c["rank"] for c in hang["culprits"]] == [2]
    assert [w["rank"] for w in hang["waiting"]] == [0, 1]
    assert "called all_gather [[10]] while ranks 0-1" in stderr
    assert failure["rank"] == 2


def test_with_the_recorder_off_the_rank_that_timed_out_is_reported_and_a_line_says_why(job):
    """watchdog.flight_recorder: 0: today's behaviour (the silent rank), and the report says no culprit was sought."""
    failure, stderr, j = run_hang(job, "sleep", extra="  flight_recorder: 0\n")
    assert "hang" not in failure
    assert failure["reason"].startswith("watchdog: rank ")
    assert "culprit: not analysed: the flight recorder is off (watchdog.flight_recorder: 0)" in stderr
    assert not list((j.run_dir() / "attempt_0").glob("rank_*/flight_recorder.json"))


def test_a_stopped_worker_is_continued_so_the_stop_signal_ends_it_before_the_grace(job):
    """The SIGSTOPped culprit gets SIGCONT after SIGTERM: the run ends long before shutdown.grace_period (20 s)."""
    failure, _, j = run_hang(job, "stop")
    assert "rank 1 (culprit): no stack: its process is stopped (state T)" in failure["stacks"]  # not a waiter's
    transitions = j.transitions()
    failed = next(t for t in transitions if t["dst"] == "FAILED")["time"]
    assert transitions[-1]["time"] - failed < 10, "the stopped worker waited out the grace period"
    assert failure["hang"]["finding"] == "stopped"
    started = [json.loads(line) for line in (j.run_dir() / "agent.jsonl").read_text().splitlines()
               if '"worker_started"' in line]
    assert len(started) == 2
    assert not [e["pid"] for e in started if alive(e["pid"])]  # the stopped one too: killed and reaped


def test_the_agent_reads_the_recorder_without_importing_torch():
    """The analysis runs in the agent, which never imports torch."""
    code = "import runner.hangs, runner.watchdog.flight, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_collective_timeout_with_the_watchdog_off_names_the_rank_that_was_away(job):
    """The default (no watchdog): rank 0 gives up after init_process_group's 3 s timeout; its records go with it,
    but rank 1's show it in no collective: it is named, the failure classed a hang, rank 0's traceback kept."""
    spec = SPEC.replace("watchdog:\n  heartbeat_timeout: 3s\n", "")
    j = job(spec.format(script=EXAMPLES / "hang_culprit.py", args=json.dumps(["sleep", "--pg-timeout", "3"]),
                        nproc=2, extra=""))
    res = j.run(timeout=120)
    assert res.returncode == 1, res.stderr[-3000:]
    (failure,) = json.loads((j.run_dir() / "report.json").read_text())["failures"]
    assert failure["kind"] == "worker" and failure["class"] == "hang" and failure["rank"] == 0
    hang = failure["hang"]
    assert hang["finding"] == "away" and [c["rank"] for c in hang["culprits"]] == [1]
    assert hang["waiting"] == [{"rank": 0, "node": hang["culprits"][0]["node"]}]
    assert "was in no collective (last call: all_reduce [[10]] #3) while rank 0" in res.stderr
    assert "Timed out waiting 3000ms" in failure["stderr_tail"]
    assert "rank 1 (culprit)" in failure["stacks"]


def test_a_progress_stall_is_a_hang_whose_culprit_is_named(job):
    """watchdog.progress_timeout alone: the workers report {"step": N} in their heartbeat files; rank 1 skips the
    all_reduce and keeps touching its file (alive, step stuck), rank 0 waits in it (step stuck too). The stall is
    found, the records read, rank 1 named."""
    spec = SPEC.replace("heartbeat_timeout: 3s", "progress_timeout: 3s")
    j = job(spec.format(script=EXAMPLES / "hang_culprit.py", args=json.dumps(["skip", "--report-steps"]), nproc=2,
                        extra=""))
    res = j.run(timeout=120)
    assert res.returncode == 1, res.stderr[-3000:]
    (failure,) = json.loads((j.run_dir() / "report.json").read_text())["failures"]
    assert failure["class"] == "hang" and [c["rank"] for c in failure["hang"]["culprits"]] == [1]
    assert "reported no new step for" in failure["detected"] and "(last step 3; progress_timeout 3 s)" in (
        failure["detected"])
    assert '"event": "progress_stalled"' in (j.run_dir() / "agent.jsonl").read_text()


def run_failed(job, args: list[str], *, nproc: int, spec: str = SPEC, extra: str = "") -> tuple[dict[str, object], str]:
    """Run hang_culprit.py to its failure (no restart): (the failure in report.json, stderr)."""
    j = job(spec.format(script=EXAMPLES / "hang_culprit.py", args=json.dumps(args), nproc=nproc, extra=extra))
    res = j.run(timeout=120)
    assert res.returncode == 1, res.stderr[-3000:]
    (failure,) = json.loads((j.run_dir() / "report.json").read_text())["failures"]
    return failure, res.stderr


NO_WATCHDOG = SPEC.replace("watchdog:\n  heartbeat_timeout: 3s\n", "")


@pytest.mark.parametrize(("nproc", "culprit"), [(3, 2), (4, 0), (8, 5)])  # the last, the first, one inside
def test_a_collective_timeout_with_many_ranks_names_the_rank_that_slept_never_a_waiter(job, nproc, culprit):
    """The reported case: no watchdog, init_process_group(timeout=3s), one rank sleeps before the 4th all_reduce.
    Every waiter times out at about the same moment and leaves; those still leaving when the records are read
    answer nothing useful (torch's handlers gone). The one that slept answered: it is named, and no waiter is
    (was: `silent`, naming the waiters that were leaving)."""
    failure, stderr = run_failed(job, ["sleep", "--culprit", str(culprit), "--pg-timeout", "3"], nproc=nproc,
                                 spec=NO_WATCHDOG)
    assert failure["kind"] == "worker" and failure["class"] == "hang", failure["reason"]
    hang = failure["hang"]
    assert hang["finding"] in ("away", "never_entered"), hang["reason"]
    assert [c["rank"] for c in hang["culprits"]] == [culprit]
    assert culprit not in [w["rank"] for w in hang["waiting"]]
    assert f"root cause (attempt 0): hang: rank {culprit} (node " in stderr
    assert "Timed out waiting 3000ms" in failure["stderr_tail"] and failure["rank"] != culprit


def test_the_recorder_off_through_the_jobs_env_says_so(job):
    """TORCH_FR_BUFFER_SIZE=0 in the spec's env: every dump comes back without entries. The root cause is the
    watchdog's, with the line that says the recorder was off (was: "the hang is outside collectives")."""
    failure, stderr = run_failed(job, ["sleep"], nproc=3, extra="env:\n  TORCH_FR_BUFFER_SIZE: 0\n")
    assert failure["reason"].startswith("watchdog: rank ")
    assert failure["hang"]["finding"] == "unknown" and failure["hang"]["ranks_read"] == 0
    assert "culprit: not analysed: the flight recorder is off in the workers (their dumps have no entries" in stderr
    assert "outside collectives" not in stderr


@pytest.mark.parametrize(("nproc", "size", "dies"), [(3, 20, 0), (4, 5, 3), (8, 20, 0)])
def test_a_mismatch_that_aborts_names_the_rank_whose_call_differed(job, nproc, size, dies):
    """Every rank calls all_gather; the last rank's tensor has `size` floats, the others' 10. gloo aborts the rank
    that receives more than its call expects (the culprit itself when its tensor is smaller): `op.preamble.length
    <= op.nbytes ... Is there a distributed collective mismatch`. The ranks still alive are read before they are
    killed; the root cause is the rank whose call differed with both calls, not the receiver's SIGABRT."""
    culprit = nproc - 1
    failure, stderr = run_failed(job, ["size", "--size", str(size), "--pg-timeout", "5"], nproc=nproc,
                                 spec=NO_WATCHDOG)
    assert failure["rank"] == dies and failure["signal"] == "SIGABRT", failure["reason"]
    hang = failure["hang"]
    assert hang["finding"] == "mismatch" and [c["rank"] for c in hang["culprits"]] == [culprit], hang["reason"]
    assert hang["died"] == [{"rank": dies, "node": hang["culprits"][0]["node"]}]
    others = f"ranks 0-{nproc - 2} (node {hang['culprits'][0]['node']}) called all_gather [[10]]"
    called = f"all_gather [[{size}]]" if size > 10 else "a smaller all_gather (it received"
    assert f"root cause (attempt 0): collective mismatch #4 (process group 0): rank {culprit} (node " in stderr
    assert called in failure["reason"] and others in failure["reason"]
    assert f"detected: rank {dies} killed by SIGABRT: a collective mismatch" in stderr


def test_c10ds_mismatch_check_names_the_rank_whose_call_differed(job):
    """TORCH_DISTRIBUTED_DEBUG=DETAIL: c10d compares every rank's collective before running it, and every rank
    raises `Detected mismatch between collectives on ranks`, naming its own call and one other rank's. No record
    has the call and every rank leaves: the ranks' own words name the one that differed."""
    failure, stderr = run_failed(job, ["size", "--pg-timeout", "5"], nproc=4, spec=NO_WATCHDOG,
                                 extra="env:\n  TORCH_DISTRIBUTED_DEBUG: DETAIL\n")
    hang = failure["hang"]
    assert hang["finding"] == "mismatch" and [c["rank"] for c in hang["culprits"]] == [3], hang["reason"]
    assert "(c10d's fingerprints): rank 3 (node " in failure["reason"]
    assert "called allgather [[20]] while ranks 0-2 (node " in failure["reason"]
    assert "a collective mismatch" in failure["detected"] and "root cause (attempt 0): collective mismatch #" in stderr


def test_a_rank_alone_in_a_call_of_another_group_is_named(job):
    """Three ranks; rank 2 calls all_reduce on a group of itself and rank 0, while ranks 0-1 wait in the default
    group's: rank 2 is alone elsewhere, rank 0 waits (it is no culprit of the pair's call it never entered). Was:
    `unknown`, "every rank read is inside all_reduce #1 (process group 1)"."""
    failure, stderr, _ = run_hang(job, "elsewhere", nproc=3)
    hang = failure["hang"]
    assert hang["finding"] == "never_entered" and [c["rank"] for c in hang["culprits"]] == [2], hang["reason"]
    assert [w["rank"] for w in hang["waiting"]] == [0, 1]
    assert "never entered all_reduce #4 (process group 0) (it is in all_reduce #1 (process group 1)); ranks 0-1" in (
        stderr)


CYCLE = """\
import os, time
from pathlib import Path
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
beat = Path(os.environ["RUNNER_HEARTBEAT_FILE"])
sub = dist.new_group(list(range(world)))
t = torch.ones(10)
for step in range(8):
    beat.touch()
    if step == 3 and rank == world - 1:  # the other order: the subgroup's broadcast first
        dist.broadcast(t, 0, group=sub)
        dist.all_reduce(t)
    else:
        dist.all_reduce(t)
        dist.broadcast(t, 0, group=sub)
    time.sleep(0.05)
"""


@pytest.mark.parametrize("nproc", [2, 3])
def test_ranks_calling_two_groups_collectives_in_opposite_orders_are_a_circular_wait(job, tmp_path, nproc):
    """Every step calls the world's all_reduce, then a broadcast on a second group of every rank; at step 3 the last
    rank calls them the other way round. Each side waits for the other, and the records cannot tell which order
    was meant: a circular wait, nobody named, the rank the watchdog timed out stays the root cause. Was (issue 39,
    point 6): with 3 ranks, `never_entered` naming rank 2, which waited in the broadcast; with 2, `unknown`, "every
    rank read is inside all_reduce #4 ... the collective itself is stuck"."""
    script = tmp_path / "cycle.py"
    script.write_text(CYCLE)
    j = job(SPEC.format(script=script, args="[]", nproc=nproc, extra=""))
    res = j.run(timeout=120)
    assert res.returncode == 1, res.stderr[-3000:]
    (failure,) = json.loads((j.run_dir() / "report.json").read_text())["failures"]
    hang = failure["hang"]
    assert hang["finding"] == "circular_wait" and hang["culprits"] == [], hang["reason"]
    last = nproc - 1
    assert [([r["rank"] for r in c["ranks"]], c["process_group"], c["never_entered"]) for c in hang["cycle"]] == [
        (list(range(last)), "0", [last]), ([last], "1", list(range(last)))]
    assert failure["reason"].startswith("watchdog: rank ") and "culprit: hang: a circular wait between ranks 0 (node" in (
        res.stderr)
    assert (f"wait{'s' if nproc == 2 else ''} in all_reduce #4 (process group 0), which rank {last} never entered; "
            f"rank {last} waits in broadcast #4 (process group 1), which rank") in res.stderr
