"""Health checks (runner/health/): each check on real processes, real files and a real small file system.

GPUs: this suite runs on machines without NVIDIA GPUs, so the nvidia-smi path is exercised on recorded output and
through a stand-in `nvidia-smi` script (a real process that prints what a real one prints); nothing here proves it
against a real driver.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from ci_skips import need
from conftest import alive, wait_for
from hypothesis import given
from hypothesis import strategies as st

from runner.config import load_spec_text
from runner.config.devices import nvidia_gpus_used
from runner.config.spec import Health, HealthCommand, HealthPath
from runner.errors import EXIT_INFRA, SpecError
from runner.health.check import Unhealthy, check, check_spec, helper_environment, shown_command, until_healthy
from runner.health.commands import run_command
from runner.health.gpus import assess, check_gpus, parse_query, visible
from runner.health.probes import check_memory, check_space, parse_meminfo
from runner.health.report import HealthFailure, HealthReport

MiB = 1 << 20
HELPER_ENV = helper_environment(os.environ)


def run(coro):
    return asyncio.run(coro)


async def one_try(health: Health, tmp_path: Path, **kw: object) -> HealthReport:
    return await check(health, logs_dir=str(tmp_path / "logs"), cwd=str(tmp_path), environ=dict(os.environ),
                       helper_environ=HELPER_ENV, **kw)  # type: ignore[arg-type]


# --- disk --------------------------------------------------------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs mounted for the test (root only)."""
    where = tmp_path / "small"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        need(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_full_small_file_system_is_unhealthy(small_fs: Path) -> None:
    """16 MiB of room, 64 MiB asked: a failure that says both; 1 MiB asked: healthy."""
    failures = run(check_space(str(small_fs), 64 * MiB))
    assert len(failures) == 1
    assert failures[0].check == "disk" and failures[0].subject == str(small_fs)
    assert failures[0].reason == "16MiB free, needs 64MiB"
    assert run(check_space(str(small_fs), 1 * MiB)) == []


def test_space_is_measured_where_the_data_goes(small_fs: Path) -> None:
    """Filling the file system turns a passing check into a failing one; a folder not made yet is measured at its
    nearest parent, and the reason says so."""
    (small_fs / "fill").write_bytes(b"\0" * (12 * MiB))
    missing = small_fs / "ckpt" / "run1"
    failures = run(check_space(str(missing), 8 * MiB))
    assert [f.reason for f in failures] == [f"4MiB free (at {small_fs}, it does not exist yet), needs 8MiB"]


def test_logs_dir_and_paths_in_one_try(small_fs: Path, tmp_path: Path) -> None:
    """min_free covers logs.dir and every path without its own; a path's own min_free wins for it."""
    health = Health(min_free=64 * MiB, paths=(HealthPath(str(small_fs)), HealthPath(str(small_fs / "b"), 1)))
    report = run(check(health, logs_dir=str(small_fs / "logs"), cwd=str(tmp_path), environ={},
                       helper_environ=HELPER_ENV))
    assert sorted(f.subject for f in report.failures) == sorted([str(small_fs / "logs"), str(small_fs)])
    assert set(report.checked) == {f"disk {small_fs / 'logs'}", f"disk {small_fs}", f"disk {small_fs / 'b'}"}


# --- memory ------------------------------------------------------------------------------------------------------

MEMINFO = """MemTotal:       24684084 kB
MemFree:        22011676 kB
MemAvailable:   23230088 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
"""


def test_parse_meminfo() -> None:
    """kB fields in bytes, plain counts as they are."""
    info = parse_meminfo(MEMINFO)
    assert info["MemAvailable"] == 23230088 * 1024
    assert info["HugePages_Total"] == 0
    assert info["Hugepagesize"] == 2048 * 1024


def test_this_machines_meminfo_has_mem_available() -> None:
    """The real /proc/meminfo parses and has the field the check reads."""
    info = parse_meminfo(Path("/proc/meminfo").read_text())
    assert 0 < info["MemAvailable"] <= info["MemTotal"]


names = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters=":"), min_size=1,
                max_size=20)  # as the kernel writes them: Active(anon), HugePages_Total


