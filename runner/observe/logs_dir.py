"""Where this run's logs go: logs.dir, or the temp dir when logs.dir cannot take a run dir right now (a full disk).

A full logs disk is a state of the machine, not of the job: the workers may not need that disk at all, and
torchrun would run (its logs live in a temp dir). So the job runs. Before the agent starts, `choose` makes a
folder with one byte in it where the run dir will go (and removes both):

- logs.dir takes it: nothing changes;
- else `<temp dir>/runner-logs` takes it: this run's logs go there (a warning now, a line in the summary);
- else the first of the two where a folder can at least be made (a disk out of space, not of inodes): the run dir
  goes there and every write into it fails soft (runner/system/soft_io.py); report.json then takes its fallback;
- else nowhere can hold a run dir at all: SpecError (exit 2) before anything starts, naming both places.

A logs.dir this user may not write at all is a mistake in the spec, refused earlier by runner/config/preflight.py
(exit 2); a health check with `min_free` refuses a logs disk short of space when the spec asks for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import structlog

from runner.config.spec import JobSpec
from runner.errors import SpecError, SpecProblem
from runner.system.soft_io import describe, note

FALLBACK = "runner-logs"  # under the temp dir (torchrun's default place for its logs)
KIND = "logs_dir_unwritable"


@dataclass(frozen=True)
class Probe:
    """What a place did with a probe: the folder could be made (`made`), a byte written in it (`error` empty)."""

    made: bool
    error: str = ""

    @property
    def ok(self) -> bool:
        """Both: the place takes a run dir and its files."""
        return self.made and not self.error


def probe(base: Path) -> Probe:
    """Make `<base>/.probe-<random>/` with one byte in a file, then remove both (the parents made stay)."""
    folder = base / f".probe-{os.getpid()}-{os.urandom(3).hex()}"
    try:
        folder.mkdir(mode=0o700, parents=True)
    except OSError as e:
        return Probe(made=False, error=describe(e))
    path = folder / "probe"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, b"\n")  # one byte needs a block: a full disk refuses it
        finally:
            os.close(fd)
    except OSError as e:
        return Probe(made=True, error=describe(e))
    finally:
        for remove in (path.unlink, folder.rmdir):
            with contextlib.suppress(OSError):
                remove()
    return Probe(made=True)


def choose(spec: JobSpec, source: str, tempdir: str | None = None) -> JobSpec:
    """`spec`, with logs.dir moved to the temp dir when logs.dir cannot take this run's logs (see the module)."""
    wanted = Path(spec.logs.dir).expanduser().absolute()
    here = probe(wanted / spec.name)
    if here.ok:
        return spec
    try:
        fallback = Path(tempdir or tempfile.gettempdir()).absolute() / FALLBACK
    except OSError as e:  # no usable temp dir: tempfile tried $TMPDIR, /tmp, /var/tmp, /usr/tmp and the cwd
        fallback, there = Path(FALLBACK), Probe(made=False, error=describe(e))
    else:
        there = probe(fallback / spec.name)
    if not here.made and not there.made:
        fix = "free space (or inodes) in logs.dir or the temp dir, or choose another logs.dir"
        message = f"no folder can hold this run's logs: {wanted}: {here.error}; {fallback}: {there.error}"
        raise SpecError(source, [SpecProblem("logs.dir", message, fix)])
    chosen = fallback if there.ok or not here.made else wanted
    log = structlog.get_logger("runner")
    note(KIND, wanted, here.error)
    if chosen == wanted:
        log.warning(KIND, path=str(wanted), error=here.error,
                    detail="the temp dir cannot take the logs either: the job runs, its files may be lost")
        return spec
    log.warning(KIND, path=str(wanted), error=here.error, logs=str(fallback),
                detail=f"this run's logs go to {fallback}")
    return dataclasses.replace(spec, logs=dataclasses.replace(spec.logs, dir=str(fallback)))
