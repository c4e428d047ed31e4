"""Pre-warmed standby workers, end to end: a worker started in a standby is the worker a cold start would be.

Real agents, real standby interpreters importing real torch, real crashes. The probe (tests/fixtures/workers/standby_probe.py)
records how its interpreter looks at its first statement; the same job runs with standbys and cold, and the records
must match except for what a standby changes on purpose (torch already imported).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import Job, alive, wait_for
from hypothesis import given
from hypothesis import strategies as st

from runner.workers.standby import entry, path0

pytestmark = pytest.mark.integration

PROBE = Path(__file__).parents[1] / "fixtures" / "workers" / "standby_probe.py"

SPEC = """
version: 1
name: standby
entrypoint:
  {entry}
nproc_per_node: 2
logs: {{dir: "${{LOGS}}"}}
env: {{PROBE_CRASH_ATTEMPTS: "{crash}", PROBE_END: "{end}"}}
restart:
  max_restarts: {restarts}
  backoff: {{initial: 0s}}
  standby: {standby}
  preload: {preload}
  standby_max_memory_mb: {max_mb}
shutdown: {{grace_period: 5s}}
"""


def standby_job(job: Any, *, standby: bool = True, crash: int = 0, end: str = "exit:0", restarts: int = 1,
                preload: str = "[torch]", max_mb: int = 4096, entry: str = "") -> Job:
    """A job of standby_probe workers; standbys as the spec says."""
    j: Job = job(SPEC.format(entry=entry or f"script: {PROBE}", crash=crash, end=end, restarts=restarts,
                             standby=str(standby).lower(), preload=preload, max_mb=max_mb))
    return j


def ready_lines(j: Job, local_rank: int) -> int:
    """How many standbys of `local_rank` the fork server forked and the agent found ready (agent.jsonl)."""
    return sum(1 for line in _agent_log(j)
               if '"standby_ready"' in line and json.loads(line).get("local_rank") == local_rank)


def run_crash_once(j: Job, *, warm: bool = True) -> tuple[int, str]:
    """Start the job; once attempt 1's standbys are warm (cold: once rank 1 runs), let rank 1 of attempt 0 crash."""
    proc = j.start()

    def crash_now() -> bool:
        # Every rank of attempt 0 has written its record: the crash stops the others, and a rank still starting
        # (a cold interpreter, slower than its peer) would be stopped before it wrote one.
        recorded = all((j.out / f"rank{r}.attempt0.json").exists() for r in (0, 1))
        if warm:  # attempt 0 runs in standbys forked once the server is warm; the next attempt's are forked at once
            return recorded and all(ready_lines(j, r) >= 2 for r in (0, 1))
        return recorded

    try:
        wait_for(lambda: crash_now() or proc.poll() is not None, timeout=120, what="the moment to crash")
        (j.out / "go").touch()
        out, err = proc.communicate(timeout=120)
    finally:
        j.stop()
    return proc.returncode, out + err


def report(j: Job) -> dict[str, Any]:
    """The run's report.json."""
    return json.loads((j.run_dir() / "report.json").read_text())


def comparable(info: dict[str, Any], j: Job) -> dict[str, Any]:
    """A probe record without what differs between any two runs (pids, the job's dir) or on purpose (preloaded)."""
    out = {k: v for k, v in info.items() if k not in ("pid", "ppid", "preloaded", "gc_frozen", "cmdline", "title")}
    return json.loads(json.dumps(out).replace(str(j.tmp), "<job dir>"))


