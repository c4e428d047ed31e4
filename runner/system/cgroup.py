"""A cgroup v2 per job (one child per worker), when this machine lets us make one: nothing in it can escape.

A process cannot leave its cgroup by setsid(), double-forking or clearing its environment, and `cgroup.kill`
SIGKILLs everything inside at once, with no pid to go stale. Used when a cgroup2 hierarchy is mounted and the
agent's own cgroup in it is writable (root, or a delegated subtree); otherwise `JobCgroup.create` returns None and
the runner falls back on process groups, sessions, environment tags and the child subreaper (docs/faults.md).

Standard library only: the shepherd imports this module with site-packages disabled.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

# Move the shell into the cgroup named by $0, then become the worker: no window where the worker (or anything it
# forks) runs outside, and no Python between fork and exec.
_ENTER = 'echo 0 > "$0/cgroup.procs" && exec "$@"'
SHELL = "/bin/sh"


def own_cgroup_dir(mountinfo: str, proc_cgroup: str) -> Path | None:
    """Where this process's cgroup v2 directory is, from /proc/self/mountinfo and /proc/self/cgroup text."""
    own = next((line[3:] for line in proc_cgroup.splitlines() if line.startswith("0::")), None)
    if own is None or own.endswith("(deleted)"):
        return None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or not right.startswith("cgroup2 ") or len(fields) < 5:
            continue
        root, mount = fields[3], fields[4]
        if own == root or own.startswith(root.rstrip("/") + "/"):
            return Path(mount) / own[len(root.rstrip("/")) :].lstrip("/")
    return None


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


class JobCgroup:
    """<own cgroup>/runner-<pid>-<random>/ with one child per worker; killed and removed at the job's end."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, label: str = "") -> JobCgroup | None:
        """Make the job's cgroup, or None where cgroup v2 is missing, read-only, or lacks cgroup.kill."""
        if os.environ.get("RUNNER_CGROUP", "").lower() in ("0", "off", "no", "false"):
            return None
        try:
            base = own_cgroup_dir(_read(Path("/proc/self/mountinfo")), _read(Path("/proc/self/cgroup")))
            if base is None or not (base / "cgroup.procs").exists():
                return None
            path = base / f"runner-{label or os.getpid()}-{os.urandom(3).hex()}"
            path.mkdir()
        except OSError:
            return None
        cg = cls(path)
        if not (path / "cgroup.kill").exists() or not cg.usable():
            cg.remove()
            return None
        return cg

    def usable(self) -> bool:
        """Moving a process in works here (write access to cgroup.procs up to the common ancestor): try once."""
        import subprocess  # here: the guard imports this module and never probes (12 ms of its start-up)

        probe = self.child("probe")
        if probe is None:
            return False
        try:
            done = subprocess.run(
                self.enter(probe, ["true"]), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, timeout=10, check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        finally:
            self.remove_child(probe)
        return done.returncode == 0

    def child(self, name: str) -> Path | None:
        """A worker's own cgroup under the job's (created), or None if it could not be made."""
        path = self.path / name
        try:
            path.mkdir(exist_ok=True)
        except OSError:
            return None
        return path

    @staticmethod
    def enter(path: Path, argv: list[str]) -> list[str]:
        """`argv`, started inside cgroup `path` (a shell moves itself in, then execs argv: same pid)."""
        return [SHELL, "-c", _ENTER, str(path), *argv]

    @staticmethod
    def kill(path: Path) -> bool:
        """SIGKILL every process in `path` and its children cgroups; False if the cgroup is gone."""
        try:
            (path / "cgroup.kill").write_text("1", encoding="utf-8")
        except OSError:
            return False
        return True

    @staticmethod
    def populated(path: Path) -> bool:
        """True while any process is in `path` or below."""
        try:
            return "populated 1" in _read(path / "cgroup.events")
        except OSError:
            return False

    @staticmethod
    def oom_kills(path: Path) -> int:
        """How many processes in `path` or below the OOM killer has killed (memory.events' oom_kill).

        0 without the memory controller, or when the cgroup is gone.
        """
        try:
            text = _read(path / "memory.events")
        except OSError:
            return 0
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    @staticmethod
    def procs(path: Path) -> list[int]:
        """Pids in `path` itself (not its children)."""
        try:
            return [int(p) for p in _read(path / "cgroup.procs").split()]
        except (OSError, ValueError):
            return []

    @staticmethod
    def remove_child(path: Path, wait: float = 1.0) -> bool:
        """Remove an empty cgroup (a populated one stays); True if removed or already gone.

        A process that just exited may keep it busy a moment: retry for up to `wait` s while it is not populated.
        """
        deadline = time.monotonic() + wait
        while True:
            try:
                path.rmdir()
            except FileNotFoundError:
                return True
            except OSError:
                if JobCgroup.populated(path) or time.monotonic() >= deadline:
                    return False
                time.sleep(0.01)
            else:
                return True

    def remove(self, wait: float = 1.0) -> bool:
        """Remove the (empty) children and the job's cgroup; True if everything was removed.

        Retries up to `wait` s in all (a zombie not yet reaped by init keeps a cgroup busy); what is populated stays.
        """
        deadline = time.monotonic() + wait
        with contextlib.suppress(OSError):
            for child in self.path.iterdir():
                if child.is_dir():
                    self.remove_child(child, max(0.0, deadline - time.monotonic()))
        return self.remove_child(self.path, max(0.0, deadline - time.monotonic()))
