"""The etcd key layout of one job (see DESIGN.md "etcd v3 key layout"); pure, no I/O."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class JobKeys:
    """Key builders for `{prefix}/{job}/...`; every key is bytes."""

    prefix: str
    job: str

    def _k(self, *parts: object) -> bytes:
        return "/".join((self.prefix.rstrip("/"), self.job, *map(str, parts))).encode()

    @property
    def root(self) -> bytes:
        """Prefix of every key of the job (ends with '/')."""
        return self._k("")

    @property
    def spec(self) -> bytes:
        """Digest of the shared spec."""
        return self._k("spec")

    @property
    def spec_json(self) -> bytes:
        """The shared spec tree, to name differing fields."""
        return self._k("spec_json")

    @property
    def round(self) -> bytes:
        """Current round number."""
        return self._k("round")

    @property
    def control(self) -> bytes:
        """Stop / final outcome markers."""
        return self._k("control")

    @property
    def restarts(self) -> bytes:
        """Job-wide restart counter."""
        return self._k("restarts")

    def restart_charge(self, round_: int) -> bytes:
        """Marker: the failure of round `round_` has been charged."""
        return self._k("restarts", round_)

    def round_nodes(self, round_: int) -> bytes:
        """Prefix of the join records of round `round_`."""
        return self._k("rounds", round_, "nodes", "")

    def join(self, round_: int, node: str) -> bytes:
        """Join record of `node` in round `round_`."""
        return self._k("rounds", round_, "nodes", node)

    def result(self, round_: int) -> bytes:
        """Result of round `round_`, written once."""
        return self._k("rounds", round_, "result")

    @property
    def states(self) -> bytes:
        """Prefix of the live node states."""
        return self._k("nodes", "")

    def state(self, node: str) -> bytes:
        """Live state of `node` (on its lease)."""
        return self._k("nodes", node)

    @property
    def finals(self) -> bytes:
        """Prefix of the final node states kept after the end."""
        return self._k("final", "")

    def final(self, node: str) -> bytes:
        """Final state of `node` (on a long lease of its own)."""
        return self._k("final", node)

    @staticmethod
    def leaf(key: bytes) -> str:
        """Last path component of a key (a node id for join/state keys)."""
        return key.decode().rsplit("/", 1)[-1]


def dump(value: Any) -> bytes:
    """JSON-encode a value for etcd."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def load(raw: bytes | None) -> Any:
    """Decode a JSON value (None stays None; garbage becomes None)."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None