def test_a_restarted_worker_runs_in_its_warm_standby_as_a_cold_one_would(job: Any) -> None:
    """Attempts 0 and 1 start in standbys that imported torch: same argv, path, __main__, signals, fds, env as cold."""
    warm = standby_job(job, crash=1)
    code, output = run_crash_once(warm)
    assert code == 0, output
    cold = standby_job(job, standby=False, crash=1)
    code, output = run_crash_once(cold, warm=False)
    assert code == 0, output
    for rank in (0, 1):
        for attempt in (0, 1):  # attempt 0 too: its standbys started in INIT (local rendezvous as well)
            w, c = warm.worker_info(rank, attempt), cold.worker_info(rank, attempt)
            assert w["preloaded"] is True  # started in a standby that had imported torch
            assert c["preloaded"] is False
            assert w["gc_frozen"] > c["gc_frozen"] == 0  # the imports' objects are out of the cyclic GC's way
            assert comparable(w, warm) == comparable(c, cold)
            assert w["main_is_module"] and w["name"] == "__main__" and w["spec"] is None
            assert w["leader"] and w["tag_in_proc_environ"] and w["pickled"] == 42
            assert w["ppid"] == warm.proc.pid  # forked by the server, adopted by the agent: the agent's child
            assert w["contract"]["TORCHELASTIC_RESTART_COUNT"] == str(attempt)
            assert w["title"] == f"runner: worker rank {rank} of job standby (attempt {attempt}) standby_probe.py"  # ps: its title
            assert c["cmdline"][:2] == ["-u", str(PROBE)]  # a cold worker: its own argv, as under torchrun
    rep = report(warm)["standby"]
    assert rep["enabled"] is True
    assert rep["handed_off"] == 4  # attempt 0's two workers and attempt 1's
    assert rep["cold_starts"] == []
    assert rep.get("rss_mb_max", 0) > 0, rep
    assert report(cold)["standby"]["enabled"] is False


def test_a_module_entrypoint_runs_in_a_standby_as_python_dash_m_does(job: Any) -> None:
    """`module:` entrypoints: argv[0] is the module's file, sys.path[0] the working dir, __spec__ set."""
    entry_text = "module: standby_probe"
    warm = standby_job(job, entry=entry_text, preload="[json]", crash=1)
    cold = standby_job(job, entry=entry_text, standby=False, crash=1)
    for j, is_warm in ((warm, True), (cold, False)):
        (j.tmp / "standby_probe.py").write_text(PROBE.read_text())
        code, output = run_crash_once(j, warm=is_warm)
        assert code == 0, output
    w, c = warm.worker_info(0, 1), cold.worker_info(0, 1)
    assert comparable(w, warm) == comparable(c, cold)
    assert w["argv"][0].endswith("standby_probe.py")
    assert w["path0"] == str(warm.tmp)
    assert w["spec"][0] == "standby_probe"
    assert report(warm)["standby"]["handed_off"] == 4


@pytest.mark.parametrize(("end", "code"), [("exit:7", 7), ("raise", 1), ("interrupt", -signal.SIGINT)])
def test_a_worker_in_a_standby_ends_as_a_cold_one_does(job: Any, end: str, code: int) -> None:
    """sys.exit, an uncaught exception (traceback without the standby's frames), KeyboardInterrupt (killed by SIGINT)."""
    j = standby_job(job, end=end, crash=1, preload="[json]")
    code_of_run, _ = run_crash_once(j)
    assert code_of_run != 0
    failure = report(j)["failures"][-1]  # attempt 1's, in a standby
    assert failure["attempt"] == 1
    assert failure["exit_code"] == code
    assert report(j)["standby"]["handed_off"] == 4
    if end == "raise":
        stderr = (Path(failure["log_dir"]) / "stderr.log").read_text()
        assert "RuntimeError: probe raised" in stderr
        assert "standby_main" not in stderr  # as `python script`: the script's frames only


def test_multiprocessing_spawn_finds_the_main_module_of_a_worker_in_a_standby(job: Any) -> None:
    """A spawn child re-imports __main__ from its file, as it does for a cold worker."""
    j = standby_job(job, end="spawn", crash=1, preload="[json]")
    code, output = run_crash_once(j)
    assert code == 0, output
    assert (j.out / "spawned0").read_text() == "spawned"
    assert report(j)["standby"]["handed_off"] == 4


