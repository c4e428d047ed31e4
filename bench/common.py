"""Shared helpers of the runner-vs-torchrun benchmarks: run a launcher under measurement, stats, tables.

Stdlib only. A launcher is run in its own session (so a hung one can be killed with its whole group); its
wall time is taken around Popen..wait4, its CPU from wait4's rusage (the launcher plus every descendant it
reaped), and its peak RSS from /proc/<pid>/status VmHWM, sampled by a thread until it exits.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def precompile() -> None:
    """Byte-compile the runner package, as `pip install` (non-editable) does and as torch's wheel ships.

    An editable install under PYTHONDONTWRITEBYTECODE=1 otherwise recompiles every module at every start
    (~90 ms here), which would charge the runner a cost torch's precompiled modules never pay."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "runner")], check=True)
VENV_BIN = Path(sys.executable).parent
RUNNER = (
    [str(VENV_BIN / "runner")]
    if (VENV_BIN / "runner").exists()
    else [sys.executable, "-m", "runner"]
)
TORCHRUN = (
    [str(VENV_BIN / "torchrun")]
    if (VENV_BIN / "torchrun").exists()
    else [
        sys.executable,
        "-m",
        "torch.distributed.run",
    ]
)


@dataclass
class Measured:
    """One launcher run, seen from outside."""

    rc: int
    wall_s: float
    cpu_s: float  # user + sys of the launcher and every descendant it reaped (wait4)
    peak_rss_kib: int  # VmHWM of the launcher's main process
    helpers_rss_kib: dict[int, int] = field(
        default_factory=dict
    )  # other non-worker descendants: pid -> VmHWM
    timed_out: bool = False
    started_at: float = 0.0  # time.time() just before Popen
    peak_tree_pss_kib: int = 0  # the whole process tree (launcher and every descendant): peak of the summed PSS


def proc_kib(pid: int, file: str, key: str) -> int | None:
    """The `key:` line of /proc/<pid>/<file> in KiB, or None once the process is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/{file}", encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def pss_kib(pid: int) -> int:
    """Proportional set size of `pid` in KiB (shared pages split among their sharers), 0 once gone."""
    return proc_kib(pid, "smaps_rollup", "Pss") or 0


def vm_hwm_kib(pid: int) -> int | None:
    """VmHWM (peak resident set) of `pid` in KiB, or None once it is gone or a zombie."""
    return proc_kib(pid, "status", "VmHWM")


def children(pid: int) -> list[int]:
    """Direct children of `pid` (every thread's list)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with (
                contextlib.suppress(OSError),
                open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f,
            ):
                out.extend(int(p) for p in f.read().split())
    return out


def descendants(pid: int) -> list[int]:
    """Every descendant of `pid` right now."""
    todo, seen = children(pid), []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo.extend(children(p))
    return seen


def cmdline(pid: int) -> str:
    """The command line of `pid` (spaces between arguments), '' if gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class RssSampler(threading.Thread):
    """Samples VmHWM of the launcher and of its non-worker descendants every `interval` s until stopped."""

    def __init__(
        self, pid: int, is_worker: Callable[[str], bool], interval: float = 0.02, pss_every: int = 5
    ) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.is_worker = is_worker
        self.interval = interval
        self.pss_every = pss_every  # the tree's PSS every this many samples (reading smaps_rollup costs CPU)
        self.peak = 0
        self.peak_tree_pss = 0
        self.helpers: dict[int, int] = {}
        self._cmds: dict[int, str] = {}
        self.done = threading.Event()

    def run(self) -> None:
        """Sample until `done` is set."""
        n = 0
        while not self.done.wait(self.interval):
            hwm = vm_hwm_kib(self.pid)
            if hwm is None:
                return
            self.peak = max(self.peak, hwm)
            tree = descendants(self.pid)
            for child in tree:
                self.sample_helper(child)
            n += 1
            if n % self.pss_every == 0:  # PSS: pages shared copy-on-write or mapped by several count once in all
                self.peak_tree_pss = max(self.peak_tree_pss, sum(pss_kib(p) for p in [self.pid, *tree]))

    def sample_helper(self, pid: int) -> None:
        """Track a non-worker descendant's VmHWM since its last exec (a child between fork and exec still
        shows the launcher's command line and memory; it is forgotten once it execs a worker)."""
        cmd = cmdline(pid)
        if self.is_worker(cmd):
            self.helpers.pop(pid, None)
            self._cmds.pop(pid, None)
            return
        hwm = vm_hwm_kib(pid)
        if hwm is None:
            return
        if self._cmds.get(pid) != cmd:
            self._cmds[pid] = cmd
            self.helpers[pid] = hwm
        else:
            self.helpers[pid] = max(self.helpers[pid], hwm)


def kill_tree(pid: int, grace: float = 5.0) -> None:
    """SIGTERM the launcher's group, then SIGKILL it and every descendant seen before (a hung run)."""
    kids = descendants(pid)
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0]:
                break
        time.sleep(0.05)
    for p in [pid, *kids, *descendants(pid)]:
        with contextlib.suppress(OSError):
            os.killpg(p, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)


