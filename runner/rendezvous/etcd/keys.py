"""The etcd key layout of one job, node-id encoding and the "job closed" check; pure, no I/O.

Node ids are percent-encoded (UTF-8, every byte but [A-Za-z0-9_.~-]) where they become a key's last part,
so any id works, `/` included; `node_of` decodes them when keys are read back (status, ranks).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote_from_bytes, unquote_to_bytes

from runner.errors import JobClosed, RendezvousError
from runner.json_types import JSON
from runner.rendezvous.node_ledger import MAX_NODES, NodeRecord, record_of

if TYPE_CHECKING:
    from runner.rendezvous.etcd.client import KeyValue

MAX_RECORD_BYTES = 64 << 10  # a node ledger record larger than this is damaged
MAX_STATE_BYTES = 256 << 10  # a node's published state larger than this is damaged (its workers' list included)

# Longest node id accepted (UTF-8 bytes): ids become etcd keys and appear in every round's result.
MAX_NODE_ID_BYTES = 512


def encode_node(node: str) -> str:
    """`node` as one key component: percent-encoded, never containing '/'.

    Lone surrogates (undecodable bytes of argv or a hostname) round-trip too (UTF-8 with surrogatepass).
    """
    return quote_from_bytes(node.encode("utf-8", "surrogatepass"), safe="")


def decode_node(part: str) -> str:
    """Inverse of encode_node."""
    return unquote_to_bytes(part).decode("utf-8", "surrogatepass")


def check_node_id(node: str) -> None:
    """Refuse a node id that cannot work as a key (empty, or too long); anything else is encoded."""
    size = len(node.encode("utf-8", "surrogatepass"))
    if size == 0:
        msg = "the node id is empty"
        raise RendezvousError(msg, fix="give each node a non-empty id with --node (or RUNNER_NODE)")
    if size > MAX_NODE_ID_BYTES:
        msg = f"the node id is {size} bytes long (at most {MAX_NODE_ID_BYTES})"
        raise RendezvousError(msg, fix="give this node a shorter id with --node (or RUNNER_NODE)")


@dataclass(frozen=True)
class JobKeys:
    """Key builders for `{prefix}/{job}/...`; every key is bytes.

    One concern over 20 methods: the job's key layout, one method per key (docs/rendezvous.md's table), so that no
    other module spells a key.
    """

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
        """The shared spec tree (secret-looking env values as digests), to name differing fields."""
        return self._k("spec_json")

    @property
    def epoch(self) -> bytes:
        """A random token written with the spec by the job's first node: gone or changed = etcd lost the job."""
        return self._k("epoch")

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

    @property
    def rounds(self) -> bytes:
        """Prefix of every round's keys (join records, tickets, results)."""
        return self._k("rounds", "")

    def round_nodes(self, round_: int) -> bytes:
        """Prefix of the join records of round `round_`."""
        return self._k("rounds", round_, "nodes", "")

    def join(self, round_: int, node: str) -> bytes:
        """Join record of `node` in round `round_`."""
        return self._k("rounds", round_, "nodes", encode_node(node))

    def result(self, round_: int) -> bytes:
        """Result of round `round_`, written once (and copied into the news: `closed`)."""
        return self._k("rounds", round_, "result")

    def ticket(self, round_: int) -> bytes:
        """Put by every join of round `round_` (outside news: nobody watches it); version 1 read back = first."""
        return self._k("rounds", round_, "ticket")

    def news(self) -> tuple[bytes, bytes]:
        """Watch range of the control key and the rounds' annex keys under it (key, range_end).

        What every node must hear about while it waits for a round or runs in one, and nothing else: one watcher
        carries it, with O(1) events per round (leader, result copy, lost, next) besides stop requests.
        """
        key = self.control
        return key, key[:-1] + bytes([key[-1] + 1])  # every key starting with the control key

    def _annex(self, round_: int, name: str) -> bytes:
        return self._k("control", "rounds", round_, name)

    def leader(self, round_: int) -> bytes:
        """Which node leads round `round_` (writes its result), on that node's lease: gone when the leader is."""
        return self._annex(round_, "leader")

    def closed(self, round_: int) -> bytes:
        """Copy of round `round_`'s result, written with it: what a waiting node receives on its news watch."""
        return self._annex(round_, "result")

    def lost(self, round_: int) -> bytes:
        """First member of round `round_` found lost (its ring neighbour writes it once): every member reads it."""
        return self._annex(round_, "lost")

    def ledger(self, node: str) -> bytes:
        """`node`'s record in the node ledger (no lease: it outlives runs; runner/rendezvous/node_ledger.py)."""
        return self._k("ledger", encode_node(node))

    @property
    def ledgers(self) -> bytes:
        """Prefix of the node ledger's records."""
        return self._k("ledger", "")

    def hang(self, round_: int) -> bytes:
        """A node found a hang in round `round_`: every member reads its flight recorders, answers (docs/hangs.md)."""
        return self._annex(round_, "hang")

    def hang_answer(self, round_: int, node: str) -> bytes:
        """`node`'s flight-recorder records for round `round_`'s hang (outside news: read by whoever analyses)."""
        return self._k("rounds", round_, "hang", encode_node(node))

    def hang_answers(self, round_: int) -> bytes:
        """Prefix of round `round_`'s hang answers."""
        return self._k("rounds", round_, "hang", "")

    def opened(self, round_: int) -> bytes:
        """Which node opened round `round_ + 1` (bumped the round key): a newcomer means a membership change."""
        return self._annex(round_, "next")

    @property
    def states(self) -> bytes:
        """Prefix of the live node states."""
        return self._k("nodes", "")

    def state(self, node: str) -> bytes:
        """Live state of `node` (on its lease)."""
        return self._k("nodes", encode_node(node))

    @property
    def finals(self) -> bytes:
        """Prefix of the final node states kept after the end."""
        return self._k("final", "")

    def final(self, node: str) -> bytes:
        """Final state of `node` (on a long lease of its own)."""
        return self._k("final", encode_node(node))

    def group(self, k: int) -> JobKeys:
        """The keys of replica group `k` (its own rounds, states and control), under this job's root."""
        return JobKeys(self._k("groups").decode(), str(k))

    @property
    def seats(self) -> bytes:
        """Prefix of the replica groups' seats: which node runs which group (each on its node's lease)."""
        return self._k("seats", "")

    def seat(self, k: int, i: int) -> bytes:
        """Seat `i` of replica group `k`."""
        return self._k("seats", k, i)

    @property
    def member_claim(self) -> bytes:
        """Who is joining the hosted etcd as a member now (on that node's lease: one at a time)."""
        return self._k("members", "claim")

    @property
    def lighthouse(self) -> bytes:
        """The hosted lighthouse's address (on its host node's lease)."""
        return self._k("lighthouse")

    @staticmethod
    def leaf(key: bytes) -> str:
        """Last path component of a key, decoded (the node id of a join, state or final key)."""
        return decode_node(key.decode().rsplit("/", 1)[-1])

    def check_open(self, raw_control: bytes | None) -> None:
        """Raise JobClosed when the control key's value says the job is stopped or ended (the one such check)."""
        control = load(raw_control)
        if control:
            state = str(control.get("state", "closed")) if isinstance(control, dict) else "closed"
            by, why = (control.get("by"), control.get("why")) if isinstance(control, dict) else (None, None)
            stopped_by = f"stopped by node {by}: {why}"[:300] if by and isinstance(why, str) and why else ""
            raise JobClosed(self.job, state, stopped_by)