@pytest.mark.parametrize(("preload", "max_mb", "why"), [
    ("[no_such_module_anywhere]", 4096, "no_such_module_anywhere"),  # the preload fails
    ("[json]", 1, "standby_max_memory_mb"),  # a warm standby holds more than the cap
])
def test_a_standby_that_cannot_serve_turns_standbys_off_and_workers_start_cold(
    job: Any, preload: str, max_mb: int, why: str
) -> None:
    """A warning, standbys off for the rest of the run (and said so in the report), the job itself unaffected."""
    j = standby_job(job, crash=1, preload=preload, max_mb=max_mb)
    proc = j.start()
    try:
        wait_for(lambda: "off" in _live_report(j) or proc.poll() is not None, timeout=60, what="standbys off")
        (j.out / "go").touch()
        out, err = proc.communicate(timeout=120)
    finally:
        j.stop()
    assert proc.returncode == 0, out + err
    assert why in _live_report(j)["off"]
    assert why in report(j)["standby"]["off"]
    assert j.worker_info(0, 1)["preloaded"] is False
    assert j.worker_info(1, 1)["preloaded"] is False
    started = [json.loads(line) for line in _agent_log(j) if '"worker_started"' in line]
    assert [e["standby"] for e in started[-2:]] == [False, False]  # attempt 1: cold


def _agent_log(j: Job) -> list[str]:
    runs = [d for d in j.logs.glob("*/*") if d.is_dir() and not d.is_symlink()]  # not the `latest` link
    return [line for d in runs if (d / "agent.jsonl").exists()
            for line in (d / "agent.jsonl").read_text(errors="replace").splitlines()]


def _live_report(j: Job) -> dict[str, Any]:
    """The agent's warning about standbys once it was logged (agent.jsonl), as a dict with 'off'; {} before."""
    for line in _agent_log(j):
        if '"standby_off"' in line:
            return {"off": json.loads(line).get("why", "")}
    return {}


def test_a_command_entrypoint_never_gets_a_standby(job: Any) -> None:
    """`command:` runs whatever the user names: always cold, and no standby is started."""
    j = standby_job(job, entry=f'command: ["{sys.executable}", "-u", "{PROBE}"]')
    res = j.run()
    assert res.returncode == 0, res.stderr
    assert report(j)["standby"]["enabled"] is False
    assert not list(j.logs.glob("*/*/standby"))


def test_standbys_die_with_a_sigkilled_agent(job: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard kills the waiting standbys too: nothing of the job outlives its agent. Then it removes the flight
    recorder's sockets folder the agent made in the temp dir: nothing of the job is left there either."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    j = standby_job(job, crash=1, preload="[json]")
    proc = j.start()
    try:
        wait_for(lambda: all(ready_lines(j, r) >= 2 for r in (0, 1)), timeout=60, what="waiting standbys")
        standbys = [pid for pid in _pids() if _is_standby(pid, j)]
        assert standbys
        assert list(temp.glob("runner-fr-*")), "the agent made no recorder folder: nothing to test"
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        wait_for(lambda: not any(alive(p) for p in standbys), timeout=30, what="standbys to die")
        wait_for(lambda: not list(temp.glob("runner-*")), timeout=30, what="the recorder's folder to be removed")
    finally:
        j.stop()


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _is_standby(pid: int, j: Job) -> bool:
    """A waiting standby (or the fork server) of this job: its title in ps, and this job's working directory."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return False
    return cmd.startswith((b"runner: standby of job ", b"runner: fork server of job ")) and cwd == str(j.tmp)


PY = "/usr/bin/python3"


@given(st.lists(st.text(max_size=12), max_size=6))
def test_entry_accepts_only_what_a_standby_can_run(rest: list[str]) -> None:
    """Any argv: None, or a script/module target taken from it; never an error."""
    argv = (PY, "-u", *rest)
    got = entry(argv, PY)
    if got is None:
        return
    kind, target, args = got
    if kind == "module":
        assert rest[0] == "-m" and target == rest[1] and target and args == tuple(rest[2:])
    else:
        assert target == rest[0] and not target.startswith("-") and args == tuple(rest[1:])


def test_entry_refuses_another_interpreter_or_flags() -> None:
    """Only `<the standby's python> -u ...`; stdin, -c, and compiled or zipped programs start cold."""
    assert entry(("/other/python", "-u", "s.py"), PY) is None
    assert entry((PY, "s.py"), PY) is None
    assert entry((PY, "-u", "-c", "pass"), PY) is None
    assert entry((PY, "-u", "-"), PY) is None
    assert entry((PY, "-u", "app.pyz"), PY) is None
    assert entry((PY, "-u", "-m"), PY) is None
    assert entry((PY, "-u", "s.py", "-x"), PY) == ("script", "s.py", ("-x",))


def test_path0_is_the_scripts_real_directory_or_the_working_dir(tmp_path: Path) -> None:
    """As CPython: a symlinked script's sys.path[0] is the directory of its target; -m's is the cwd."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").mkdir()
    (tmp_path / "real" / "s.py").write_text("")
    (tmp_path / "link" / "s.py").symlink_to(tmp_path / "real" / "s.py")
    assert path0("script", "link/s.py", str(tmp_path)) == str(tmp_path / "real")
    assert path0("module", "pkg.mod", str(tmp_path)) == str(tmp_path)


