"""The chaos soak for tests: its options as bench/chaos.py's parser makes them, for tests that build a soak's real
objects (tests/soak/test_chaos_verdict.py, test_chaos_checks.py, test_soak_own_etcd.py, test_soak_hosts.py); and a seeded
soak run as a user runs it, with its verdict (test_soak_hosts.py, test_soak_hosts_hosted.py)."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from conftest import ROOT

from bench.soak.model import Agent
from bench.soak.procs import ident
from bench.soak.soak import Soak
from bench.soak.state import Options

CHAOS = ROOT / "bench" / "chaos.py"


def soak_args(**over: object) -> Options:
    """A soak's options (a hosted etcd, 3 nodes, seed 1), with `over` replacing any of them."""
    args = Options(seed=1, duration=30.0, hosted=True, nodes=3, failure_every=4.0, steps=100, job_window=30.0,
                   classes="", standby=True, first_job=1, keep=False, replica_groups=False)
    return dataclasses.replace(args, **over)  # type: ignore[arg-type]


def run_chaos(args: list[str], tmp: Path, *, timeout: float, teardown: float) -> str:
    """`python bench/chaos.py ARGS` (its replay line printed first), its output; a soak past `timeout` s gets SIGTERM
    (its teardown runs: hosts, namespaces, bridge) and `teardown` s more, and its output says so."""
    argv = [sys.executable, str(CHAOS), *args]
    print("replay: python " + " ".join(argv[1:]), flush=True)
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TMPDIR": str(tmp)})
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=teardown)
        out += f"\n(the soak overran its {timeout:g} s and was stopped)"
    print(out)
    return out if proc.returncode == 0 else out + f"\n(exit code {proc.returncode})"


def passed(out: str, what: str, known_bugs: Mapping[str, Callable[[str], bool]]) -> None:
    """The soak's verdict: its OK line; a known runner bug's failure an xfail; any other failure a failure."""
    if "OK: every invariant held, every enabled class fired" in out:
        return
    for bug, matches in known_bugs.items():
        if matches(out):
            pytest.xfail(bug)
    pytest.fail(f"{what}:\n{failure_digest(out)}")


def failure_digest(out: str, *, timeline: int = 40, tail: int = 3000) -> str:
    """What a failed soak's log must show to be read without a rerun: the soak's own timeline (its `[  t s]` lines,
    the last `timeline` of them), the verdict's first line (which invariant broke), and the output's last `tail`
    characters (the detail: a node's log). CI shows only the end of a failure, and a node's log alone does not say
    which fault came before it (CI 2026-12-01, seed 3: a node that could not reach etcd, with no fault in sight)."""
    lines = out.splitlines()
    steps = [line for line in lines if line.startswith("[") and " waits for " not in line][-timeline:]
    verdict = [line for line in lines if line.startswith(("FAILED:", "ERROR ", "OK:"))][:1]
    return "\n".join(["timeline:", *steps, "verdict:", *verdict, "end of the output:", out[-tail:]])


def row(out: str, first: str) -> list[str]:
    """The cells of the soak's table row whose first cell is `first`."""
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in the soak's tables")


def agent_of(soak: Soak, procs: list[subprocess.Popen[str]], code: str, node: str = "n0", *,
             ran_s: float = 0.0) -> Agent:
    """A real process (`python -c code`) as an agent of the soak's job: stdin and stdout pipes, the job's token, its
    output a file, its run dir set; started `ran_s` ago as the soak counts it."""
    job = soak.state.jobs[0]
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "CHAOS_TOKEN": job.token})
    procs.append(proc)
    me = ident(proc.pid)
    assert me is not None
    agent = Agent(node, 0, proc, me, job.dir / f"{node}.log", time.time() - ran_s)
    agent.run_dir = job.dir / "runs" / node
    job.agents.append(agent)
    return agent
