"""The environment of a helper process the agent starts (the guard, py-spy, a hosted etcd): no secret in it."""

from __future__ import annotations

from collections.abc import Mapping

# Inherited variables a helper process keeps (locale and search path only: a helper needs nothing else).
HELPER_ENV_KEEP = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TZ", "TMPDIR")


def helper_env(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` reduced to HELPER_ENV_KEEP.

    Helpers need no credential, so none is passed: not the etcd password, not a token the workers inherit.
    """
    return {k: environ[k] for k in HELPER_ENV_KEEP if k in environ}