def test_with_etcd_the_first_attempt_starts_in_standbys_warmed_during_the_rendezvous(job: Any, etcd: Any) -> None:
    """A rendezvous that waits for other nodes: the standbys start in INIT and attempt 0 already runs in them."""
    j = standby_job(job, preload="[json]")
    j.spec.write_text(j.spec.read_text().replace(
        "logs:", f'nodes: 1\nrendezvous: {{backend: etcd, endpoints: ["{etcd.endpoint}"]}}\nlogs:', 1))
    res = j.run()
    assert res.returncode == 0, res.stderr
    assert report(j)["standby"]["handed_off"] == 2
    assert j.worker_info(0)["title"] == "runner: worker rank 0 of job standby (attempt 0) standby_probe.py"


def test_with_the_local_rendezvous_the_first_attempt_starts_in_standbys_started_in_init(job: Any) -> None:
    """Nothing to wait for, the standbys start in INIT all the same: attempt 0 runs in them (still importing or
    warm), so a crash of attempt 0 is a crash of a worker whose teardown skips torch's objects (gc.freeze)."""
    j = standby_job(job)
    res = j.run()
    assert res.returncode == 0, res.stderr
    rep = report(j)["standby"]
    assert rep["handed_off"] == 2
    assert rep["cold_starts"] == []
    started = [json.loads(line) for line in _agent_log(j) if '"worker_started"' in line]
    assert [e["standby"] for e in started] == [True, True]
    for rank in (0, 1):
        info = j.worker_info(rank, 0)
        assert info["preloaded"] is True  # torch was in sys.modules at the script's first statement
        assert info["gc_frozen"] > 0
        assert info["title"] == f"runner: worker rank {rank} of job standby (attempt 0) standby_probe.py"  # its title in ps
        assert info["contract"]["TORCHELASTIC_RESTART_COUNT"] == "0"


def test_a_machine_without_standbys_starts_the_first_attempt_cold(job: Any) -> None:
    """RUNNER_STANDBY=0 on the machine: no standby is started, attempt 0 is a fresh interpreter as before."""
    j = standby_job(job)
    base = j.env
    j.env = lambda: {**base(), "RUNNER_STANDBY": "0"}  # type: ignore[method-assign]
    res = j.run()
    assert res.returncode == 0, res.stderr
    assert report(j)["standby"]["enabled"] is False
    assert not list(j.logs.glob("*/*/standby"))
    started = [json.loads(line) for line in _agent_log(j) if '"worker_started"' in line]
    assert [e["standby"] for e in started] == [False, False]
    for rank in (0, 1):
        info = j.worker_info(rank, 0)
        assert info["preloaded"] is False
        assert info["gc_frozen"] == 0
        assert info["cmdline"][:2] == ["-u", str(PROBE)]


