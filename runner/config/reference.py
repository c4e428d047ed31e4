"""Render the spec reference table (docs/spec.md "Every field") from the job schema, so docs can't drift."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCHEMA = Path(__file__).resolve().parents[1] / "job.schema.json"  # schemas/job.schema.json links to it


def rows(node: dict[str, Any], path: str = "") -> list[str]:
    """One markdown row per field, depth first, in schema order."""
    out = []
    for key, prop in node.get("properties", {}).items():
        dotted = f"{path}.{key}" if path else key
        alts = [prop, *prop.get("oneOf", []), *prop.get("anyOf", [])]
        nested = [a for a in alts if "properties" in a]
        default = prop.get("default")
        if key in node.get("required", []) and "default" not in prop:
            shown = "required"
        elif nested and isinstance(default, dict):
            shown = ""
        else:
            shown = f"`{json.dumps(default)}`"
        out.append(f"| `{dotted}` | {shown} | {prop.get('description', '')} |")
        for alt in nested:
            out += rows(alt, dotted)
    return out


def markdown(schema_path: Path = SCHEMA) -> str:
    """The whole table."""
    schema = json.loads(schema_path.read_text(encoding="utf-8"))
    return "\n".join(["| field | default | meaning |", "|---|---|---|", *rows(schema)]) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