def measure(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path = ROOT,
    timeout: float = 120.0,
    is_worker: Callable[[str], bool] = lambda _c: False,
    log_path: Path | None = None,
) -> Measured:
    """Run `argv` to completion (killing it after `timeout` s) and return what it cost."""
    log = open(log_path or os.devnull, "ab")  # noqa: SIM115 - closed below
    started_at = time.time()
    t0 = time.monotonic()
    proc = subprocess.Popen(
        list(argv),
        env=dict(env or os.environ),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    sampler = RssSampler(proc.pid, is_worker)
    sampler.start()
    timer = threading.Timer(timeout, kill_tree, args=(proc.pid,))
    timer.start()
    try:
        _, status, ru = os.wait4(proc.pid, 0)
    finally:
        wall = time.monotonic() - t0
        timer.cancel()
        sampler.done.set()
        sampler.join()
        log.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    timed_out = wall >= timeout
    if timed_out:
        kill_tree(proc.pid, grace=0)
    return Measured(
        rc=proc.returncode,
        wall_s=wall,
        cpu_s=ru.ru_utime + ru.ru_stime,
        peak_rss_kib=sampler.peak,
        helpers_rss_kib=dict(sampler.helpers),
        timed_out=timed_out,
        started_at=started_at,
        peak_tree_pss_kib=sampler.peak_tree_pss,
    )


def torchrun_nodes(nodes: int, port: int, rdzv_id: str, worker: Path) -> list[list[str]]:
    """One torchrun per node of a `nodes`-node c10d job (1 worker each, no restart, store on 127.0.0.1:`port`)."""
    argv = [*TORCHRUN, "--nnodes", str(nodes), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", rdzv_id, "--max-restarts", "0",
            "--monitor-interval", "0.1", str(worker)]
    return [list(argv) for _ in range(nodes)]


def launch_all(
    argvs: Sequence[Sequence[str]], env: Mapping[str, str], cwd: Path, *, stagger: float = 0.0, timeout: float = 180.0
) -> tuple[float, list[int]]:
    """Start every command (`stagger` s apart), each in its own session, output discarded; (time.time() at the
    first start, exit codes once all exited). A command still running `timeout` s after the first start is killed
    with all its processes."""
    t0 = time.time()
    procs = []
    for i, argv in enumerate(argvs):
        if i and stagger:
            time.sleep(stagger)
        procs.append(subprocess.Popen(list(argv), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            kill_tree(p.pid, grace=0)
            codes.append(p.wait())
    return t0, codes


def interpreter_startup(
    script: Path, env: Mapping[str, str], runs: int = 5
) -> list[float]:
    """Seconds from Popen to the first statement of `script` (it writes time.time() to $BENCH_CALIBRATE)."""
    out: list[float] = []
    for i in range(runs):
        stamp = Path(env["BENCH_OUT"]) / f"calibrate-{i}"
        e = {**env, "BENCH_CALIBRATE": str(stamp)}
        t = time.time()
        subprocess.run([sys.executable, "-u", str(script)], env=e, check=True)
        out.append(float(stamp.read_text()) - t)
    return out


@dataclass
class Stat:
    """Median, min and max of a series."""

    median: float
    lo: float
    hi: float

    @classmethod
    def of(cls, xs: Sequence[float]) -> Stat:
        """Stats of a non-empty series."""
        return cls(statistics.median(xs), min(xs), max(xs))

    def fmt(self, scale: float = 1.0, digits: int = 3) -> str:
        """'median (min-max)'."""
        return f"{self.median * scale:.{digits}f} ({self.lo * scale:.{digits}f}-{self.hi * scale:.{digits}f})"


def ratios(a: Sequence[float], b: Sequence[float]) -> Stat:
    """Pairwise a[i]/b[i] (interleaved runs i of A and B), as median/min/max."""
    return Stat.of([x / y for x, y in zip(a, b, strict=True) if y > 0])


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def reproduce_line() -> str:
    """The exact command that reproduces this run (from the repository root)."""
    rel = os.path.relpath(sys.argv[0], ROOT)
    return "python " + shlex.join([rel, *sys.argv[1:]])


def machine_line() -> str:
    """Date, CPU count, load average, Python, torch version (read from the package metadata, no import)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        torch_v = version("torch")
    except PackageNotFoundError:
        torch_v = "?"
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}; {os.cpu_count()} CPUs; load avg {load}; "
        f"Python {sys.version.split()[0]}; torch {torch_v}"
    )


def launcher_commands(spec: str, worker: str, max_restarts: int | None = None) -> dict[str, list[str]]:
    """runner on `spec` and the equivalent torchrun (standalone, 2 workers of `worker`), from the repo root."""
    restarts = ["--max-restarts", str(max_restarts)] if max_restarts is not None else []
    return {
        "runner": [*RUNNER, spec],
        "torchrun": [*TORCHRUN, "--standalone", "--nproc-per-node", "2", *restarts, worker],
    }


def print_commands(cmds: Mapping[str, Sequence[str]]) -> None:
    """The footer every benchmark prints: the exact commands and the line that reproduces the run."""
    print("\nCommands:")
    for name, argv in cmds.items():
        print(f"- {name}: `{' '.join(os.path.relpath(a) if a.startswith('/') else a for a in argv)}`")
    print(f"\nReproduce: `{reproduce_line()}`")


def bench_env(work: Path, **extra: str) -> dict[str, str]:
    """Environment of one run: a fresh, empty $BENCH_OUT, $BENCH_LOGS under `work`, plus `extra`."""
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    return {**os.environ, "BENCH_OUT": str(out), "BENCH_LOGS": str(work / "logs"), **extra}


def argv_of(pid: int) -> list[str]:
    """The command line of `pid` ([] once gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []
