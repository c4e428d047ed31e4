"""Capture the Python stacks of a hung worker before it is signalled.

Only py-spy is used: it reads the target's memory from outside (ptrace), so the text comes back to us
and can go into the expiry report. The alternative, `faulthandler.register(SIGUSR1)` in the worker,
writes to the *worker's* stderr (already in its log file), and sending SIGUSR1 to a worker that did
not register it would kill it (SIGUSR1's default action is to terminate), so we never send it.
Without py-spy (not installed, or no ptrace permission) the report simply has no stacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
from pathlib import Path

import structlog

from runner.system.environ import helper_env

DEFAULT_TIMEOUT_S = 3.0
MAX_STACKS_CHARS = 64 * 1024  # keep reports and log lines bounded


def find_py_spy() -> str | None:
    """The py-spy executable: beside this interpreter (a venv that is not activated), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file():
        return str(beside)
    return shutil.which("py-spy")


async def capture_stacks(
    pid: int,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    py_spy: str | None = None,
    log: structlog.typing.FilteringBoundLogger | None = None,
) -> str:
    """`py-spy dump --pid PID` output, or "" when it cannot be had (the reason is logged)."""
    log = log or structlog.get_logger()
    exe = py_spy or find_py_spy()
    if exe is None:
        log.info("stacks_unavailable", pid=pid, reason="py-spy not found (pip install py-spy)")
        return ""
    proc = await asyncio.create_subprocess_exec(
        exe, "dump", "--pid", str(pid),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=helper_env(os.environ),  # py-spy needs no credential of the agent's
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        log.warning("stacks_unavailable", pid=pid, reason="py-spy timed out", timeout_s=timeout)
        return ""
    finally:
        await _reap(proc)
    if proc.returncode != 0:
        reason = err.decode(errors="replace").strip()[-500:]
        log.warning("stacks_unavailable", pid=pid, reason=reason, py_spy_exit=proc.returncode)
        return ""
    return out.decode(errors="replace")[:MAX_STACKS_CHARS]


async def _reap(proc: asyncio.subprocess.Process) -> None:
    """Kill py-spy if it is still running (timeout, cancellation) and wait for it (quick once killed)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    await proc.wait()
