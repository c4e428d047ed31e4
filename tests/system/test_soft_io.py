"""Every write, flush and close the agent, its guard and the tee do fails soft: /dev/full (ENOSPC on every write),
an injected os.write that fails half-way, and real full or read-only tmpfs mounts (root only).

JsonLines and write_private raise OSError from a write (their callers warn) and leave nothing behind: no
temporary file, no buffered line that a close would flush (and fail on) again; close never raises. The tee and
the runs index's callers never raise at all.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from ci_skips import need

from runner.cli.main import internal_error
from runner.observe.logs import JsonLines, RunLog
from runner.observe.logs_dir import FALLBACK, choose, probe
from runner.runs import index
from runner.system import soft_io
from runner.system.private_files import write_private
from runner.workers.tee import Tee, open_log

FULL = Path("/dev/full")
ENOSPC = errno.ENOSPC


@pytest.fixture(autouse=True)
def fresh() -> Iterator[list[dict[str, Any]]]:
    """Each test counts failed writes afresh, with structlog's events captured."""
    soft_io.forget()
    with structlog.testing.capture_logs() as events:
        yield events
    soft_io.forget()


@pytest.fixture
def full_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs, filled to the last byte (root only); unmounted at the end."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        need("mounting a tmpfs needs root and mount(8)")
    mnt = tmp_path / "full"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True,
                          check=False)
    if done.returncode != 0:
        need(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        fill(mnt / "filler")
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(path: Path) -> None:
    """Write `path` until the disk refuses (ENOSPC)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError as e:
        assert e.errno == ENOSPC
    finally:
        os.close(fd)


def half_then_enospc(monkeypatch: pytest.MonkeyPatch) -> None:
    """os.write (as runner.system.soft_io calls it) writes half of what it is given, then fails with ENOSPC."""
    real = os.write
    calls = {"n": 0}

    def write(fd: int, data: Any) -> int:
        calls["n"] += 1
        if calls["n"] % 2:
            return real(fd, bytes(data)[: max(1, len(data) // 2)])
        raise OSError(ENOSPC, os.strerror(ENOSPC))

    monkeypatch.setattr(soft_io.os, "write", write)


# -- JsonLines and the agent's own log -----------------------------------------------------------------


def test_json_lines_on_dev_full_raises_from_write_and_never_from_close() -> None:
    """Every write fails with ENOSPC (the caller warns); close, twice, never raises: nothing was buffered."""
    sink = JsonLines(FULL)
    for _ in range(3):
        with pytest.raises(OSError) as caught:
            sink.write({"event": "transition"})
        assert caught.value.errno == ENOSPC
    sink.close()
    sink.close()


def test_json_lines_after_a_torn_line_starts_on_a_fresh_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Half a line went in before the disk refused: the next line starts with a newline, so it parses."""
    path = tmp_path / "transitions.jsonl"
    sink = JsonLines(path)
    sink.write({"n": 0})
    with monkeypatch.context() as m:
        half_then_enospc(m)
        with pytest.raises(OSError):
            sink.write({"n": 1, "pad": "x" * 100})
    sink.write({"n": 2})
    sink.close()
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"n": 0} and json.loads(lines[-1]) == {"n": 2}
    assert len(lines) == 3  # the torn half of line 1 stays junk of its own


def test_run_log_on_dev_full_keeps_the_event_and_notes_the_failure_once() -> None:
    """The structlog processor never raises: the event goes on (to the console) with a note; close never raises."""
    run_log = RunLog()
    run_log.open(FULL)
    first = run_log(None, "info", {"event": "a"})
    assert "agent.jsonl stopped" in str(first["agent_log"])
    assert run_log(None, "info", {"event": "b"}) == {"event": "b"}  # stopped for good: no retry per event
    run_log.close()
    assert list(soft_io.failures()) == ["agent_log_write_failed"]


def test_a_failing_close_is_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      fresh: list[dict[str, Any]]) -> None:
    """close(2) failing (EIO on NFS) is a warning once per kind; the descriptor is gone either way."""
    sink = JsonLines(tmp_path / "agent.jsonl")
    sink.write({"event": "a"})
    real_close = os.close

    def close(fd: int) -> None:
        real_close(fd)
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(soft_io.os, "close", close)
    sink.close()
    sink.close()
    assert [e["event"] for e in fresh] == ["log_close_failed"]


# -- write_private: status.json, report.json, failure.json, spec.json ----------------------------------


