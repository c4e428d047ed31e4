"""The hosted lighthouse speaks the workers' TorchFT: their own, or one of the same version (docs/replica_groups.md).

TorchFT's managers and its lighthouse have no version handshake: a 0.3 manager retries its quorum forever against a
0.2 lighthouse. So, before any worker starts, the agent:

1. takes the `torchft_lighthouse` of the workers' own environment when there is one: beside the interpreter the
   workers run (`entrypoint.python`, else `$PYTHON_EXEC`, else the runner's own, as runner/workers/launch_plan.py
   picks it), else the runner's (`preflight.lighthouse_program`: beside the runner's interpreter, else on PATH);
2. asks both sides which TorchFT they have installed, `importlib.metadata.version("torchft")` (metadata only, no
   import of torchft or torch): the workers' interpreter with the workers' environment (the agent's plus the spec's
   `env`, so a PYTHONPATH there counts), and the lighthouse program's interpreter (its `#!` line) with the
   lighthouse's own environment (runner/system/environ.py `helper_env`); each within VERSION_TIMEOUT_S;
3. refuses different versions: `TorchftMismatch`, naming both, before any worker starts.

A side whose version cannot be known (a `command` entrypoint, a lighthouse that is no Python script, an
interpreter that fails or times out) is a warning, not a refusal: nothing says the two differ.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runner.config.preflight import lighthouse_program
from runner.errors import EXIT_SPEC, RunnerError
from runner.system.environ import helper_env

if TYPE_CHECKING:
    from runner.config.spec import JobSpec

VERSION_TIMEOUT_S = 30.0  # an interpreter's start and one metadata lookup; a loaded machine needs more than 1 s
MAX_VERSION_CHARS = 100  # a version string longer than this is no version
MAX_SHEBANG_BYTES = 512
LIGHTHOUSE = "torchft_lighthouse"
ASK = ("import importlib.metadata as m\n"
       "try:\n    print(m.version('torchft'))\n"
       "except m.PackageNotFoundError:\n    print('-')\n")  # '-': not installed there


class TorchftMismatch(RunnerError):
    """The hosted lighthouse's TorchFT is not the workers' version (exit 2: fix the environments)."""

    exit_code = EXIT_SPEC


@dataclass(frozen=True)
class Side:
    """One side of the check: the interpreter asked, and the version it answered (None: unknown, and why)."""

    python: str | None
    version: str | None
    why_unknown: str = ""


def workers_python(spec: JobSpec, env: Mapping[str, str]) -> str | None:
    """The interpreter the workers run, as the launch plan picks it; None for a `command` entrypoint."""
    ep = spec.entrypoint
    if ep.script is None and ep.module is None:
        return None
    return ep.python or env.get("PYTHON_EXEC") or sys.executable


def lighthouse_for(spec: JobSpec, env: Mapping[str, str]) -> str | None:
    """The workers' own `torchft_lighthouse` (beside their interpreter), else the runner's; None when neither."""
    python = workers_python(spec, env)
    if python is not None:
        found = shutil.which(python, path=env.get("PATH")) if os.sep not in python else python
        beside = Path(found).parent / LIGHTHOUSE if found else None  # the venv's bin/: never resolve its symlink
        if beside is not None and os.access(beside, os.X_OK):
            return str(beside)
    return lighthouse_program(env)


def interpreter_of(program: str) -> str | None:
    """The Python a script runs under, from its `#!` line (`#!/usr/bin/env python3` too); None for a binary."""
    try:
        with open(program, "rb") as f:
            first = f.read(MAX_SHEBANG_BYTES).split(b"\n", 1)[0]
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
    return words[0] if words and "python" in os.path.basename(words[0]) else None


def installed_version(python: str, env: Mapping[str, str], timeout: float = VERSION_TIMEOUT_S) -> Side:
    """What `python` (with `env`) says `importlib.metadata.version("torchft")` is."""
    try:
        done = subprocess.run([python, "-c", ASK], env=dict(env), stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Side(python, None, f"{python} did not answer within {timeout:g} s")
    except OSError as e:
        return Side(python, None, f"{python} could not be run: {e.strerror}")
    answer = done.stdout.decode(errors="replace").strip()
    if done.returncode != 0 or not answer or len(answer) > MAX_VERSION_CHARS or "\n" in answer:
        return Side(python, None, f"{python} gave no version (exit {done.returncode})")
    if answer == "-":
        return Side(python, None, f"torchft is not installed for {python}")
    return Side(python, answer)


def check(spec: JobSpec, program: str, env: Mapping[str, str], timeout: float = VERSION_TIMEOUT_S) -> list[str]:
    """Compare the workers' TorchFT with `program`'s; raise TorchftMismatch if they differ, else the warnings."""
    python = workers_python(spec, env)
    workers = (installed_version(python, {**env, **dict(spec.env)}, timeout) if python is not None
               else Side(None, None, "the entrypoint is a command: its interpreter is unknown"))
    light_python = interpreter_of(program)
    light = (installed_version(light_python, helper_env(env), timeout) if light_python is not None
             else Side(None, None, f"{program} is no Python script"))
    if workers.version is not None and light.version is not None and workers.version != light.version:
        raise TorchftMismatch(
            f"the hosted lighthouse ({program}) is TorchFT {light.version}, the workers' ({workers.python}) is "
            f"TorchFT {workers.version}: their managers would retry their quorum forever",
            f"install torchft=={workers.version} where the runner runs, or put torchft_lighthouse beside "
            f"{workers.python} (the workers' environment), or set replica_groups.lighthouse.address to a "
            "lighthouse of the workers' version")
    return [s.why_unknown for s in (workers, light) if s.version is None]


def matching_lighthouse(spec: JobSpec, env: Mapping[str, str], timeout: float = VERSION_TIMEOUT_S,
                        ) -> tuple[str | None, list[str]]:
    """The lighthouse program to host (None: none found) and why a version could not be checked (warnings)."""
    program = lighthouse_for(spec, env)
    if program is None:
        return None, []
    return program, check(spec, program, env, timeout)
