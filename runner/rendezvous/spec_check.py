"""Do two nodes run the same job? A digest of the spec minus node-local fields, and a field-level diff."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from runner.config.spec import JobSpec

# Fields that legitimately differ between nodes of one job (paths and addresses local to a node).
NODE_LOCAL_FIELDS: tuple[str, ...] = (
    "cwd",
    "logs.dir",
    "rendezvous.master_addr",
    "rendezvous.tls",
    "rendezvous.auth.password_file",
)


def shared_tree(spec: JobSpec) -> dict[str, Any]:
    """spec.to_dict() without the node-local fields."""
    tree = spec.to_dict()
    for dotted in NODE_LOCAL_FIELDS:
        *parents, leaf = dotted.split(".")
        node: Any = tree
        for part in parents:
            node = node.get(part, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(leaf, None)
    return tree


def tree_digest(tree: dict[str, Any]) -> str:
    """Stable short hash of a spec tree."""
    blob = json.dumps(tree, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def shared_digest(spec: JobSpec) -> str:
    """Digest every node of a job must agree on."""
    return tree_digest(shared_tree(spec))


def diff_paths(ours: Any, theirs: Any, path: str = "") -> list[str]:
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
