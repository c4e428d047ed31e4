"""A job run on a real pseudo-terminal, and what the terminal shows: shared by the console and root-cause tests."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import textwrap
import time
from pathlib import Path

from conftest import RUNNER


def env(tmp_path: Path) -> dict[str, str]:
    return dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"), PYTHONUNBUFFERED="1", NO_COLOR="")


ERASE = "\r\x1b[K"
FRAME = re.compile(r"\r\x1b\[K([^\r\n]+)(?=\r|$)")  # what the live line drew (text not ended by a newline)
ANSI = re.compile(r"\x1b\[[0-9;]*[mK]")


def screen(raw: str) -> list[str]:
    """The lines a terminal shows at the end: a live line erased in place leaves nothing behind."""
    return [ANSI.sub("", line.rsplit("\r", 1)[-1]) for line in raw.split("\n")]


def frames(raw: str) -> list[str]:
    """Every text the live line drew, colours removed."""
    return [ANSI.sub("", f) for f in FRAME.findall(raw)]


def start_on_a_terminal(folder: Path, spec_text: str, script: str, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    """Start `runner job.yaml ARGS` in `folder` with stdout and stderr on a new pty; (process, pty's reading end)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "work.py").write_text(textwrap.dedent(script))
    (folder / "job.yaml").write_text(textwrap.dedent(spec_text))
    main, sub = pty.openpty()
    fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # 40 rows, 160 columns
    proc = subprocess.Popen([*RUNNER, str(folder / "job.yaml"), *args], cwd=folder,
                            env=env(folder), stdin=subprocess.DEVNULL, stdout=sub, stderr=sub)
    os.close(sub)
    return proc, main


def read_until(main: int, proc: subprocess.Popen[bytes], chunks: list[bytes], done: object = None,
               timeout: float = 120) -> bool:
    """Read the pty into `chunks` until `done(text so far)` is true (True) or the job ended (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(done) and done(b"".join(chunks).decode(errors="replace")):
            return True
        ready, _, _ = select.select([main], [], [], 0.5)
        if not ready:
            if proc.poll() is not None:
                return False
            continue
        try:
            data = os.read(main, 65536)
        except OSError:  # EIO: the job ended and the terminal's other side is closed
            return False
        if not data:
            return False
        chunks.append(data)
    raise AssertionError(f"timed out after {timeout} s; output so far:\n{b''.join(chunks).decode(errors='replace')}")


def finish(main: int, proc: subprocess.Popen[bytes], chunks: list[bytes]) -> tuple[int, str]:
    """Read to the end, reap the runner whatever happens; (exit code, raw output with newlines as written)."""
    try:
        read_until(main, proc, chunks)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main)
    return code, b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


def run_job_on_a_terminal(folder: Path, spec_text: str, script: str) -> tuple[int, str]:
    """Run a job to its end on a pty; (exit code, raw output)."""
    proc, main = start_on_a_terminal(folder, spec_text, script)
    return finish(main, proc, [])


def only_run_dir(folder: Path, job: str) -> Path:
    dirs = [d for d in (folder / "logs" / job).iterdir() if not d.is_symlink()]
    assert len(dirs) == 1, dirs
    return dirs[0]
