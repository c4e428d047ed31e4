"""Remember documents that passed schema validation, keyed by sha256(runner version, schema, data).

A hit proves the same data passed the same schema before, so validating again would change nothing. Only
successes are stored (an empty marker file); any I/O problem just means no cache. RUNNER_NO_CACHE=1 turns it
off; the folder is $XDG_CACHE_HOME/runner/valid (default ~/.cache/runner/valid).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from runner import __version__


def folder() -> Path | None:
    """Where markers live, or None when caching is off."""
    if os.environ.get("RUNNER_NO_CACHE"):
        return None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "runner" / "valid"


def key(schema_text: str, data: Any) -> str:
    """The hash naming (schema, data)."""
    blob = json.dumps(data, sort_keys=True, default=repr, separators=(",", ":"))
    return hashlib.sha256(f"{__version__}\\0{schema_text}\\0{blob}".encode()).hexdigest()


def seen(k: str) -> bool:
    """True if this (schema, data) passed before."""
    where = folder()
    return where is not None and (where / k).is_file()


def remember(k: str) -> None:
    """Record a pass; best effort."""
    where = folder()
    if where is None:
        return
    try:
        where.mkdir(parents=True, exist_ok=True)
        (where / k).touch()
    except OSError:
        pass