def test_write_private_on_a_failing_disk_raises_and_leaves_nothing(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The first write goes half-way, the next fails: OSError, the old file intact, no temporary file left."""
    path = tmp_path / "status.json"
    write_private(path, "old")
    half_then_enospc(monkeypatch)
    with pytest.raises(OSError) as caught:
        write_private(path, "new" * 1000)
    assert caught.value.errno == ENOSPC
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]


def test_write_private_on_a_full_tmpfs_raises_and_leaves_nothing(full_tmpfs: Path) -> None:
    """A real full disk: the file is created (an inode is free) but its bytes are refused."""
    with pytest.raises(OSError) as caught:
        write_private(full_tmpfs / "report.json", "{}" * 5000)
    assert caught.value.errno == ENOSPC
    assert sorted(p.name for p in full_tmpfs.iterdir()) == ["filler"]


# -- the tee ---------------------------------------------------------------------------------------------


async def tee_through(log_path: str, console: Path, chunks: list[bytes], between: Any = None) -> Tee:
    """Run a Tee on a real pipe: write `chunks` (calling `between()` after the first), close, wait for EOF."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    r, w = os.pipe()
    with console.open("w") as out:
        tee = Tee(open(r, "rb", buffering=0), log_path, out, "[0] ")  # noqa: SIM115 - the Tee closes it
        for i, chunk in enumerate(chunks):
            os.write(w, chunk)
            for _ in range(200):
                await asyncio.sleep(0.005)
                if not select_ready(r):
                    break
            if i == 0 and between is not None:
                between()
        os.close(w)
        for _ in range(400):
            if tee.closed:
                break
            await asyncio.sleep(0.005)
        assert tee.closed
        tee.finish()
        tee.close()
    assert errors == []  # nothing escaped into the event loop
    return tee


def select_ready(fd: int) -> bool:
    """Whether `fd` still holds data to read."""
    import select

    return bool(select.select([fd], [], [], 0)[0])


def test_tee_to_dev_full_echoes_everything_and_counts_what_the_log_lost(tmp_path: Path,
                                                                       fresh: list[dict[str, Any]]) -> None:
    """Every write of the log file fails: no exception reaches the loop, the console gets every line."""
    console = tmp_path / "console"
    chunks = [b"".join(b"line %d\n" % i for i in range(k, k + 100)) for k in range(0, 500, 100)]
    tee = asyncio.run(tee_through(str(FULL), console, chunks))
    assert tee.lost == sum(map(len, chunks))
    from runner.workers.tee import Console

    Console.drain_all(5.0)
    assert console.read_text().count("[0] line") == 500
    assert [e["event"] for e in fresh] == ["worker_log_write_failed"]


def test_tee_says_in_the_log_what_it_lost_once_the_disk_takes_bytes_again(full_tmpfs: Path) -> None:
    """A real full disk, freed during the run: the log gets a line that says how many bytes went missing."""
    log = full_tmpfs / "stdout.log"
    tee = asyncio.run(tee_through(str(log), full_tmpfs / ".." / "console", [b"lost\n" * 10, b"kept\n"],
                                  between=lambda: (full_tmpfs / "filler").unlink()))
    assert tee.lost == 0
    text = log.read_text()
    assert "[runner] 50 byte(s) of output lost here: No space left on device" in text
    assert text.endswith("kept\n")


def test_tee_whose_log_cannot_be_created_still_echoes(tmp_path: Path, fresh: list[dict[str, Any]]) -> None:
    """Its folder is missing (a logs disk that could not make it): a warning, the console gets the output."""
    missing = tmp_path / "no" / "stdout.log"
    assert open_log(str(missing)) is None
    tee = asyncio.run(tee_through(str(missing), tmp_path / "console", [b"hello\n"]))
    assert tee.lost == 0
    assert [e["event"] for e in fresh] == ["worker_log_unwritable"]


def test_a_tee_keeps_the_last_lines_in_memory_whatever_the_disk_took(full_tmpfs: Path, tmp_path: Path,
                                                                     fresh: list[dict[str, Any]]) -> None:
    """The root cause survives a full logs disk: the file lost the output, the tee's memory has its last lines."""
    lines = [f"line {i}\n".encode() for i in range(100)]
    tee = asyncio.run(tee_through(str(full_tmpfs / "stderr.log"), tmp_path / "console", [b"".join(lines)]))
    assert tee.lost > 0  # the disk refused it
    assert tee.tail(3) == "line 97\nline 98\nline 99"
    assert [e["event"] for e in fresh] == ["worker_log_write_failed"]


# -- the runs index, the guard, the CLI's last resort -----------------------------------------------------


def test_the_runs_index_on_a_full_disk_is_one_warning(full_tmpfs: Path, monkeypatch: pytest.MonkeyPatch,
                                                     fresh: list[dict[str, Any]]) -> None:
    """record_start and record_end on a full state dir: one warning, no exception, no temporary file."""
    monkeypatch.setenv("XDG_STATE_HOME", str(full_tmpfs))
    log = structlog.get_logger("runner")
    (full_tmpfs / "runner").mkdir()
    index.record_start("job", "node", full_tmpfs / "run", "local", log)
    index.record_end("node", full_tmpfs / "run", "succeeded", 0, 1, 0, log)
    assert [e["event"] for e in fresh] == ["runs_index_unwritable"]
    assert sorted(p.name for p in (full_tmpfs / "runner").iterdir()) in ([], ["runs.jsonl"])


def test_the_runs_index_skips_a_line_a_full_disk_cut_short(tmp_path: Path) -> None:
    """A torn last line (no newline) stays junk of its own: the next line is read."""
    path = tmp_path / "runs.jsonl"
    path.write_text('{"v":1,"kind":"start","job":"a"')
    index.append(index.start_line("job", "node", tmp_path / "run", "local", now=1.0), path)
    assert [r.job for r in index.read(path)] == ["job"]


def test_the_guard_says_nothing_and_goes_on_when_its_stderr_is_full() -> None:
    """The guard's stderr is /dev/full: `say` costs the line, never the guard (exit 0, no traceback)."""
    code = "from runner.system.shepherd_main import say; say('runner guard: hello\\n'); print('done')"
    with FULL.open("w") as err:
        done = subprocess.run([sys.executable, "-c", code], stderr=err, stdout=subprocess.PIPE, text=True,
                              check=False, cwd=Path(__file__).parents[2])
    assert done.returncode == 0 and done.stdout == "done\n"


def test_an_internal_error_with_no_temp_dir_still_prints_one_line(monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The crash file cannot be written: the one line says so, and internal_error itself never raises."""
    import tempfile

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise OSError(ENOSPC, os.strerror(ENOSPC))

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refuse)
    assert internal_error(RuntimeError("boom")) == 3
    err = capsys.readouterr().err
    assert "internal error: RuntimeError: boom (the traceback could not be saved: No space left on device" in err


# -- where the run dir goes --------------------------------------------------------------------------------


def spec_in(tmp_path: Path, logs: Path) -> Any:
    """A minimal spec whose logs.dir is `logs`."""
    from runner.config.loader import load_spec

    path = tmp_path / "job.yaml"
    path.write_text(f'version: 1\nname: disk\nentrypoint: {{command: ["true"]}}\nlogs: {{dir: "{logs}"}}\n')
    return load_spec(path)


def test_a_writable_logs_dir_is_kept_and_the_probe_leaves_nothing(tmp_path: Path) -> None:
    """The probe's folder and file are removed; the spec is the same object."""
    spec = spec_in(tmp_path, tmp_path / "logs")
    assert choose(spec, "job.yaml", tempdir=str(tmp_path / "tmp")) is spec
    assert list((tmp_path / "logs" / "disk").iterdir()) == []
    assert not (tmp_path / "tmp").exists()


def test_a_full_logs_dir_moves_this_runs_logs_to_the_temp_dir(tmp_path: Path, full_tmpfs: Path,
                                                              fresh: list[dict[str, Any]]) -> None:
    """The probe's byte is refused: logs.dir becomes <temp dir>/runner-logs, with one warning naming both."""
    spec = spec_in(tmp_path, full_tmpfs)
    moved = choose(spec, "job.yaml", tempdir=str(tmp_path / "tmp"))
    assert moved.logs.dir == str(tmp_path / "tmp" / FALLBACK)
    assert moved.logs.tee == spec.logs.tee and moved.name == spec.name
    assert [(e["event"], e["logs"]) for e in fresh] == [("logs_dir_unwritable", moved.logs.dir)]
    assert soft_io.failures() == {"logs_dir_unwritable": f"{full_tmpfs}: No space left on device"}


def test_when_the_temp_dir_is_full_too_the_run_stays_in_logs_dir(tmp_path: Path, full_tmpfs: Path) -> None:
    """Both disks are full but folders can be made: the run dir stays where the spec says; writes fail soft."""
    spec = spec_in(tmp_path, full_tmpfs / "logs")
    assert choose(spec, "job.yaml", tempdir=str(full_tmpfs / "tmp")) is spec
    assert probe(full_tmpfs / "x").made and probe(full_tmpfs / "x").error == "No space left on device"


def test_when_no_folder_can_be_made_anywhere_the_run_is_refused_with_exit_2(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """logs.dir and the temp dir both refuse a folder: SpecError (exit 2) on logs.dir, before anything starts."""
    from runner.errors import SpecError

    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the folders should be: mkdir fails (ENOTDIR), as on a read-only disk
    spec = spec_in(tmp_path, blocker / "logs")
    with pytest.raises(SpecError) as caught:
        choose(spec, "job.yaml", tempdir=str(blocker / "tmp"))
    assert caught.value.exit_code == 2
    assert caught.value.problems[0].path == "logs.dir"
    assert "no folder can hold this run's logs" in caught.value.message


def test_with_no_usable_temp_dir_a_full_logs_dir_keeps_the_run(tmp_path: Path, full_tmpfs: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """tempfile finds no temp dir it can write (all full): the run stays in logs.dir, nothing raises."""
    import tempfile

    def nowhere() -> str:
        raise FileNotFoundError(errno.ENOENT, "No usable temporary directory found")

    monkeypatch.setattr(tempfile, "gettempdir", nowhere)
    spec = spec_in(tmp_path, full_tmpfs)
    assert choose(spec, "job.yaml") is spec
