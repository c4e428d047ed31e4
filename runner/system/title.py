"""Process titles: what `ps`, `top` and /proc/<pid>/cmdline show of the runner's processes.

`runner: agent job train`, and for warm workers and the fork server (runner/workers/standby_main.py, which sets its
own with the same library: it imports nothing of runner's) `runner: fork server of job train`, `runner: standby of
job train`, `runner: worker rank 3 of job train (attempt 2)`. Set with setproctitle, told not to touch the initial
environment (SPT_NOENV): the guard and the agent find a job's processes by the tag in /proc/<pid>/environ, which
must stay as it is. A title is then at most as long as the command line the process started with (cut beyond it),
and no process's argv carries padding to make room for one.
"""

from __future__ import annotations

import contextlib
import os

NOENV = "SPT_NOENV"  # setproctitle's switch: leave /proc/<pid>/environ alone


def set_title(title: str) -> None:
    """Show `title` for this process (best effort: nothing when setproctitle cannot be imported or set it)."""
    had = os.environ.get(NOENV)
    os.environ[NOENV] = "1"  # read when setproctitle first sets a title
    try:
        with contextlib.suppress(ImportError, OSError):
            import setproctitle

            setproctitle.setproctitle(title)
    finally:
        if had is None:  # never passed on to the workers' environment
            os.environ.pop(NOENV, None)
