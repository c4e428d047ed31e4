"""A hang's culprit from the ranks' flight-recorder records (docs/hangs.md). Pure: records in, a verdict out.

torch's flight recorder (TORCH_FR_BUFFER_SIZE) keeps, per rank, the last collectives it called: process group,
`collective_seq_id`, op (`profiling_name`, e.g. "gloo:all_reduce"), tensor sizes and whether the call is over
(`retired`, or `state: completed`). Its JSON dump (the worker server's `fr_trace_json`) is parsed here, bounded,
without torch: the agent never imports it. In a hung job the ranks that wait sit in an open call; the culprit is
what makes them wait:

- a rank that never entered that call (it skipped it, or sleeps or computes elsewhere): **never_entered**;
- ranks that entered the same call number with a different op or different sizes: **mismatch** (the odd ones out
  are the culprits; with no majority, every side is named);
- a rank whose process is stopped (SIGSTOP: state T), which can answer nothing: **stopped**;
- a rank that did not answer the query while its peers wait: **silent**;
- after a collective timeout (the rank that waited is gone, its records with it): the ranks that are in no
  collective at all, with their last call: **away**.

Anything else (every rank inside the same call, or no rank waiting in a collective) is **unknown**, and says so.
Point-to-point calls (send/recv) are not matched: only collectives, which every rank of a group must call in order.
"""

from __future__ import annotations

import enum
import json
from collections import defaultdict
from dataclasses import dataclass, replace

MAX_ENTRIES = 20_000  # per rank: more than any sane TORCH_FR_BUFFER_SIZE; the rest of a dump is not read
MAX_NAME = 80  # characters of an op or process-group name kept


class Answer(enum.Enum):
    """How a rank answered the flight-recorder query."""

    ANSWERED = "answered"
    STOPPED = "stopped"  # its process is stopped (SIGSTOP, SIGTSTP): nothing in it can answer
    SILENT = "silent"  # no answer within the bound (blocked, or its recorder's server is not running)
    NO_RECORDER = "no_recorder"  # nothing listens: a cold worker, a script without torch, the recorder off
    EXITED = "exited"  # the process was gone before it was asked
    TIMED_OUT = "timed_out"  # it ended on a collective timeout: it waited in a collective (its records are gone)


class Finding(enum.Enum):
    """What the records show."""

    NEVER_ENTERED = "never_entered"
    AWAY = "away"  # in no collective at all while a peer gave up waiting in one (a collective timeout)
    MISMATCH = "mismatch"
    STOPPED = "stopped"
    SILENT = "silent"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Call:
    """One collective as one rank's flight recorder saw it."""

    group: str  # the process group's id
    seq: int  # collective_seq_id: the n-th collective of that group on that rank
    op: str  # "all_reduce" (the backend's prefix removed)
    sizes: tuple[tuple[int, ...], ...]  # input tensor sizes
    done: bool  # the call is over on this rank
    created_ns: int  # when the rank entered it (epoch nanoseconds, the rank's clock)

    @property
    def signature(self) -> tuple[str, tuple[tuple[int, ...], ...]]:
        """What every rank of the group must agree on for this call number."""
        return self.op, self.sizes

    def describe(self) -> str:
        """`all_reduce [[10]]`."""
        return f"{self.op} {[list(s) for s in self.sizes]}"


@dataclass(frozen=True)
class RankRecord:
    """One rank's answer: how it answered, and its collectives (oldest first)."""

    rank: int
    node: str
    answer: Answer
    calls: tuple[Call, ...] = ()
    detail: str = ""  # why there are no calls (the query's error), for the report