@given(st.dictionaries(names, st.tuples(st.integers(0, 2**64), st.booleans()), max_size=30))
def test_meminfo_round_trip(fields: dict[str, tuple[int, bool]]) -> None:
    """Any `Name: N [kB]` lines read back (kB times 1024)."""
    text = "".join(f"{name}:{' ' * 5}{n}{' kB' if kb else ''}\n" for name, (n, kb) in fields.items())
    assert parse_meminfo(text) == {name: n * (1024 if kb else 1) for name, (n, kb) in fields.items()}


@given(st.text(max_size=300))
def test_meminfo_parser_takes_any_text(text: str) -> None:
    """Garbage never raises; every value read is a non-negative int."""
    assert all(isinstance(v, int) and v >= 0 for v in parse_meminfo(text).values())


def test_memory_check(tmp_path: Path) -> None:
    """Enough, not enough, no MemAvailable, no file: each with its reason."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(MEMINFO)
    assert check_memory(1 << 30, meminfo) == []
    [short] = check_memory(64 << 30, meminfo)
    assert short.reason == "22.2GiB available, needs 64GiB"
    meminfo.write_text("MemTotal: 1 kB\n")
    assert "no MemAvailable" in check_memory(1, meminfo)[0].reason
    assert "cannot read" in check_memory(1, tmp_path / "nope")[0].reason
    assert check_memory(1, Path("/proc/meminfo")) == []


# --- commands ----------------------------------------------------------------------------------------------------


def command_health(*commands: HealthCommand | str, timeout: float = 60.0) -> Health:
    return Health(commands=tuple(HealthCommand(c) if isinstance(c, str) else c for c in commands), timeout=timeout)


def test_passing_commands_are_healthy(tmp_path: Path) -> None:
    """Exit 0 is healthy; the commands run in cwd."""
    report = run(one_try(command_health("true", f'test "$(pwd)" = {tmp_path}'), tmp_path))
    assert report.healthy and report.checked == ("commands",)


def test_a_failing_command_gives_the_end_of_its_stderr(tmp_path: Path) -> None:
    """Non-zero exit: unhealthy, the reason is how it ended and its last stderr lines (not stdout, not the start)."""
    line = "echo to-stdout; for i in $(seq 1 50); do echo line$i >&2; done; echo 'disk /data is read-only' >&2; exit 3"
    report = run(one_try(command_health("true", line), tmp_path))
    [failure] = report.failures
    assert failure.check == "command"
    assert failure.subject == line
    assert failure.reason.startswith("exit 3: line42 | ")
    assert failure.reason.endswith("line50 | disk /data is read-only")
    assert "to-stdout" not in failure.reason and "line41" not in failure.reason


def test_stdout_is_the_reason_when_stderr_is_empty(tmp_path: Path) -> None:
    """A check that says what is wrong on stdout is quoted too; a signal death is named."""
    report = run(one_try(command_health("echo 'no infiniband port up'; exit 1", "kill -9 $$"), tmp_path))
    assert [f.reason for f in report.failures] == ["exit 1: no infiniband port up", "killed by SIGKILL"]


def test_a_command_past_its_timeout_is_killed_with_its_children(tmp_path: Path) -> None:
    """sleep past the timeout: the whole process group (children, grandchildren) is killed, at once."""
    pids = tmp_path / "pids"
    line = f"sleep 60 & echo $! >> {pids}; sh -c 'sleep 60 & echo $! >> {pids}; wait' & sleep 60"
    started = time.monotonic()
    report = run(one_try(command_health(HealthCommand(line, timeout=0.5)), tmp_path))
    assert time.monotonic() - started < 5
    [failure] = report.failures
    assert failure.reason == "did not finish in 500ms (its process group was killed)"
    children = [int(p) for p in pids.read_text().split()]
    assert len(children) == 2
    wait_for(lambda: not any(alive(p) for p in children), 10, "the command's children to be gone")


def test_what_a_passing_command_leaves_behind_is_killed(tmp_path: Path) -> None:
    """A background process a check started does not outlive the check (nor keep it waiting on its pipe)."""
    pid_file = tmp_path / "pid"
    started = time.monotonic()
    report = run(one_try(command_health(f"sleep 60 & echo $! > {pid_file}"), tmp_path))
    assert report.healthy and time.monotonic() - started < 5
    wait_for(lambda: not alive(int(pid_file.read_text())), 10, "the left-over sleep to be gone")


def test_output_is_bounded_in_memory(tmp_path: Path) -> None:
    """20 MB of stderr: only the tail is kept, and the reason is short."""
    line = f"{sys.executable} -c \"import sys; sys.stderr.write('x' * 20_000_000 + '\\\\nlast words\\\\n'); sys.exit(2)\""
    result = run(run_command(["/bin/sh", "-c", line], timeout=30, env=HELPER_ENV, tail_bytes=4096))
    assert result.exit_code == 2
    assert len(result.stderr) == 4096 and result.stderr.endswith(b"last words\n")
    report = run(one_try(command_health(line), tmp_path))
    assert report.failures[0].reason.endswith("| last words")
    assert len(report.failures[0].reason) <= 510


def test_commands_get_the_helper_environment_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No secret of the agent's (nor anything but PATH, locale, TZ, TMPDIR) reaches a check command."""
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("LANG", "C.UTF-8")
    spec = load_spec_text(f"""
name: j
entrypoint: t.py
env: {{DB_PASSWORD: hunter2}}
cwd: {tmp_path}
health:
  commands: ['env > {tmp_path / "env"}']
""")
    report = run(check_spec(spec))
    assert report.healthy
    seen = dict(line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line)
    assert "HF_TOKEN" not in seen and "DB_PASSWORD" not in seen
    assert seen["PATH"] == os.environ["PATH"] and seen["LANG"] == "C.UTF-8"
    assert set(seen) <= {"PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TZ", "TMPDIR", "PWD",
                         "SHLVL", "_", "OLDPWD"}  # the last four: what sh itself sets