def ledger_of(kvs: list[KeyValue]) -> dict[str, NodeRecord]:
    """The node ledger's records read from etcd (a damaged or oversized one left out), by node."""
    out: dict[str, NodeRecord] = {}
    for kv in kvs[:MAX_NODES]:
        rec = record_of(load(kv.value)) if len(kv.value) <= MAX_RECORD_BYTES else None
        if rec is not None:
            out[rec.node] = rec
    return out


def progress_of(kvs: list[KeyValue]) -> dict[str, float]:
    """Each node's published `progress_at` (the states' records; a damaged, oversized or unset one left out)."""
    out: dict[str, float] = {}
    for kv in kvs[:MAX_NODES]:
        value = load(kv.value) if len(kv.value) <= MAX_STATE_BYTES else None
        if not isinstance(value, dict):
            continue
        node, at = value.get("node"), value.get("progress_at")
        if isinstance(node, str) and isinstance(at, (int, float)) and not isinstance(at, bool) and math.isfinite(at):
            out[node] = float(at)
    return out


def dump(value: object) -> bytes:
    """JSON-encode a value for etcd."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def load(raw: bytes | None) -> JSON:
    """Decode a JSON value (None stays None; garbage becomes None)."""
    if not raw:
        return None
    try:
        value: JSON = json.loads(raw)
    except ValueError:
        return None
    return value
