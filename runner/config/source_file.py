"""Read a spec file safely: only a regular file, at most MAX_FILE_BYTES, strict UTF-8.

The file is opened with O_NONBLOCK and checked with fstat before a byte is read, so a FIFO, a device such as
/dev/zero or a directory is a clear error instead of a hang or an endless read. A UTF-8 byte order mark at the
start is allowed (YAML allows it); UTF-16/32 text and invalid UTF-8 are refused with the line and column of
the first bad byte.
"""

from __future__ import annotations

import codecs
import os
import stat

from runner.config.limits import MAX_FILE_BYTES
from runner.errors import SpecError, SpecProblem

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
_WIDE_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


def read_spec_file(path: str | os.PathLike[str]) -> str:
    """The file's text; SpecError (never another exception) when it cannot be read as a spec."""
    source = os.fspath(path)
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise _error(source, "file not found", "check the path") from None
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise _error(source, f"cannot open: {reason}", "check the path") from None
    try:
        return decode(source, _read(source, fd))
    finally:
        os.close(fd)


def _read(source: str, fd: int) -> bytes:
    info = os.fstat(fd)
    for is_kind, noun in _KINDS:
        if is_kind(info.st_mode):
            raise _error(source, f"is {noun}, not a regular file", "give the path of a YAML file")
    if not stat.S_ISREG(info.st_mode):
        raise _error(source, "is not a regular file", "give the path of a YAML file")
    if info.st_size > MAX_FILE_BYTES:
        raise _too_big(source)
    chunks, size = [], 0
    try:
        while size <= MAX_FILE_BYTES:
            chunk = os.read(fd, MAX_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as err:
        raise _error(source, f"cannot read: {err.strerror}", "check the file") from None
    if size > MAX_FILE_BYTES:  # it grew while we read it
        raise _too_big(source)
    return b"".join(chunks)


def decode(source: str, data: bytes) -> str:
    """Strict UTF-8 (a leading UTF-8 BOM dropped); SpecError at the first byte that is not."""
    for bom, name in _WIDE_BOMS:
        if data.startswith(bom):
            raise _error(source, f"the file is {name} text", "save it as UTF-8", 1, 1)
    data = data.removeprefix(codecs.BOM_UTF8)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = len(data[data.rfind(b"\n", 0, err.start) + 1 : err.start].decode("utf-8", "replace")) + 1
        message = f"not UTF-8 text: byte 0x{data[err.start]:02x} ({err.reason})"
        raise _error(source, message, "save the file as UTF-8", line, column) from None


def _too_big(source: str) -> SpecError:
    return _error(source, f"the file is larger than {MAX_FILE_BYTES // 1024} KiB", "a job spec is a few KB: "
                  "keep data in files the job reads, not in the spec")


def _error(source: str, message: str, fix: str, line: int | None = None, column: int | None = None) -> SpecError:
    return SpecError(source, [SpecProblem("", message, fix, line, column)])