def test_a_command_that_cannot_start(tmp_path: Path) -> None:
    """A missing cwd is a failure with its reason, not an exception."""
    report = run(check(command_health("true"), logs_dir=str(tmp_path), cwd=str(tmp_path / "gone"), environ={},
                       helper_environ=HELPER_ENV))
    assert report.failures[0].reason.startswith("cannot start /bin/sh: No such file or directory")


def test_the_try_timeout_kills_the_running_command_and_skips_the_rest(tmp_path: Path) -> None:
    """health.timeout ends the try: the running command is killed, the ones after it are reported not run."""
    pid_file = tmp_path / "pid"
    health = command_health(f"echo $$ > {pid_file}; sleep 60", "true", timeout=0.5)
    started = time.monotonic()
    report = run(one_try(health, tmp_path))
    assert time.monotonic() - started < 5
    assert [(f.subject, f.reason) for f in report.failures] == [
        (f"echo $$ > {pid_file}; sleep 60", "did not finish in health.timeout (500ms); killed"),
        ("true", "not run: health.timeout was up"),
    ]
    wait_for(lambda: not alive(int(pid_file.read_text())), 10, "the command to be gone")


def test_a_cancelled_try_kills_its_command(tmp_path: Path) -> None:
    """Cancelling the try (a stop request while checking) kills the command's group too."""
    pid_file = tmp_path / "pid"

    async def scenario() -> None:
        task = asyncio.ensure_future(one_try(command_health(f"echo $$ > {pid_file}; sleep 60"), tmp_path))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(scenario())
    wait_for(lambda: not alive(int(pid_file.read_text())), 10, "the command to be gone")


def test_secrets_in_a_command_line_are_masked_in_the_reason(tmp_path: Path) -> None:
    """A reason names the command as `runner plan` would show it."""
    report = run(one_try(command_health("curl -s http://u:hunter2@h/ >/dev/null; echo token=abc >&2; exit 1"),
                         tmp_path))
    shown = str(report.failures[0])
    assert "hunter2" not in shown and "abc" not in shown and "***" in shown


# --- GPUs ---------------------------------------------------------------------------------------------------------

