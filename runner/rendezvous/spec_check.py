"""Do two nodes run the same job? A digest of the spec minus node-local fields, and a field-level diff.

The shared tree is what the etcd backend stores (key `spec_json`) to name differing fields, so it never holds a
secret in clear: every env value that is or holds a secret, by its name or its content
(runner.config.redact.has_secret), is replaced by a salted, slow digest of it. Two nodes with the same value get
the same digest (the mismatch check still works); someone reading etcd learns neither the value nor, cheaply, a
guess of it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from runner.config.redact import has_secret, redact_argv, redact_value
from runner.config.spec import JobSpec

# Fields that legitimately differ between nodes of one job (paths and addresses local to a node).
NODE_LOCAL_FIELDS: tuple[str, ...] = (
    "cwd",
    "logs.dir",
    "rendezvous.master_addr",
    # how a node reaches etcd: one cluster's members listed differently (a cluster template's member hosts added,
    # runner.rendezvous.etcd.hosted) are one job; nodes of different etcds never meet anyway
    "rendezvous.endpoints",
    "rendezvous.tls",
    "rendezvous.auth.password_file",
    "rendezvous.secret_file",  # a path of this node's (the secret itself is never in a spec)
    "health.paths",  # resolved against cwd
)


# PBKDF2 rounds for a secret's digest: ~25 ms per secret on one core, so guessing a secret from etcd is slow.
SECRET_DIGEST_ROUNDS = 100_000
SECRET_DIGEST_PREFIX = "pbkdf2-sha256:"  # noqa: S105 - a label, not a password


def secret_digest(job: str, name: str, value: str) -> str:
    """A stable, salted (job and variable name), slow digest of a secret value: what etcd may see of it."""
    salt = f"runner-spec-secret:{job}:{name}".encode()
    digest = hashlib.pbkdf2_hmac("sha256", value.encode("utf-8", "surrogatepass"), salt, SECRET_DIGEST_ROUNDS)
    return SECRET_DIGEST_PREFIX + digest.hex()[:32]


def shared_tree(spec: JobSpec) -> dict[str, Any]:
    """spec.to_dict() without the node-local fields; secret-looking env values replaced by their digests."""
    tree = spec.to_dict()
    env = tree.get("env")
    if isinstance(env, dict):
        tree["env"] = {k: secret_digest(spec.name, k, str(v)) if has_secret(k, str(v)) else v
                       for k, v in env.items()}
    entrypoint = tree.get("entrypoint")
    if isinstance(entrypoint, dict) and isinstance(entrypoint.get("args"), list):
        entrypoint["args"] = digest_secret_items(spec.name, "entrypoint.args", entrypoint["args"], argv=True)
    rendezvous = tree.get("rendezvous")
    if isinstance(rendezvous, dict) and isinstance(rendezvous.get("endpoints"), list):
        rendezvous["endpoints"] = digest_secret_items(spec.name, "rendezvous.endpoints", rendezvous["endpoints"])
    health = tree.get("health")
    if isinstance(health, dict) and isinstance(health.get("commands"), list):  # a command line may hold a token
        lines = digest_secret_items(spec.name, "health.commands", [c.get("run") for c in health["commands"]])
        health["commands"] = [{**c, "run": line} for c, line in zip(health["commands"], lines, strict=True)]
    for dotted in NODE_LOCAL_FIELDS:
        *parents, leaf = dotted.split(".")
        node: object = tree
        for part in parents:
            node = node.get(part, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(leaf, None)
    return tree


def digest_secret_items(job: str, field: str, items: list[object], *, argv: bool = False) -> list[object]:
    """`items` with every element redaction would mask (`--token X`'s X, a URL password) replaced by its digest."""
    texts = [str(v) for v in items]
    shown = redact_argv(texts) if argv else [redact_value(v) for v in texts]
    return [
        secret_digest(job, f"{field}[{i}]", text) if seen != text else original
        for i, (original, text, seen) in enumerate(zip(items, texts, shown, strict=True))
    ]


def tree_digest(tree: Mapping[str, object]) -> str:
    """Stable short hash of a spec tree."""
    blob = json.dumps(tree, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def shared_digest(spec: JobSpec) -> str:
    """Digest every node of a job must agree on."""
    return tree_digest(shared_tree(spec))


def diff_paths(ours: object, theirs: object, path: str = "") -> list[str]:
    """Dotted paths where two JSON trees differ, sorted."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        found: list[str] = []
        for key in sorted(set(ours) | set(theirs)):
            sub = f"{path}.{key}" if path else str(key)
            if key not in ours or key not in theirs:
                found.append(sub)
            else:
                found.extend(diff_paths(ours[key], theirs[key], sub))
        return found
    return [] if ours == theirs else [path or "(document)"]
