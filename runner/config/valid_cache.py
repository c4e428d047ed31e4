"""Optionally remember documents that passed schema validation, so jsonschema (~100 ms to import) can be skipped.

Off unless RUNNER_CACHE_DIR names a folder: validating a spec writes nothing anywhere by default. When on,
a pass is an empty marker file named sha256(runner version, schema, data) in that folder.

The data is hashed in a typed, length-prefixed encoding: the integer 1, the number 1.0, the string "1" and
true are four different documents, a string can never pass for a list, and a value of any other type (which
a spec cannot hold) is never cached. The folder must be the user's own and writable by no one else, and
markers are only trusted as regular files owned by the user; anything else (or any I/O error) means no
cache, never an error.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from runner import __version__

ENV = "RUNNER_CACHE_DIR"


def folder() -> Path | None:
    """Where markers live, or None when caching is off."""
    where = os.environ.get(ENV, "")
    return Path(where) if where else None


def key(schema_text: str, data: Any) -> str | None:
    """The hash naming (runner version, schema, data); None for data that is not plain spec data."""
    parts: list[str] = []
    if not _encode(data, parts):
        return None
    digest = hashlib.sha256()
    for part in (__version__, schema_text):
        digest.update(f"{len(part)}:{part};".encode("utf-8", "surrogatepass"))
    for part in parts:
        digest.update(part.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def _encode(value: Any, out: list[str]) -> bool:
    """Append a typed encoding of `value` to `out`; False for a type a spec cannot hold."""
    if isinstance(value, list):
        out.append(f"l{len(value)}[")
        return all(_encode(item, out) for item in value)
    if isinstance(value, dict):
        out.append(f"d{len(value)}{{")
        for name, item in value.items():
            if not isinstance(name, str) or not _encode(name, out) or not _encode(item, out):
                return False
        return True
    token = _scalar(value)
    if token is None:
        return False
    out.append(token)
    return True


def _scalar(value: Any) -> str | None:
    """The token of one scalar; None for a type a spec cannot hold."""
    if isinstance(value, str):
        return f"s{len(value)}:{value}"
    if isinstance(value, bool):  # before int: True is an int too
        return "T" if value else "F"
    if isinstance(value, int):
        return f"i{value:x};"  # hex: no int->str digit limit
    if isinstance(value, float):
        return f"f{value.hex()};"
    return "n" if value is None else None


def seen(k: str | None) -> bool:
    """True if this (schema, data) passed before (and the cache folder and marker can be trusted)."""
    where = _trusted_folder()
    if k is None or where is None:
        return False
    try:
        info = os.stat(where / k, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()


def remember(k: str | None) -> None:
    """Record a pass; best effort."""
    where = folder()
    if k is None or where is None:
        return
    try:
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        if _trusted_folder() is None:
            return
        fd = os.open(where / k, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.close(fd)
    except OSError:
        pass


def _trusted_folder() -> Path | None:
    """The folder, if it is a real directory owned by this user that nobody else can write to."""
    where = folder()
    if where is None:
        return None
    try:
        info = os.stat(where, follow_symlinks=False)
    except OSError:
        return None
    private = not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    return where if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and private else None
