"""Hide secret-looking environment values when a spec or plan is shown."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runner.config.spec import JobSpec

# A key is secret when its upper-cased name CONTAINS one of these words. Deliberately broad: a false
# positive (KEYBOARD_LAYOUT, AUTHOR) only hides a harmless value; a false negative would leak a secret.
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "KEY", "CREDENTIAL", "AUTH", "PRIVATE")
MASK = "***"


def is_secret(key: str) -> bool:
    """True when `key` names something that looks secret (see SECRET_WORDS)."""
    upper = key.upper()
    return any(word in upper for word in SECRET_WORDS)


def redact(key: str, value: str) -> str:
    """`value`, or "***" when `key` looks secret (HF_TOKEN, AWS_SECRET_ACCESS_KEY, DB_PASSWORD, ...)."""
    return MASK if is_secret(key) else value


def spec_for_disk(spec: JobSpec) -> dict[str, Any]:
    """The resolved spec as written to <run dir>/spec.json: secret-looking env values masked."""
    resolved = spec.to_dict()
    resolved["env"] = {k: redact(k, v) for k, v in resolved.get("env", {}).items()}
    return resolved