@dataclass(frozen=True)
class Verdict:
    """The culprit of a hang, as far as the records tell."""

    finding: Finding
    culprits: tuple[tuple[int, str], ...]  # (rank, node), lowest rank first
    waiting: tuple[tuple[int, str], ...] = ()  # ranks waiting in the call the culprits hold up
    group: str = ""
    seq: int | None = None
    op: str = ""  # the call the waiting ranks are in (`all_reduce [[10]]`)
    waited_s: float | None = None  # how long the longest waiter has waited, at the analysis
    odd: str = ""  # mismatch: what the culprits called instead, `all_gather [[10]] (rank 2)`
    ranks: int = 0  # ranks whose records were read
    missing: tuple[int, ...] = ()  # ranks that could not be read (stopped, silent, gone, no recorder)

    @property
    def named(self) -> bool:
        """Whether the records name a culprit."""
        return bool(self.culprits)

    def reason(self) -> str:  # noqa: PLR0911 - one line per finding
        """The root cause's one line."""
        who = ranks_on_nodes(self.culprits)
        where = f"{self.op.split(' ')[0]} #{self.seq} (process group {self.group})" if self.seq is not None else ""
        waited = waited_line(self.waiting, self.waited_s, where)
        if self.finding is Finding.NEVER_ENTERED:
            return f"hang: {who} never entered {where}; {waited_line(self.waiting, self.waited_s, 'it')}"
        if self.finding is Finding.MISMATCH:
            head = f"hang: mismatched collective #{self.seq} (process group {self.group}): "
            if self.waiting:
                return f"{head}{who} called {self.odd} while {ranks_on_nodes(self.waiting)} called {self.op}"
            return f"{head}{who} disagree: {self.odd}"
        if self.finding is Finding.AWAY:
            gave_up = ranks_on_nodes(self.waiting)
            return f"hang: {who} was in no collective (last call: {self.odd}) while {gave_up} timed out waiting in one"
        if self.finding is Finding.STOPPED:
            return f"hang: {who} is stopped (SIGSTOP or SIGTSTP: process state T)" + (f"; {waited}" if where else "")
        if self.finding is Finding.SILENT:
            return f"hang: {who} did not answer the flight-recorder query" + (f"; {waited}" if where else "")
        if where:
            return f"hang: every rank read is inside {where}: the collective itself is stuck (transport, network)"
        return "hang: no rank was waiting in a collective: the hang is outside collectives (see the stacks)"

    def to_dict(self) -> dict[str, object]:
        """The JSON boundary (report.json's `hang`)."""
        return {
            "finding": self.finding.value,
            "culprits": [{"rank": r, "node": n} for r, n in self.culprits],
            "waiting": [{"rank": r, "node": n} for r, n in self.waiting],
            "process_group": self.group,
            "collective_seq": self.seq,
            "collective": self.op,
            "odd_call": self.odd,
            "waited_s": None if self.waited_s is None else round(self.waited_s, 3),
            "ranks_read": self.ranks,
            "ranks_unread": list(self.missing),
            "reason": self.reason(),
        }


@dataclass(frozen=True)
class Culprit:
    """What the records showed, the culprits' stacks (this node's, by rank) and how long the analysis took."""

    verdict: Verdict
    stacks: dict[int, str]
    took_s: float

    def stacks_text(self) -> list[str]:
        """Each culprit's stacks under its rank, lowest rank first (the failure's stacks)."""
        return [f"rank {r} (culprit):\n{text.rstrip()}" for r, text in sorted(self.stacks.items())]


def rank_list(ranks: list[int]) -> str:
    """`0-2, 5`."""
    out: list[str] = []
    for r in sorted(set(ranks)):
        if out and out[-1].split("-")[-1] == str(r - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{r}"
        else:
            out.append(str(r))
    return ", ".join(out)


def ranks_on_nodes(ranks: tuple[tuple[int, str], ...]) -> str:
    """`rank 1 (node a)`, `ranks 0-1 (node a), 2 (node b)`."""
    by_node: dict[str, list[int]] = defaultdict(list)
    for r, n in ranks:
        by_node[n].append(r)
    parts = [f"{rank_list(rs)} (node {n})" for n, rs in sorted(by_node.items(), key=lambda kv: min(kv[1]))]
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts) if parts else "no rank"


def waited_line(waiting: tuple[tuple[int, str], ...], waited_s: float | None, where: str) -> str:
    """`ranks 0, 2 waited 5.1 s in all_reduce #4 (process group 0)`."""
    if not waiting:
        return f"no rank read was inside {where}" if where else ""
    who = ("rank " if len(waiting) == 1 else "ranks ") + rank_list([r for r, _ in waiting])
    return f"{who} waited {waited_s:.1f} s in {where}" if waited_s is not None else f"{who} waited in {where}"


# -- parsing a dump (bounded; anything malformed is left out, never raised) -----------------------------------