def test_a_crash_at_once_in_a_crash_loop_finds_a_warm_worker_every_time(job: Any) -> None:
    """Rank 1 crashes at its first statements on attempts 0-2 (no wait for anything): every attempt's workers are
    forked from the warm server, none starts cold."""
    scope = "group"
    j = standby_job(job, crash=3, restarts=3)
    # crash_loop 0: the same exception three times is a crash loop the policy would stop early, on purpose here
    j.spec.write_text(j.spec.read_text().replace("restart:\n", f"restart:\n  scope: {scope}\n  crash_loop: 0\n", 1))
    (j.out / "go").touch()  # crash at once
    res = j.run()
    assert res.returncode == 0, res.stderr[-3000:]
    for attempt in range(4):
        assert j.worker_info(1, attempt)["preloaded"] is True
    if scope == "group":
        assert all(j.worker_info(0, a)["preloaded"] for a in range(4))
    rep = report(j)["standby"]
    assert rep["cold_starts"] == [], rep
    assert rep["handed_off"] == (8 if scope == "group" else 5), rep


THREADED = """
import threading, time
threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
"""


def test_a_preload_that_starts_a_thread_is_never_forked_and_workers_start_cold(job: Any) -> None:
    """A thread may hold a lock a forked child would inherit held: the server refuses to fork, one warning says
    why, the workers start cold and the job is unaffected."""
    j = standby_job(job, preload="[threaded_preload]")
    (j.tmp / "threaded_preload.py").write_text(THREADED)
    script = j.tmp / "standby_probe.py"
    script.write_text(PROBE.read_text())
    j.spec.write_text(j.spec.read_text().replace(f"script: {PROBE}", f"script: {script}"))
    res = j.run()
    assert res.returncode == 0, res.stderr[-3000:]
    offs = [json.loads(line) for line in _agent_log(j) if '"standby_off"' in line]
    assert len(offs) == 1
    assert "thread" in offs[0]["why"], offs
    assert "thread" in report(j)["standby"]["off"]
    assert j.worker_info(0)["preloaded"] is False
    assert j.worker_info(1)["preloaded"] is False


def test_a_sigkilled_fork_server_is_replaced_and_the_job_goes_on(job: Any) -> None:
    """The server dies (SIGKILL) while the job runs: a warning, a new server, and the next attempt still starts
    warm (the standbys forked before stay the agent's children, and the new server forks the rest)."""
    j = standby_job(job, crash=1, preload="[json]")
    proc = j.start()
    try:
        wait_for(lambda: all(ready_lines(j, r) >= 2 for r in (0, 1)), timeout=60, what="waiting standbys")
        servers = [pid for pid in _pids() if _is_standby(pid, j) and b".f0.0." in _environ(pid)]
        assert len(servers) == 1
        fd = os.pidfd_open(servers[0])
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        os.close(fd)
        wait_for(lambda: any('"fork_server_lost"' in line for line in _agent_log(j)), timeout=30,
                 what="the agent to see its server die")
        (j.out / "go").touch()
        out, err = proc.communicate(timeout=120)
    finally:
        j.stop()
    assert proc.returncode == 0, out + err
    assert j.worker_info(0, 1)["preloaded"] is False  # preload [json]: the probe's own marker is torch
    assert report(j)["standby"]["cold_starts"] == []
    assert report(j)["standby"]["handed_off"] == 4


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def test_a_thread_pool_that_stops_at_fork_does_not_keep_the_server_from_forking(job: Any) -> None:
    """One rank, so OMP_NUM_THREADS is not set: numpy's OpenBLAS starts its thread pool at import. The pool joins
    its threads at fork (pthread_atfork): the server's probe fork shows it, and the workers are forked warm."""
    j = standby_job(job, crash=1, preload="[numpy, torch]")
    j.spec.write_text(j.spec.read_text().replace("nproc_per_node: 2", "nproc_per_node: 1"))
    (j.out / "go").touch()
    res = j.run()
    assert res.returncode == 0, res.stderr[-3000:]
    rep = report(j)["standby"]
    assert "off" not in rep, rep
    assert rep["handed_off"] == 2, rep
    assert j.worker_info(0, 1)["preloaded"] is True