H100S = """0, GPU-11111111-aaaa-bbbb-cccc-000000000000, NVIDIA H100 80GB HBM3, 00000000:18:00.0, 0
1, GPU-22222222-aaaa-bbbb-cccc-000000000000, NVIDIA H100 80GB HBM3, 00000000:2A:00.0, 0
2, GPU-33333333-aaaa-bbbb-cccc-000000000000, NVIDIA H100 80GB HBM3, 00000000:3A:00.0, [N/A]
3, GPU-44444444-aaaa-bbbb-cccc-000000000000, NVIDIA H100 80GB HBM3, 00000000:5D:00.0, 2
"""
LOST = """0, GPU-11111111-aaaa-bbbb-cccc-000000000000, NVIDIA A100-SXM4-40GB, 00000000:07:00.0, 0
1, [GPU is lost], [GPU is lost], 00000000:0F:00.0, [GPU is lost]
Unable to determine the device handle for GPU 00000000:47:00.0: Unknown Error
"""


def test_parse_query_of_healthy_and_sick_gpus() -> None:
    """Rows become GPUs; a lost GPU and uncorrectable ECC errors are problems; [N/A] is not; other lines are kept."""
    gpus, other = parse_query(H100S)
    assert [g.index for g in gpus] == [0, 1, 2, 3] and other == []
    assert [g.problem for g in gpus] == ["", "", "", "2 uncorrectable ECC error(s) since the driver loaded"]
    gpus, other = parse_query(LOST)
    assert [g.problem for g in gpus] == ["", "GPU is lost"]
    assert other == ["Unable to determine the device handle for GPU 00000000:47:00.0: Unknown Error"]


def test_visible_follows_cuda_visible_devices() -> None:
    """Indices and UUID prefixes in CUDA's order, up to the first entry that names no GPU; MIG kept as text."""
    gpus, _ = parse_query(H100S)
    assert [g.index for g in visible(gpus, None)] == [0, 1, 2, 3]  # type: ignore[union-attr]
    assert [g.index for g in visible(gpus, "2,0")] == [2, 0]  # type: ignore[union-attr]
    assert [g.index for g in visible(gpus, "GPU-4444, 1")] == [3, 1]  # type: ignore[union-attr]
    assert visible(gpus, "1,7,2") == [gpus[1]]
    assert visible(gpus, "1,1") == [gpus[1]]
    assert visible(gpus, "") == []
    assert visible(gpus, "MIG-abc") == ["MIG-abc"]


def test_assess_checks_only_the_gpus_the_workers_use() -> None:
    """GPU 3's ECC errors matter only when it is among the first `needed` visible GPUs."""
    gpus, _ = parse_query(H100S)
    assert assess(gpus, 3, None) == []
    assert [str(f) for f in assess(gpus, 4, None)] == [
        "gpus GPU 3 (00000000:5D:00.0): 2 uncorrectable ECC error(s) since the driver loaded"]
    assert [str(f) for f in assess(gpus, 2, "0,3")] == [
        "gpus GPU 3 (00000000:5D:00.0): 2 uncorrectable ECC error(s) since the driver loaded"]
    assert [str(f) for f in assess(gpus, 8, "0,1")] == ["gpus: needs 8 GPU(s), 2 visible with CUDA_VISIBLE_DEVICES='0,1'"]


@given(st.lists(st.tuples(st.integers(0, 64), st.text(alphabet="0123456789abcdef-", max_size=12),
                          st.text(alphabet="ABCDEFGHIJ xyz0123456789", max_size=20),
                          st.sampled_from(["0", "3", "[N/A]", "[Not Supported]", "[GPU is lost]"])), max_size=8))
def test_parse_query_round_trip(rows: list[tuple[int, str, str, str]]) -> None:
    """Generated rows read back, each with a problem exactly when its ECC count is non-zero or the GPU is lost."""
    text = "".join(f"{i}, GPU-{u}, {n}, 00000000:{i:02X}:00.0, {e}\n" for i, u, n, e in rows)
    gpus, other = parse_query(text)
    assert other == []
    assert [(g.index, g.uuid, g.name) for g in gpus] == [(i, f"GPU-{u}", n.strip()) for i, u, n, _ in rows]
    assert [bool(g.problem) for g in gpus] == [e in ("3", "[GPU is lost]") for *_, e in rows]