def parse_dump(raw: bytes | str) -> tuple[Call, ...]:
    """The collectives of one `fr_trace_json` dump; () for anything that is not one."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return ()
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return ()
    calls = (call_of(e) for e in entries[-MAX_ENTRIES:] if isinstance(e, dict))
    return tuple(c for c in calls if c is not None)


def call_of(entry: dict[str, object]) -> Call | None:
    """One entry as a Call; None for a point-to-point call or a malformed entry."""
    seq, pg, name = entry.get("collective_seq_id"), entry.get("pg_id"), entry.get("profiling_name")
    if entry.get("is_p2p") is True or not isinstance(seq, int) or isinstance(seq, bool) or not isinstance(name, str):
        return None
    if not isinstance(pg, (int, str)) or isinstance(pg, bool):
        return None
    created = entry.get("time_created_ns")
    done = entry.get("retired") is True or entry.get("state") == "completed"
    return Call(
        group=str(pg)[:MAX_NAME], seq=seq, op=name.rsplit(":", 1)[-1][:MAX_NAME],
        sizes=sizes_of(entry.get("input_sizes")), done=done,
        created_ns=created if isinstance(created, int) and not isinstance(created, bool) else 0,
    )


def sizes_of(value: object) -> tuple[tuple[int, ...], ...]:
    """[[10], [2, 3]] as a tuple of tuples; () for anything else (bounded: at most 64 tensors of 16 dims)."""
    if not isinstance(value, list):
        return ()
    out = []
    for shape in value[:64]:
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape[:16]):
            return ()
        out.append(tuple(shape[:16]))
    return tuple(out)


# -- the analysis ---------------------------------------------------------------------------------------------

def analyse(records: list[RankRecord], now_ns: int) -> Verdict:
    """The culprit of the hang these records were taken in (`now_ns`: when, epoch nanoseconds)."""
    read = [r for r in records if r.answer is Answer.ANSWERED]
    found = Verdict(Finding.UNKNOWN, (), ranks=len(read),
                    missing=tuple(sorted(r.rank for r in records if r.answer is not Answer.ANSWERED)))
    stopped = those(records, Answer.STOPPED)
    stuck = first_stuck(read)
    if stuck is not None:
        found = in_call(found, records, read, stuck, now_ns)
        if found.finding is not Finding.UNKNOWN or stopped:
            return replace(found, finding=Finding.STOPPED, culprits=stopped) if stopped else found
    if stopped:
        return replace(found, finding=Finding.STOPPED, culprits=stopped)
    if silent := those(records, Answer.SILENT):
        return replace(found, finding=Finding.SILENT, culprits=silent)
    gave_up = those(records, Answer.TIMED_OUT)
    if stuck is None and gave_up and read:
        lasts = "; ".join((f"rank {r.rank}: " if len(read) > 1 else "")
                          + (f"{r.calls[-1].describe()} #{r.calls[-1].seq}" if r.calls else "none yet")
                          for r in sorted(read, key=lambda r: r.rank))
        return replace(found, finding=Finding.AWAY, culprits=tuple(sorted((r.rank, r.node) for r in read)),
                       waiting=gave_up, odd=lasts)
    return found


def those(records: list[RankRecord], answer: Answer) -> tuple[tuple[int, str], ...]:
    """(rank, node) of the records that answered so, lowest rank first."""
    return tuple(sorted((r.rank, r.node) for r in records if r.answer is answer))


def in_call(found: Verdict, records: list[RankRecord], read: list[RankRecord], stuck: tuple[str, int],
            now_ns: int) -> Verdict:
    """The verdict around the stuck call: who waits in it, who never entered it, who called something else."""
    node_of = {r.rank: r.node for r in records}
    group, seq = stuck
    calls = {r.rank: call for r in read if (call := call_at(r, group, seq)) is not None}
    open_calls = {rank: c for rank, c in calls.items() if not c.done}
    oldest = min((c.created_ns for c in open_calls.values() if c.created_ns), default=0)
    found = replace(
        found, group=group, seq=seq, op=next(iter(open_calls.values())).describe() if open_calls else "",
        waiting=tuple(sorted((rank, node_of[rank]) for rank in open_calls)),
        waited_s=max(0.0, (now_ns - oldest) / 1e9) if oldest else None,
    )
    never = tuple(sorted((r.rank, r.node) for r in read if r.rank not in calls and takes_part(r, group)))
    if never:
        return replace(found, finding=Finding.NEVER_ENTERED, culprits=never)
    return mismatch(found, calls, node_of) or found


def mismatch(found: Verdict, calls: dict[int, Call], node_of: dict[int, str]) -> Verdict | None:
    """The ranks that called something else at the stuck call number; None when every rank called the same.

    With a majority, the others are the culprits and the majority waits; without one, every side is named.
    """
    sides: dict[tuple[str, tuple[tuple[int, ...], ...]], list[int]] = defaultdict(list)
    for rank, c in sorted(calls.items()):
        sides[c.signature].append(rank)
    if len(sides) < 2:
        return None
    ordered = sorted(sides.values(), key=lambda ranks: (-len(ranks), ranks[0]))
    if len(ordered[0]) > len(ordered[1]):
        normal, odd = ordered[0], sorted(r for ranks in ordered[1:] for r in ranks)
    else:  # no majority: nobody can tell who is right
        normal, odd = [], sorted(calls)
    odd_calls = "; ".join(calls[ranks[0]].describe() + ("" if normal else f" (rank {rank_list(ranks)})")
                      for ranks in ordered if ranks is not normal)
    return replace(
        found, finding=Finding.MISMATCH, culprits=tuple((r, node_of[r]) for r in odd),
        waiting=tuple((r, node_of[r]) for r in normal),
        op=calls[normal[0]].describe() if normal else "", odd=odd_calls,
    )


def call_at(record: RankRecord, group: str, seq: int) -> Call | None:
    """The rank's call `seq` of `group` (an open one first, should a dump hold the number twice)."""
    calls = [c for c in record.calls if c.group == group and c.seq == seq]
    return min(calls, key=lambda c: c.done) if calls else None