def test_a_pidfd_is_adopted_only_from_a_child_and_signalled_only_when_its_tag_proves_it_ours(tmp_path: Path) -> None:
    """What a forked standby sends is checked: a process that is not this process's child is never adopted, and a
    foreign one (no tag of ours) is never signalled, whatever pidfd arrives on the socket."""
    import subprocess

    from runner.workers.standby import proven_ours, standby_pid

    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)  # our child, no tag
    tag = "0123456789abcdef.s1.0."
    tagged = subprocess.Popen(["sleep", "60"], env={**os.environ, "RUNNER_WORKER_TAG": tag + "~~~~"})
    grandchild = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    assert grandchild.stdout is not None
    foreign = int(grandchild.stdout.readline())  # not our child
    fds = {name: os.pidfd_open(p.pid) for name, p in (("stranger", stranger), ("tagged", tagged))}
    fds["foreign"] = os.pidfd_open(foreign)
    try:
        assert standby_pid(b"ready\n", fds["stranger"]) == stranger.pid  # a child of ours
        assert standby_pid(b"hello\n", fds["stranger"]) is None  # it did not say ready
        assert standby_pid(b"ready\n", fds["foreign"]) is None  # not our child: never adopted
        assert proven_ours(fds["tagged"], tag)
        assert not proven_ours(fds["stranger"], tag)
        assert not proven_ours(fds["foreign"], tag)
        tagged.kill()
        tagged.wait()
        assert not proven_ours(fds["tagged"], tag)  # gone (reaped): its pid proves nothing any more
    finally:
        for fd in fds.values():
            os.close(fd)
        for p in (stranger, tagged, grandchild):
            p.kill()
            p.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(foreign, signal.SIGKILL)


HANGING_POOL = """
import asyncio, sys
import structlog
from pathlib import Path
from runner.config import load_spec
from runner.system.shepherd import Shepherd
from runner.workers.standby import StandbyPool

async def main():
    spec = load_spec(sys.argv[1])
    shepherd = Shepherd(agent=True)  # this process is the subreaper, as the agent is
    pool = StandbyPool(spec, shepherd, nproc=1, run_dir=Path(sys.argv[2]), base_env={}, log=structlog.get_logger())
    pool.fill()
    await pool.warm(timeout=2.0)
    print("OFF:" + pool.off, flush=True)
    pool.close()
    shepherd.close()

asyncio.run(main())
"""


def test_a_fork_server_whose_imports_hang_is_given_up_after_the_wait(tmp_path: Path) -> None:
    """A preload that never returns: RUNNING's bounded wait ends, the pool turns off (no later attempt waits for it
    again) and the hung server is killed with everything of it."""
    import subprocess

    (tmp_path / "hangs.py").write_text("import time\ntime.sleep(3600)\n")
    (tmp_path / "w.py").write_text("")
    (tmp_path / "job.yaml").write_text(
        f"version: 1\nname: hang\nentrypoint: {{script: {tmp_path / 'w.py'}}}\nrestart: {{preload: [hangs]}}\n")
    done = subprocess.run([sys.executable, "-c", HANGING_POOL, str(tmp_path / "job.yaml"), str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "OFF:the fork server was not ready after 2 s" in done.stdout, done.stdout + done.stderr[-2000:]
    assert not [pid for pid in _pids() if _runs_hanging_preload(pid, tmp_path)], "the hung server outlived its pool"


def _runs_hanging_preload(pid: int, tmp_path: Path) -> bool:
    try:
        return b"standby_main.py" in Path(f"/proc/{pid}/cmdline").read_bytes() and \
            os.readlink(f"/proc/{pid}/cwd") == str(tmp_path)
    except OSError:
        return False
