"""The types of JSON as it arrives from outside: etcd values, status.json, report.json, YAML spec data, schemas.

Such data is typed here, at the boundary, and narrowed with isinstance where it is read (or parsed once into a
frozen record). A leaf module: it imports nothing from runner.
"""

from __future__ import annotations

from typing import TypeAlias

JSON: TypeAlias = dict[str, "JSON"] | list["JSON"] | str | int | float | bool | None
"""A JSON value of whatever kind (what json.loads and yaml.safe_load of a plain document return)."""

JSONObject: TypeAlias = dict[str, JSON]
"""A JSON object."""