def first_stuck(read: list[RankRecord]) -> tuple[str, int] | None:
    """(group, seq) of the open call entered first (the oldest a rank still waits in); None if no call is open."""
    open_calls = [c for r in read for c in r.calls if not c.done]
    if not open_calls:
        return None
    first = min(open_calls, key=lambda c: (c.created_ns or 0, c.seq))
    return first.group, min(c.seq for c in open_calls if c.group == first.group)


def takes_part(record: RankRecord, group: str) -> bool:
    """Whether a rank is in `group`: it called a collective of it, or (the default group "0") none at all yet."""
    return any(c.group == group for c in record.calls) or (group == "0" and not record.calls)


# -- the wire form (one node's records, shared with the other nodes through etcd) ------------------------------

WIRE_CALLS = 64  # per rank: the last calls (the divergence is at the end of the buffer); bounds a node's answer
WIRE_RANKS = 1024  # per node


def to_wire(records: list[RankRecord]) -> list[object]:
    """JSON-able, bounded: each rank's answer and its last WIRE_CALLS calls."""
    return [
        {"rank": r.rank, "node": r.node, "answer": r.answer.value, "detail": r.detail[:300],
         "calls": [[c.group, c.seq, c.op, [list(s) for s in c.sizes], c.done, c.created_ns]
                   for c in r.calls[-WIRE_CALLS:]]}
        for r in records[:WIRE_RANKS]
    ]


def from_wire(value: object) -> list[RankRecord]:
    """Records from another node's answer; whatever is malformed is left out (never raises)."""
    if not isinstance(value, list):
        return []
    out = []
    for item in value[:WIRE_RANKS]:
        if not isinstance(item, dict):
            continue
        rank, node, answer = item.get("rank"), item.get("node"), item.get("answer")
        calls = item.get("calls")
        if not isinstance(rank, int) or isinstance(rank, bool) or not isinstance(node, str) or not isinstance(
                calls, list) or answer not in {a.value for a in Answer}:
            continue
        parsed = (call_of({"pg_id": c[0], "collective_seq_id": c[1], "profiling_name": c[2], "input_sizes": c[3],
                           "retired": c[4], "time_created_ns": c[5]})
                  for c in calls[-WIRE_CALLS:] if isinstance(c, list) and len(c) == 6)
        detail = item.get("detail")
        out.append(RankRecord(rank, node[:MAX_NAME], Answer(answer), tuple(c for c in parsed if c is not None),
                              detail[:300] if isinstance(detail, str) else ""))
    return out