@given(st.text(max_size=400), st.one_of(st.none(), st.text(max_size=30)), st.integers(0, 16))
def test_gpu_parsers_take_any_text(text: str, cvd: str | None, needed: int) -> None:
    """Whatever nvidia-smi or CUDA_VISIBLE_DEVICES say, parsing and assessing never raise."""
    gpus, _ = parse_query(text)
    for failure in assess(gpus, needed, cvd):
        assert isinstance(failure, HealthFailure)


def fake_nvidia_smi(tmp_path: Path, body: str) -> str:
    """A stand-in nvidia-smi: a real script that checks its arguments and prints what it is given."""
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\n"
                      'case "$1" in --query-gpu=index,uuid,name,pci.bus_id,ecc.errors.uncorrected.volatile.total) ;;'
                      ' *) echo "bad query $1" >&2; exit 64;; esac\n' + body)
    script.chmod(0o755)
    return str(script)


def test_check_gpus_through_a_stand_in_nvidia_smi(tmp_path: Path) -> None:
    """The whole path on real processes: healthy, an ECC error, a failing driver, a hung nvidia-smi, none at all."""
    (tmp_path / "out").write_text(H100S)
    healthy = fake_nvidia_smi(tmp_path, f"cat {tmp_path / 'out'}\n")

    def gpu_check(needed: int, exe: str | None, **kw: object) -> list[str]:
        found = run(check_gpus(needed, environ={}, helper_environ=kw.pop("helper", HELPER_ENV),  # type: ignore[arg-type]
                               nvidia_smi=exe, **kw))  # type: ignore[arg-type]
        return [str(f) for f in found]

    assert gpu_check(2, healthy) == []
    assert gpu_check(4, healthy) == ["gpus GPU 3 (00000000:5D:00.0): 2 uncorrectable ECC error(s) since the driver loaded"]
    broken = fake_nvidia_smi(tmp_path, "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                                       'driver."; exit 9\n')
    assert gpu_check(1, broken) == [
        "gpus: nvidia-smi failed (exit 9): NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."]
    hung = fake_nvidia_smi(tmp_path, "sleep 60\n")
    assert gpu_check(1, hung, timeout=0.5) == ["gpus: nvidia-smi did not answer in 0.5 s (a hung driver?)"]
    assert gpu_check(1, None, helper={"PATH": str(tmp_path / "empty")}) == [
        "gpus: needs 1 NVIDIA GPU(s), but nvidia-smi is not on PATH"]


def test_no_gpu_in_the_spec_means_no_gpu_check(tmp_path: Path) -> None:
    """gpus: 0 runs nothing; gpus: 2 on this machine (no nvidia-smi on PATH) is unhealthy with the reason."""
    assert run(one_try(Health(), tmp_path)).checked == ()
    report = run(check(Health(gpus=2), logs_dir=str(tmp_path), cwd=str(tmp_path), environ={},
                       helper_environ={"PATH": str(tmp_path)}))
    assert report.reasons() == ["gpus: needs 2 NVIDIA GPU(s), but nvidia-smi is not on PATH"]


def make_root(tmp_path: Path, nvidia: int = 0, amd: int = 0) -> Path:
    root = tmp_path / "root"
    for i in range(nvidia):
        (root / f"proc/driver/nvidia/gpus/0000:{i:02x}:00.0").mkdir(parents=True)
    for i in range(amd):
        node = root / f"sys/class/kfd/kfd/topology/nodes/{i + 1}"
        node.mkdir(parents=True)
        (node / "properties").write_text("simd_count 304\n")
    return root


def test_auto_gpus_are_the_nvidia_gpus_the_spec_uses(tmp_path: Path) -> None:
    """nproc_per_node gpu/auto on NVIDIA: that many; cluster.gpus_per_node otherwise (not on AMD); else none."""
    nvidia, amd, none = make_root(tmp_path / "n", nvidia=8), make_root(tmp_path / "a", amd=4), make_root(tmp_path / "c")
    assert nvidia_gpus_used("gpu", 8, 0, {}, nvidia) == 8
    assert nvidia_gpus_used("auto", 8, 0, {}, nvidia) == 8
    assert nvidia_gpus_used("auto", 16, 0, {"CUDA_VISIBLE_DEVICES": ""}, nvidia) == 0  # auto counted CPUs
    assert nvidia_gpus_used(4, 4, 0, {}, nvidia) == 0
    assert nvidia_gpus_used(4, 4, 4, {}, nvidia) == 4
    assert nvidia_gpus_used("gpu", 4, 4, {}, amd) == 0
    assert nvidia_gpus_used(1, 1, 2, {}, none) == 2  # asked the scheduler for GPUs, got a node without
    assert nvidia_gpus_used("auto", 2, 0, {}, none) == 0


# --- the section in the spec ---------------------------------------------------------------------------------------


def test_the_section_loads_resolved(tmp_path: Path) -> None:
    """Sizes in bytes, paths absolute against cwd, command shorthand, durations in seconds."""
    spec = load_spec_text(f"""
name: j
entrypoint: t.py
cwd: {tmp_path}
health:
  min_free: 1GiB
  paths: [ckpt, {{path: /data, min_free: 10 GB}}]
  min_free_memory: 512Mi
  gpus: 0
  commands: ["true", {{run: "sleep 1", timeout: 5s}}]
  timeout: 1m
  retry_interval: 2s
  give_up_after: null
""", base_dir=tmp_path)
    assert spec.health == Health(
        min_free=1 << 30, paths=(HealthPath(str(tmp_path / "ckpt")), HealthPath("/data", 10**10)),
        min_free_memory=512 << 20, gpus=0, commands=(HealthCommand("true"), HealthCommand("sleep 1", 5.0)),
        timeout=60.0, retry_interval=2.0, give_up_after=None)
    assert spec.health.configured
    assert not load_spec_text("name: j\nentrypoint: t.py\n").health.configured


@pytest.mark.parametrize(("section", "expected"), [
    ("min_free: 1 GiBs", ("health.min_free: expected a size, found the string '1 GiBs' — write bytes as a number, or "
                          "a string such as 512MiB, 1GiB, 100MB")),
    ("min_free: 9999999PiB", "health.min_free: '9999999PiB' is larger than 9223372036854775807 bytes (8 EiB)"),
    ("min_free_memory: -1", "health.min_free_memory: must be >= 0, found the integer -1"),
    ("retry_interval: 0", "health.retry_interval: must be greater than 0, found 0"),
    ("commands: [{run: x, timeout: 2m}]", ("health.commands[0]: its timeout (120 s) is longer than health.timeout "
                                           "(60 s), which stops every check of a try")),
    ("commands: [{timeout: 2s}]", "health.commands[0]: missing required key 'run'"),
    ("paths: [{path: x, min_free: lots}]", "health.paths[0].min_free: expected a size"),
    ("gpus: -1", "health.gpus: must be >= 0"),
    ("give_up: 1m", "health: unknown key 'give_up' — did you mean 'give_up_after'?"),
])
def test_validate_refuses_bad_values(section: str, expected: str) -> None:
    """Each bad value is refused at its line, with what is wrong and how to fix it."""
    with pytest.raises(SpecError) as err:
        load_spec_text(f"name: j\nentrypoint: t.py\nhealth:\n  {section}\n", source="job.yaml")
    assert expected in str(err.value)
    assert "job.yaml:4:" in str(err.value)


def test_plan_shows_the_section() -> None:
    """`runner plan` prints the resolved section (bytes, seconds, commands with their timeout)."""
    from runner.cli.plan import plan_view

    spec = load_spec_text("name: j\nentrypoint: t.py\nhealth: {min_free: 1KiB, commands: [df -h]}\n")
    assert plan_view(spec)["spec"]["health"] == {
        "min_free": 1024, "paths": [], "min_free_memory": 0, "gpus": 0,
        "commands": [{"run": "df -h", "timeout": 30.0}], "timeout": 60.0, "retry_interval": 10.0,
        "give_up_after": 60.0, "max_failures": 0, "failure_window": 86400.0}


def test_a_resolved_spec_loads_again() -> None:
    """spec.json (the resolved spec, as `runner status` reads it back) is itself a valid spec with the same section."""
    import json

    spec = load_spec_text("name: j\nentrypoint: t.py\nhealth: {min_free: 1KiB, paths: [/x], commands: [df]}\n")
    again = load_spec_text(json.dumps(spec.to_dict()))
    assert again.health == spec.health


# --- tries until healthy --------------------------------------------------------------------------------------------


class Clock:
    """A fake monotonic clock that sleeping advances."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def scripted(healthy: list[bool], clock: Clock, cost: float = 1.0) -> tuple[list[float], object]:
    budgets: list[float] = []
    answers = list(healthy)

    async def try_once(budget: float) -> HealthReport:
        budgets.append(budget)
        clock.now += cost
        ok = answers.pop(0)
        return HealthReport(("disk /x",), () if ok else (HealthFailure("disk", "1MiB free, needs 1GiB", "/x"),))

    return budgets, try_once


def test_until_healthy_retries_then_passes() -> None:
    """Two failed tries (each logged with its reasons and given to on_failed), then a pass."""
    clock = Clock()
    budgets, try_once = scripted([False, False, True], clock)
    seen: list[HealthReport] = []

    async def on_failed(report: HealthReport) -> None:
        seen.append(report)

    health = Health(min_free=1, retry_interval=10, give_up_after=60, timeout=30)
    with structlog.testing.capture_logs() as logs:
        report = run(until_healthy(health, try_once, log=structlog.get_logger(), on_failed=on_failed,  # type: ignore[arg-type]
                                   sleep=clock.sleep, clock=clock))
    assert report.healthy and len(seen) == 2
    assert clock.sleeps == [10, 10]
    assert budgets == [30, 30, 30]
    failed = [e for e in logs if e["event"] == "health_failed"]
    assert [e["reasons"] for e in failed] == [["disk /x: 1MiB free, needs 1GiB"]] * 2
    assert failed[0]["retry_in_s"] == 10 and failed[0]["log_level"] == "warning"
    assert next(e for e in logs if e["event"] == "health_passed")["tries"] == 3


def test_until_healthy_gives_up_after_give_up_after() -> None:
    """Always failing: tries every retry_interval, later tries bounded by the time left, Unhealthy (exit 3) at 60 s."""
    clock = Clock()
    budgets, try_once = scripted([False] * 20, clock)
    health = Health(min_free=1, retry_interval=10, give_up_after=60, timeout=30)
    with structlog.testing.capture_logs() as logs, pytest.raises(Unhealthy) as err:
        run(until_healthy(health, try_once, log=structlog.get_logger(), sleep=clock.sleep, clock=clock))  # type: ignore[arg-type]
    assert err.value.exit_code == EXIT_INFRA
    assert err.value.tries == 6 and clock.now == 60
    assert budgets == [30, 30, 30, 27, 16, 5]  # tries take 1 s: at 0, 11, 22, 33, 44, 55; then 5 s to the end
    assert "disk /x: 1MiB free, needs 1GiB" in err.value.message and "(6 tries)" in err.value.message
    assert logs[-1]["event"] == "health_failed" and logs[-1]["giving_up_in_s"] == 4


def test_give_up_after_zero_ends_at_the_first_failure_and_null_never_gives_up() -> None:
    """0: one try; null: keeps trying (here until it passes on the 30th try)."""
    clock = Clock()
    _, try_once = scripted([False], clock)
    with pytest.raises(Unhealthy) as err:
        run(until_healthy(Health(min_free=1, give_up_after=0), try_once, log=structlog.get_logger(),  # type: ignore[arg-type]
                          sleep=clock.sleep, clock=clock))
    assert err.value.tries == 1 and clock.sleeps == [0]
    clock = Clock()
    _, try_once = scripted([*[False] * 29, True], clock)
    report = run(until_healthy(Health(min_free=1, give_up_after=None), try_once, log=structlog.get_logger(),  # type: ignore[arg-type]
                               sleep=clock.sleep, clock=clock))
    assert report.healthy and len(clock.sleeps) == 29


def test_until_healthy_with_real_checks(tmp_path: Path) -> None:
    """A command that fails until a file appears: the node passes on the try after it appears."""
    flag = tmp_path / "ready"
    health = Health(commands=(HealthCommand(f"test -e {flag} || {{ echo 'waiting for {flag.name}' >&2; exit 1; }}"),),
                    retry_interval=0.2, give_up_after=30)
    tries: list[HealthReport] = []

    async def on_failed(report: HealthReport) -> None:
        tries.append(report)
        if len(tries) == 2:
            flag.touch()

    async def try_once(budget: float) -> HealthReport:
        return await one_try(health, tmp_path, timeout=budget)

    report = run(until_healthy(health, try_once, log=structlog.get_logger(), on_failed=on_failed))
    assert report.healthy and len(tries) == 2
    shown = shown_command(health.commands[0].run)  # cut at MAX_SUBJECT_CHARS: tmp_path's length varies by run
    assert tries[0].reasons() == [f"command {shown}: exit 1: waiting for ready"]
    assert tries[0].to_dict()["failures"] == [{"check": "command", "subject": shown,
                                               "reason": "exit 1: waiting for ready"}]


# --- what other nodes and `runner status` see of an unhealthy node -------------------------------------------------


def test_a_node_out_for_its_health_holds_no_round_open() -> None:
    """A node of the previous round whose live state says `unhealthy` is not waited for (the round closes without
    it once nodes.min joined); a node that merely has not joined yet still is."""
    from runner.rendezvous.etcd.round import Roster, pending

    unhealthy = {"state": "RENDEZVOUS", "unhealthy": {"healthy": False, "failures": []}}
    states = {"a": {"state": "RENDEZVOUS"}, "b": unhealthy}
    assert pending(["a", "b"], joined={}, states=states) == ["a"]
    roster = Roster(["a", "b"])
    roster.state("a", json.dumps(states["a"]).encode())
    roster.state("b", json.dumps(unhealthy).encode())
    assert roster.waiting_list() == ["a"]
    roster.state("b", json.dumps({"state": "RENDEZVOUS"}).encode())  # healthy again, about to join
    assert roster.waiting_list() == ["a", "b"]
    roster.join("b", b"{}")
    assert roster.waiting_list() == ["a"]


def test_nodes_share_the_health_section_but_not_its_paths_nor_secrets() -> None:
    """health.paths resolve against cwd (node-local); a command line's secret never reaches etcd in clear."""
    from runner.rendezvous.spec_check import shared_digest, shared_tree

    text = "name: j\nentrypoint: t.py\ncwd: {cwd}\nhealth: {{paths: [ckpt], commands: ['curl -fs http://u:{pw}@h/']}}\n"
    a = load_spec_text(text.format(cwd="/a", pw="hunter2"))
    b = load_spec_text(text.format(cwd="/b", pw="hunter2"))
    c = load_spec_text(text.format(cwd="/a", pw="other"))
    assert a.health.paths != b.health.paths and shared_digest(a) == shared_digest(b)
    assert shared_digest(a) != shared_digest(c)
    tree = shared_tree(a)
    assert "paths" not in tree["health"] and "hunter2" not in json.dumps(tree)
    assert tree["health"]["commands"][0]["timeout"] == 30.0


def test_status_shows_why_a_node_is_unhealthy(capsys: pytest.CaptureFixture[str]) -> None:
    """`runner status`: the FAILURE column and the one-shot text name the failed checks."""
    from runner.cli.status import print_status
    from runner.runs.status import failure_class

    report = HealthReport(("disk /ckpt", "commands"), (HealthFailure("disk", "1MiB free, needs 1GiB", "/ckpt"),
                                                       HealthFailure("command", "exit 1: no ib port", "ibstat")))
    node = {"node": "n1", "state": "RENDEZVOUS", "attempt": 0, "workers": [], "unhealthy": report.to_dict()}
    assert failure_class(node) == "unhealthy: disk /ckpt: 1MiB free, needs 1GiB (+1)"
    assert failure_class({"node": "n2", "unhealthy": None, "failure": {"class": "oom"}}) == "oom"
    print_status({"job": "j", "status": "rendezvous", "nodes": [node]})
    out = capsys.readouterr().out
    assert "    unhealthy: disk /ckpt: 1MiB free, needs 1GiB\n    unhealthy: command ibstat: exit 1: no ib port" in out
