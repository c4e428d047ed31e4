"""Process titles: what `ps`, `top` and /proc/<pid>/cmdline show of the runner's processes.

`runner: agent job train`, and for warm workers and the fork server (runner/workers/standby_main.py, which sets its
own with the same library: it imports nothing of runner's) `runner: fork server of job train`, `runner: standby of
job train`, `runner: worker rank 3 of job train (attempt 2)`. Set with setproctitle, told not to touch the initial
environment (SPT_NOENV): the guard and the agent find a job's processes by the tag in /proc/<pid>/environ, which
must stay as it is. A title is then at most as long as the command line the process started with (cut beyond it),
and no process's argv carries padding to make room for one.

The process's short name (comm: /proc/<pid>/comm, the second field of /proc/<pid>/stat, what `top` and `ps -o comm`
show) stays what exec gave it (`runner`, `python3`), as under torchrun: setproctitle would set it to the title's
first 15 characters, spaces included, and tools that split /proc/<pid>/stat at whitespace then lose the process and
every process below it. Slurm's proctrack/linuxproc is one: it never signalled an agent called `runner: agent j`,
so scancel, the time-limit signal and a node failure left the step's agents and workers running.
"""

from __future__ import annotations

import contextlib
import os

NOENV = "SPT_NOENV"  # setproctitle's switch: leave /proc/<pid>/environ alone
COMM = "/proc/thread-self/comm"  # the calling thread's short name (the process's, from the main thread)


def set_title(title: str) -> None:
    """Show `title` for this process, its short name (comm) left as is (best effort: nothing without setproctitle)."""
    had = os.environ.get(NOENV)
    os.environ[NOENV] = "1"  # read when setproctitle first sets a title
    try:
        with contextlib.suppress(ImportError, OSError):
            import setproctitle

            with open(COMM, encoding="utf-8", errors="replace") as f:
                comm = f.read().rstrip("\n")
            setproctitle.setproctitle(title)
            setproctitle.setthreadtitle(comm)  # setproctitle set comm to the title's start, spaces included
    finally:
        if had is None:  # never passed on to the workers' environment
            os.environ.pop(NOENV, None)
