"""A hang's culprit from the ranks' flight-recorder records (docs/hangs.md). Pure: records in, a verdict out.

torch's flight recorder (TORCH_FR_BUFFER_SIZE) keeps, per rank, the last collectives it called: process group,
`collective_seq_id`, op (`profiling_name`, e.g. "gloo:all_reduce"), tensor sizes and whether the call is over
(`retired`, or `state: completed`). Its JSON dump (the worker server's `fr_trace_json`) is parsed here, bounded,
without torch: the agent never imports it. In a hung job the ranks that wait sit in an open call (a rank that gave
up on a collective timeout keeps it open in its records: torch 2.13); the culprit is what makes them wait. Each
finding has a precondition (docs/hangs.md lists them), and none can name a rank that was waiting:

- **never_entered**: ranks read wait in call #k of a group (or, after a collective timeout, entered it and gave
  up), and ranks read of that group never entered #k and wait in no other call: those are named, whatever the
  others did next; or, across process groups, the rank in no call at the end of a chain of waits; or one rank
  alone waits in a call elsewhere while the others read wait in #k (and its call's group has no other member among
  the ranks read, as far as their records show);
- **circular_wait**: ranks read wait in calls of different process groups, each for a rank of the others' that never
  entered its call (a cycle in the wait-for graph): their records cannot tell which one skipped a call, so nobody is
  named, and the line says where each of them waits;
- **mismatch**: the ranks read entered the same call number with a different op or different sizes (the odd ones
  out are the culprits; with no majority, every side); a rank that died of a collective-mismatch error counts too;
- **stopped**: a rank's process is stopped (SIGSTOP: state T), which can make no progress, whatever the others do;
- **silent**: every rank read waits in the same call, every other rank answered, and these did not answer;
- **away**: a rank gave up waiting in a collective (a collective timeout; its records are gone), and the ranks read
  are in no collective at all: they are named, with their last call.

Anything else is **unknown** and names nobody: every rank read inside the same call with ranks unread, no rank
waiting, ranks that may be exiting, a recorder that keeps nothing. Point-to-point calls (send/recv) are not
matched: only collectives, which every rank of a group must call in order.
"""

from __future__ import annotations

import enum
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field, replace

MAX_ENTRIES = 20_000  # per rank: more than any sane TORCH_FR_BUFFER_SIZE; the rest of a dump is not read
MAX_NAME = 80  # characters of an op or process-group name kept
MAX_WAITED_IN = 256  # distinct calls waited in beyond which waits across process groups are not followed (bounded)
MAX_CYCLE_CALLS = 8  # calls of a circular wait said in its line (report.json's `hang.cycle` has every one)
MAX_RUNS = 8  # runs of ranks (`0-3`) in a list of a circular wait's line, the rest counted


class Answer(enum.Enum):
    """How a rank answered the flight-recorder query."""

    ANSWERED = "answered"
    RECORDER_OFF = "recorder_off"  # it answered, with no records at all (no `entries`: its recorder is off)
    STOPPED = "stopped"  # its process is stopped (SIGSTOP, SIGTSTP): nothing in it can answer
    SILENT = "silent"  # no answer within the bound (blocked, or its recorder's server is not running)
    EXITING = "exiting"  # its process is ending: its server answered, its handlers already gone (404)
    NO_RECORDER = "no_recorder"  # nothing listens: a cold worker, a script without torch, a process that ended
    EXITED = "exited"  # the process was gone before it was asked, or during the query
    TIMED_OUT = "timed_out"  # it ended on a collective timeout: it waited in a collective (its records are gone)
    MISMATCHED = "mismatched"  # it died of a collective-mismatch error (detail: the error); its records are gone


# Answers that show a rank going away: after a collective timeout a waiter may answer any of these, or not at all
TEARDOWN = frozenset({Answer.EXITING, Answer.NO_RECORDER, Answer.EXITED, Answer.TIMED_OUT, Answer.MISMATCHED})


class Finding(enum.Enum):
    """What the records show."""

    NEVER_ENTERED = "never_entered"
    AWAY = "away"  # in no collective at all while a peer gave up waiting in one (a collective timeout)
    MISMATCH = "mismatch"
    STOPPED = "stopped"
    SILENT = "silent"
    CIRCULAR_WAIT = "circular_wait"  # ranks wait in calls of different groups, each for another: nobody is named
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
class Waited:
    """A call of a circular wait: the cycle's ranks waiting in it, and the cycle's ranks of its group not in it."""

    call: Call  # as the first rank of `ranks` entered it
    ranks: tuple[tuple[int, str], ...]  # (rank, node) on the cycle waiting in it, lowest rank first
    never: tuple[int, ...]  # the ranks of the cycle that are of the call's group and never entered it

    def where(self) -> str:
        """`all_reduce #4 (process group 0)`."""
        return f"{self.call.op} #{self.call.seq} (process group {self.call.group})"

    def to_dict(self) -> dict[str, object]:
        """One entry of report.json's `hang.cycle`."""
        return {"process_group": self.call.group, "collective_seq": self.call.seq,
                "collective": self.call.describe(), "ranks": [{"rank": r, "node": n} for r, n in self.ranks],
                "never_entered": list(self.never)}


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
    died: tuple[tuple[int, str], ...] = ()  # ranks that died of a collective-mismatch error (their records gone)
    recorder_off: int = 0  # ranks that answered with no records at all (their recorder is off)
    note: str = ""  # unknown: why the evidence does not decide
    cycle: tuple[Waited, ...] = ()  # circular_wait: each call waited in on the cycle, its lowest rank first
    apart: bool = False  # unknown: the ranks read that wait are not all in the call the verdict is placed at

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
            instead = f" ({self.odd})" if self.odd else ""
            return f"hang: {who} never entered {where}{instead}; {waited_line(self.waiting, self.waited_s, 'it')}"
        if self.finding is Finding.MISMATCH:
            at = f"#{self.seq} (process group {self.group})" if self.group else f"#{self.seq} (c10d's fingerprints)"
            head = f"collective mismatch {at}: " if self.died else f"hang: mismatched collective {at}: "
            tail = f"; {ranks_on_nodes(self.died)} died of it" if self.died else ""
            if self.waiting:
                return f"{head}{who} called {self.odd} while {ranks_on_nodes(self.waiting)} called {self.op}{tail}"
            return f"{head}{who} disagree: {self.odd}{tail}"
        if self.finding is Finding.AWAY:
            gave_up = ranks_on_nodes(self.waiting)
            unread = sorted(set(self.missing) - {r for r, _ in self.waiting})
            tail = f" ({some_ranks(unread)} not read)" if unread else ""
            was = "was" if len(self.culprits) == 1 else "were"
            return (f"hang: {who} {was} in no collective (last call: {self.odd}) while {gave_up} timed out waiting "
                    f"in one{tail}")
        if self.finding is Finding.STOPPED:
            return f"hang: {who} is stopped (SIGSTOP or SIGTSTP: process state T)" + (f"; {waited}" if where else "")
        if self.finding is Finding.SILENT:
            return f"hang: {who} did not answer the flight-recorder query" + (f"; {waited}" if where else "")
        if self.finding is Finding.CIRCULAR_WAIT:
            return self.cycle_reason()
        return self.unknown_reason(where)

    def cycle_reason(self) -> str:
        """The line of a circular wait: each call waited in once, with the ranks in it and the ones it waits for.

        `hang: a circular wait between ranks 0 (node a) and 1 (node b): rank 0 waits in all_reduce #4 (process
        group 0), which rank 1 never entered; rank 1 waits in ...; which of them skipped a call the records cannot
        tell`.
        """
        ranks = sorted(rank for w in self.cycle for rank in w.ranks)
        nodes = len({n for _, n in ranks})
        between = (f"between ranks {', '.join(f'{r} (node {n})' for r, n in ranks[:-1])} and {ranks[-1][0]} (node "
                   f"{ranks[-1][1]})" if len(ranks) <= 4 else f"among {len(ranks)} ranks on {nodes} node(s)")
        parts = [f"{some_ranks([r for r, _ in w.ranks])} {'waits' if len(w.ranks) == 1 else 'wait'} in {w.where()}, "
                 f"which {some_ranks(list(w.never))} never entered" for w in self.cycle[:MAX_CYCLE_CALLS]]
        if len(self.cycle) > MAX_CYCLE_CALLS:
            more = len(self.cycle) - MAX_CYCLE_CALLS
            parts.append(f"{more} other call{'' if more == 1 else 's'}")
        behind = sorted({r for r, _ in self.waiting} - {r for r, _ in ranks})
        if behind:
            parts.append(f"{some_ranks(behind)} {'waits' if len(behind) == 1 else 'wait'} behind them")
        return (f"hang: a circular wait {between}: {'; '.join(parts)}; which of them skipped a call the records "
                "cannot tell")

    def unknown_reason(self, where: str) -> str:
        """The line of a verdict that names nobody: what the records show, and why that does not decide."""
        note = f" ({self.note})" if self.note else ""
        if self.died:
            return (f"collective mismatch: {ranks_on_nodes(self.died)} died of it; which rank's call differed cannot "
                    f"be told{note}")
        if not self.ranks and self.recorder_off:
            return ("hang: no records: the flight recorder is off in the workers (their dumps have no entries: "
                    "TORCH_FR_BUFFER_SIZE or TORCH_NCCL_TRACE_BUFFER_SIZE is 0 in their environment)")
        if where and not self.apart:  # apart: the ranks read wait in several calls (the note says which)
            if self.missing:
                return (f"hang: every rank read is inside {where}; {some_ranks(list(self.missing))} could not be "
                        f"read, so which rank holds it up cannot be told{note}")
            return f"hang: every rank read is inside {where}: the collective itself is stuck (transport, network)"
        if self.note:
            return f"hang: no culprit can be told{note}"
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
            "died": [{"rank": r, "node": n} for r, n in self.died],
            "cycle": [w.to_dict() for w in self.cycle],
            "reason": self.reason(),
        }


@dataclass(frozen=True)
class Culprit:
    """What the records showed, the culprits' stacks (this node's, by rank) and how long the analysis took."""

    verdict: Verdict
    stacks: dict[int, str]
    took_s: float
    unread: dict[int, str] = field(default_factory=dict)  # culprits of this node whose stacks could not be had: why

    def stacks_text(self) -> list[str]:
        """Each culprit's stacks under its rank, lowest rank first (the failure's stacks); a missing one says why."""
        texts = {r: f"rank {r} (culprit):\n{text.rstrip()}" for r, text in self.stacks.items()}
        texts.update({r: f"rank {r} (culprit): no stack: {why}" for r, why in self.unread.items() if r not in texts})
        return [text for _, text in sorted(texts.items())]


def rank_list(ranks: list[int]) -> str:
    """`0-2, 5`."""
    out: list[str] = []
    for r in sorted(set(ranks)):
        if out and out[-1].split("-")[-1] == str(r - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{r}"
        else:
            out.append(str(r))
    return ", ".join(out)


def some_ranks(ranks: list[int]) -> str:
    """`rank 1`, `ranks 0-2, 5`; a list of many runs shortened: `ranks 0, 2, 4, ... (4096 ranks)`."""
    runs = rank_list(ranks).split(", ")
    said = ", ".join(runs) if len(runs) <= MAX_RUNS else f"{', '.join(runs[:MAX_RUNS])}, ... ({len(ranks)} ranks)"
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {said}"


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

def read_dump(raw: bytes | str) -> tuple[Call, ...] | None:
    """The collectives of one `fr_trace_json` dump; () for anything that is not one.

    None: a dump with no `entries` and no process group in `pg_config`: the recorder keeps nothing
    (TORCH_FR_BUFFER_SIZE=0; torch 2.13 writes `entries` only once a collective is recorded, and a recorder that is
    on lists the process groups in `pg_config` from the start).
    """
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return ()
    if not isinstance(data, dict):
        return ()
    entries = data.get("entries")
    if entries is None and "version" in data:
        return () if data.get("pg_config") else None
    if not isinstance(entries, list):
        return ()
    calls = (call_of(e) for e in entries[-MAX_ENTRIES:] if isinstance(e, dict))
    return tuple(c for c in calls if c is not None)


def merge_dumps(first: bytes, second: bytes | None) -> bytes:
    """One dump of a rank's two recorders: `fr_trace_json` (gloo, other backends) and NCCL's `dump_nccl_trace_json`.

    torch keeps NCCL's collectives in a recorder of their own. Their `entries` and `pg_config` together; `first`
    unchanged when `second` is missing, not a dump, or has no entries.
    """
    try:
        other = json.loads(second) if second else None
    except (ValueError, RecursionError):
        other = None
    if not isinstance(other, dict) or not isinstance(other.get("entries"), list) or not other["entries"]:
        return first
    try:
        data = json.loads(first)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        return second or first
    mine, theirs = data.get("entries"), other["entries"]
    entries = [*(mine if isinstance(mine, list) else []), *(theirs if isinstance(theirs, list) else [])]
    configs = [d.get("pg_config") for d in (data, other)]
    merged = {**data, "entries": entries,
              "pg_config": {k: v for c in configs if isinstance(c, dict) for k, v in c.items()}}
    return json.dumps(merged).encode()


def parse_dump(raw: bytes | str) -> tuple[Call, ...]:
    """The collectives of one `fr_trace_json` dump; () for anything that is not one, or a recorder that is off."""
    return read_dump(raw) or ()


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
# Each finding's precondition is written where it is decided, and in docs/hangs.md. A rank is named only on
# evidence that it is not waiting: its own records (it is in no call, or not in the one the others are in), its
# process state (stopped), or, for a rank that did not answer, every other rank answering from inside one call.

def analyse(records: list[RankRecord], now_ns: int) -> Verdict:
    """The culprit of the hang these records were taken in (`now_ns`: when, epoch nanoseconds)."""
    read = [r for r in records if r.answer is Answer.ANSWERED]
    found = Verdict(Finding.UNKNOWN, (), ranks=len(read),
                    missing=tuple(sorted(r.rank for r in records if r.answer is not Answer.ANSWERED)),
                    died=those(records, Answer.MISMATCHED),
                    recorder_off=sum(r.answer is Answer.RECORDER_OFF for r in records))
    if found.died:  # a rank died of a collective-mismatch error: not a hang; the call that differed is sought
        claims = {rank: c for r in records if r.answer is Answer.MISMATCHED for rank, c in claims_of(r.detail).items()}
        return claimed(found, records, claims) if claims else aborted(found, records, read)
    stopped = those(records, Answer.STOPPED)
    gave_up = those(records, Answer.TIMED_OUT)
    stuck = first_stuck(read)
    if stuck is not None:
        found = in_call(found, records, read, stuck, now_ns, gave_up)
        if stopped:  # precondition: process state T (it can make no progress, whatever the others do)
            return replace(found, finding=Finding.STOPPED, culprits=stopped)
        if found.finding is not Finding.UNKNOWN:
            return found
        return silent(found, records, read)
    if stopped:
        return replace(found, finding=Finding.STOPPED, culprits=stopped, waiting=gave_up)
    return after_timeout(found, records, read, gave_up) if gave_up else found


def after_timeout(found: Verdict, records: list[RankRecord], read: list[RankRecord],
                  gave_up: tuple[tuple[int, str], ...]) -> Verdict:
    """No rank read is in a call, and ranks gave up waiting in one: who never came (never_entered, else away)."""
    if not read:
        return replace(found, note=f"{ranks_on_nodes(gave_up)} timed out waiting in a collective, and no other "
                                   "rank's records could be read")
    if (left := behind(found, records, read, gave_up)) is not None:
        return left
    # precondition: a rank gave up waiting in a collective, and no rank read is in one (a rank that gave up keeps
    # its call open in its records until it has exited: a waiter that still answers is in a call)
    lasts = "; ".join((f"rank {r.rank}: " if len(read) > 1 else "")
                      + (f"{r.calls[-1].describe()} #{r.calls[-1].seq}" if r.calls else "none yet")
                      for r in sorted(read, key=lambda r: r.rank))
    return replace(found, finding=Finding.AWAY, culprits=tuple(sorted((r.rank, r.node) for r in read)),
                   waiting=gave_up, odd=lasts)


def those(records: list[RankRecord], answer: Answer) -> tuple[tuple[int, str], ...]:
    """(rank, node) of the records that answered so, lowest rank first."""
    return tuple(sorted((r.rank, r.node) for r in records if r.answer is answer))


def silent(found: Verdict, records: list[RankRecord], read: list[RankRecord]) -> Verdict:
    """Every rank read is inside the stuck call: the ranks that did not answer are named, if nothing else can be.

    Precondition: every rank but these answered with its records (none is exiting, timed out, stopped, without a
    recorder or with it off: a waiter that leaves after a collective timeout may not answer either), and every
    rank read that waits, waits in the stuck call.
    """
    quiet = those(records, Answer.SILENT)
    if not quiet or any(c.group != found.group or c.seq != found.seq for r in read for c in r.calls if not c.done):
        return found
    if any(r.answer is not Answer.ANSWERED and r.answer is not Answer.SILENT for r in records):
        others = sorted(r.rank for r in records if r.answer in TEARDOWN or r.answer is Answer.RECORDER_OFF)
        return replace(found, note=f"{ranks_on_nodes(quiet)} did not answer, and {rank_list(others)} could not "
                                   "be read either: a rank leaving after a collective timeout does not answer")
    return replace(found, finding=Finding.SILENT, culprits=quiet)


def in_call(found: Verdict, records: list[RankRecord], read: list[RankRecord], stuck: tuple[str, int],
            now_ns: int, gave_up: tuple[tuple[int, str], ...] = ()) -> Verdict:
    """The verdict around the stuck call: who waits in it, who never entered it, who called something else.

    never_entered's precondition: ranks read wait in #k of the group, and ranks read of that group never entered
    #k (their records end before it) and wait in no other call. The ranks that gave up waiting (a collective
    timeout) count as waiting. The stuck call is asked first, then the others waited in (oldest first: a chain of
    waits across process groups ends at a rank in no call), then whether the waits close a cycle.
    """
    node_of = {r.rank: r.node for r in records}
    found, calls = placed(found, records, read, stuck, now_ns, gave_up)
    waits = {r.rank for r in read if any(not c.done for c in r.calls)}
    never = tuple(sorted((r.rank, r.node) for r in read
                         if r.rank not in calls and r.rank not in waits and takes_part(r, stuck[0])))
    if never:
        return replace(found, finding=Finding.NEVER_ENTERED, culprits=never)
    return mismatch(found, calls, node_of) or across(found, records, read, stuck, now_ns, gave_up)


def across(found: Verdict, records: list[RankRecord], read: list[RankRecord], stuck: tuple[str, int], now_ns: int,
           gave_up: tuple[tuple[int, str], ...]) -> Verdict:
    """The waits across process groups, when nobody in the stuck call's group is named.

    In order: a rank read in no call that a rank waits for in another call (never_entered: the end of a chain of
    waits across groups); a cycle of waits (circular_wait: nobody named, each rank's call said); one rank alone
    elsewhere (`alone`); else nobody, saying where the ranks read wait when not all in the stuck call.
    """
    node_of = {r.rank: r.node for r in records}
    waits = {r.rank for r in read if any(not c.done for c in r.calls)}
    graph = WaitGraph.of(read)
    if graph is None:
        return replace(found, apart=True, note=f"ranks read wait in more than {MAX_WAITED_IN} different calls")
    for where in (w for w in graph.waited_in if w != stuck):  # a chain across groups: the rank in no call at its end
        if never := tuple(sorted((r, node_of[r]) for r in graph.missing[where] if r not in waits)):
            found, _ = placed(found, records, read, where, now_ns, gave_up)
            return replace(found, finding=Finding.NEVER_ENTERED, culprits=never)
    if cycle := graph.cycle(node_of):
        oldest = min((c.created_ns for c in graph.at.values() if c.created_ns), default=0)  # behind it too
        return replace(found, finding=Finding.CIRCULAR_WAIT, cycle=cycle,
                       waiting=tuple(sorted({(r, node_of[r]) for r in graph.at} | set(gave_up))),
                       waited_s=max(0.0, (now_ns - oldest) / 1e9) if oldest else None)
    if (lone := alone(found, records, read, now_ns, gave_up, graph)) is not None:
        return lone
    elsewhere = {rank: c for rank, c in graph.at.items() if (c.group, c.seq) != stuck}
    if not elsewhere:
        return found
    by_call: dict[tuple[str, int, str], list[int]] = defaultdict(list)
    for rank, c in sorted(elsewhere.items()):
        by_call[(c.group, c.seq, c.op)].append(rank)
    said = "; ".join(f"{some_ranks(rs)} in {op} #{seq} (process group {group})"
                     for (group, seq, op), rs in list(by_call.items())[:MAX_CYCLE_CALLS])
    more = ", ..." if len(by_call) > MAX_CYCLE_CALLS else ""
    return replace(found, apart=True, note=f"ranks read wait in other calls too ({said}{more}): no wait among them "
                                          "ends at a rank read in no call or closes a cycle")


def placed(found: Verdict, records: list[RankRecord], read: list[RankRecord], stuck: tuple[str, int], now_ns: int,
           gave_up: tuple[tuple[int, str], ...]) -> tuple[Verdict, dict[int, Call]]:
    """The verdict placed at call `stuck`: its op, who waits in it and for how long; and each rank read's call."""
    node_of = {r.rank: r.node for r in records}
    group, seq = stuck
    calls = {r.rank: call for r in read if (call := call_at(r, group, seq)) is not None}
    open_calls = {rank: c for rank, c in calls.items() if not c.done}
    oldest = min((c.created_ns for c in open_calls.values() if c.created_ns), default=0)
    return replace(
        found, group=group, seq=seq, op=next(iter(open_calls.values())).describe() if open_calls else "",
        waiting=tuple(sorted({(rank, node_of[rank]) for rank in open_calls} | set(gave_up))),
        waited_s=max(0.0, (now_ns - oldest) / 1e9) if oldest else None,
    ), calls


def alone(found: Verdict, records: list[RankRecord], read: list[RankRecord], now_ns: int,
          gave_up: tuple[tuple[int, str], ...], graph: WaitGraph) -> Verdict | None:
    """One rank alone in a call elsewhere: it never entered the one the others read are in (None: no such rank).

    The finding is `never_entered`, with the call it is in instead.

    Precondition: at least two ranks read wait in one call #k; exactly one other rank read waits, in another call,
    and it is a member of #k's group that never entered #k; and no other rank read is shown to be a member of its
    call's group (no record of that group: e.g. the group's first call), so the records show it waiting for none of
    them. (A rank read of its call's group that never entered it and waits in #k: a circular wait, asked before.
    Two ranks or more elsewhere: a chain to a rank in no call, or a cycle, asked before; else nobody is named.)
    """
    at: dict[tuple[str, int], list[RankRecord]] = defaultdict(list)
    for r in read:
        if (first := first_open(r)) is not None:
            at[(first.group, first.seq)].append(r)
    if len(at) != 2:
        return None
    (where, crowd), (_, lone) = sorted(at.items(), key=lambda kv: -len(kv[1]))
    if len(lone) != 1 or len(crowd) < 2 or not takes_part(lone[0], where[0]):
        return None
    rank = lone[0]
    if call_at(rank, *where) is not None or graph.waits_for(rank.rank):
        return None
    elsewhere = graph.at[rank.rank]
    found, _ = placed(found, records, read, where, now_ns, gave_up)
    return replace(found, finding=Finding.NEVER_ENTERED, culprits=((rank.rank, rank.node),),
                   odd=f"it is in {elsewhere.op} #{elsewhere.seq} (process group {elsewhere.group})")


def behind(found: Verdict, records: list[RankRecord], read: list[RankRecord],
           gave_up: tuple[tuple[int, str], ...]) -> Verdict | None:
    """The ranks read that never entered the last call the others read of its group entered (and left).

    None when every rank read reached it; asked when no rank read is still in a call.

    Precondition: a rank gave up on (or died in) a collective. A healthy collective ends on no rank before every
    rank of its group entered it, so a rank whose records end before a call that others entered never came.
    """
    node_of = {r.rank: r.node for r in records}
    latest: dict[str, Call] = {}
    for c in (c for r in read for c in r.calls):
        if c.group not in latest or (c.seq, c.created_ns) > (latest[c.group].seq, latest[c.group].created_ns):
            latest[c.group] = c
    for last in sorted(latest.values(), key=lambda c: -c.created_ns):
        members = [r for r in read if takes_part(r, last.group)]
        at = [r.rank for r in members if call_at(r, last.group, last.seq) is not None]
        never = tuple(sorted((r.rank, r.node) for r in members if r.rank not in at))
        if never and at:
            waiting = tuple(sorted({(rank, node_of[rank]) for rank in at} | set(gave_up)))
            return replace(found, finding=Finding.NEVER_ENTERED, culprits=never, waiting=waiting, group=last.group,
                           seq=last.seq, op=last.describe())
    return None


def mismatch(found: Verdict, calls: dict[int, Call], node_of: dict[int, str]) -> Verdict | None:
    """The ranks that called something else at the stuck call number; None when every rank called the same.

    Precondition: the ranks read entered the same call number of one group with different signatures. With a
    majority, the others are the culprits and the majority waits; without one, every side is named.
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
    odd_calls = "; ".join(calls[ranks[0]].describe() + ("" if normal else f" ({some_ranks(ranks)})")
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


def first_open(record: RankRecord) -> Call | None:
    """The open call the rank entered first (the one it waits in); None when it is in no call."""
    opened = [c for c in record.calls if not c.done]
    return min(opened, key=lambda c: (c.created_ns, c.seq)) if opened else None


@dataclass(frozen=True)
class WaitGraph:
    """Who waits for whom, as the records show.

    Each rank read that waits, in the call it entered first, waits for every rank read of that call's group
    (takes_part) that never entered it. Bounded: a graph of ranks and the calls waited in (a rank -> its call -> the
    ranks of the call's group that never entered it), linear in their sum.
    """

    at: dict[int, Call]  # each rank read that waits: the call it waits in
    waited_in: tuple[tuple[str, int], ...]  # every call waited in, (group, seq), the one entered first first
    missing: dict[tuple[str, int], tuple[int, ...]]  # each call waited in: the ranks read of its group not in it

    @staticmethod
    def of(read: list[RankRecord]) -> WaitGraph | None:
        """The graph of the ranks read (None: they wait in more than MAX_WAITED_IN different calls)."""
        at = {r.rank: c for r in read if (c := first_open(r)) is not None}
        first: dict[tuple[str, int], int] = {}
        for c in at.values():
            first[(c.group, c.seq)] = min(first.get((c.group, c.seq), c.created_ns), c.created_ns)
        if len(first) > MAX_WAITED_IN:
            return None
        entered = {r.rank: {(c.group, c.seq) for c in r.calls} for r in read}
        members: dict[str, list[int]] = defaultdict(list)
        for r in read:
            for group in {c.group for c in r.calls} or {"0"}:
                members[group].append(r.rank)
        waited_in = tuple(sorted(first, key=lambda w: (first[w], w[1], w[0])))
        missing = {w: tuple(r for r in members[w[0]] if w not in entered[r]) for w in waited_in}
        return WaitGraph(at, waited_in, missing)

    def waits_for(self, rank: int) -> tuple[int, ...]:
        """The ranks read that `rank` waits for (() when it is in no call)."""
        c = self.at.get(rank)
        return tuple(r for r in self.missing[(c.group, c.seq)] if r != rank) if c is not None else ()

    def cycle(self, node_of: dict[int, str]) -> tuple[Waited, ...]:
        """Every call waited in by ranks on a cycle of waits, with those ranks and the cycle's ranks not in it.

        () when the waits close no cycle. The ranks of the strongly connected components of more than one vertex;
        the calls ordered by their lowest rank.
        """
        edges: dict[Vertex, list[Vertex]] = {("rank", "", rank): [("call", c.group, c.seq)]
                                             for rank, c in self.at.items()}
        edges.update({("call", group, seq): [("rank", "", r) for r in ranks if r in self.at]
                      for (group, seq), ranks in self.missing.items()})
        on = {v[2] for part in components(edges) if len(part) > 1 for v in part if v[0] == "rank"}
        calls: dict[tuple[str, int], list[int]] = defaultdict(list)
        for rank in sorted(on):
            calls[(self.at[rank].group, self.at[rank].seq)].append(rank)
        return tuple(Waited(self.at[ranks[0]], tuple((r, node_of[r]) for r in ranks),
                            tuple(r for r in self.missing[w] if r in on)) for w, ranks in calls.items())


Vertex = tuple[str, str, int]  # the wait-for graph's: ("rank", "", rank) or ("call", group, seq)


def components(edges: dict[Vertex, list[Vertex]]) -> list[list[Vertex]]:
    """The strongly connected components of a graph (Tarjan's algorithm, without recursion: bounded stack)."""
    index: dict[Vertex, int] = {}
    low: dict[Vertex, int] = {}
    stack: list[Vertex] = []
    slot: dict[Vertex, int] = {}  # the vertices on the stack: where each is
    out: list[list[Vertex]] = []
    for root in (v for v in edges if v not in index):
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                slot[v] = len(stack)
                stack.append(v)
            nexts = edges.get(v, [])
            if i < len(nexts):  # the next edge: a vertex to visit, or one seen (on the stack: part of v's component)
                work.append((v, i + 1))
                w = nexts[i]
                if w not in index:
                    work.append((w, 0))
                elif w in slot:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:  # v roots a component: the stack down to v
                out.append(stack[slot[v]:])
                for w in stack[slot[v]:]:
                    del slot[w]
                del stack[len(stack) - len(out[-1]):]
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
    return out


def takes_part(record: RankRecord, group: str) -> bool:
    """Whether a rank is in `group`: it called a collective of it, or (the default group "0") none at all yet."""
    return any(c.group == group for c in record.calls) or (group == "0" and not record.calls)


# -- a mismatch that aborts (a rank died of it: its records are gone) -----------------------------------------

# gloo's words when a rank receives more than its own call expects (torch 2.13: third_party/gloo/.../pair.cc)
GLOO_SHORT = re.compile(r"op\.preamble\.length <= op\.nbytes\. (\d+) vs (\d+)")


def aborted(found: Verdict, records: list[RankRecord], read: list[RankRecord]) -> Verdict:
    """A rank died of a collective-mismatch error: the rank whose call differed, from the ranks read.

    The ranks read are compared at the last call of the group entered last (over or not: their peer's death ended
    it). Precondition for naming: the sides' sizes decide whatever the ranks not read called: every rank but the
    one that died was read and agrees (then the one that died differed), or one side outnumbers every other even if
    all the ranks not read joined that other. The rank that died is placed on a side only by gloo's words: it
    received more than its call expected, so its call is the smaller of two.
    """
    node_of = {r.rank: r.node for r in records}
    died = found.died
    entered = [c for r in read for c in r.calls]
    if not entered:
        return replace(found, note="no other rank's records could be read")
    last = max(entered, key=lambda c: (c.created_ns, c.seq))
    seq = max(c.seq for c in entered if c.group == last.group)
    calls = {r.rank: c for r in read if (c := call_at(r, last.group, seq)) is not None}
    found = replace(found, group=last.group, seq=seq)
    if not calls:
        return found
    sides: dict[tuple[str, tuple[tuple[int, ...], ...]], list[int]] = defaultdict(list)
    for rank, c in sorted(calls.items()):
        sides[c.signature].append(rank)
    unread = len(records) - len(calls) - len(died)
    dead = died[0][0]
    if len(sides) == 1:
        sig = next(iter(calls.values())).describe()
        if len(died) > 1 or unread:
            return replace(found, op=sig, note=f"the ranks read called {sig}; {unread} other rank(s) not read")
        return replace(found, finding=Finding.MISMATCH, culprits=died, waiting=tuple((r, node_of[r]) for r in calls),
                       op=sig, odd=died_line(records, dead, next(iter(calls.values())).op))
    placed = len(died) == 1 and len(sides) == 2 and smaller_than_sent(records, dead)
    if placed:
        small = min(sides, key=lambda s: sum(numel(shape) for shape in s[1]))
        big = max(sides, key=lambda s: sum(numel(shape) for shape in s[1]))
        if small == big:
            placed = False
        else:
            sides[small] = sorted([*sides[small], dead])
    unknown = unread + (0 if placed else len(died))
    ordered = sorted(sides.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    (_, normal), rest = ordered[0], ordered[1:]
    described = "; ".join(f"{calls[next(r for r in ranks if r in calls)].describe()} ({some_ranks(ranks)})"
                          for _, ranks in ordered)
    if len(normal) <= len(rest[0][1]) + unknown:
        return replace(found, note=f"the ranks read called {described}")
    odd = sorted(r for _, ranks in rest for r in ranks)
    return replace(
        found, finding=Finding.MISMATCH, culprits=tuple((r, node_of[r]) for r in odd),
        waiting=tuple((r, node_of[r]) for r in normal),
        op=calls[next(r for r in normal if r in calls)].describe(),
        odd="; ".join(calls[next(r for r in ranks if r in calls)].describe() for _, ranks in rest),
    )


def claimed(found: Verdict, records: list[RankRecord], claims: dict[int, Call]) -> Verdict:
    """The rank whose call differed, from c10d's own words (TORCH_DISTRIBUTED_DEBUG=DETAIL).

    Every rank that raises names its call and one other rank's, before the collective is run (so no record has it,
    and every rank leaves). Precondition for naming, as for the records: one side outnumbers every other even if
    every rank no words named joined that other.
    """
    node_of = {r.rank: r.node for r in records}
    sides: dict[tuple[str, tuple[tuple[int, ...], ...]], list[int]] = defaultdict(list)
    for rank, c in sorted(claims.items()):
        if rank in node_of:
            sides[c.signature].append(rank)
    ordered = sorted(sides.values(), key=lambda ranks: (-len(ranks), ranks[0]))
    found = replace(found, group="", seq=max(c.seq for c in claims.values()))
    described = "; ".join(f"{claims[ranks[0]].describe()} ({some_ranks(ranks)})" for ranks in ordered)
    unknown = len(records) - sum(len(ranks) for ranks in ordered)
    if len(ordered) < 2 or len(ordered[0]) <= len(ordered[1]) + unknown:
        return replace(found, note=f"c10d's words name {described}")
    odd = sorted(r for ranks in ordered[1:] for r in ranks)
    return replace(found, finding=Finding.MISMATCH, culprits=tuple((r, node_of[r]) for r in odd),
                   waiting=tuple((r, node_of[r]) for r in ordered[0]), op=claims[ordered[0][0]].describe(),
                   odd="; ".join(claims[ranks[0]].describe() for ranks in ordered[1:]))


# c10d's words (TORCH_DISTRIBUTED_DEBUG=DETAIL checks each collective's fingerprint on every rank before it runs)
C10D_PRINT = re.compile(r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=(\d+), "
                        r"OpType=(\w+), TensorShape=\[([\d, ]*)\]")
CLAIM = re.compile(r"rank (\d+) (\w+) \[([\d, ]*)\] #(\d+)")


def mismatch_words(line: str) -> str:
    """A collective-mismatch error line, short (bounded).

    c10d's fingerprints become `c10d: rank 0 ALLGATHER [10] #3; rank 2 ALLGATHER [20] #3`; other words stay.
    """
    prints = C10D_PRINT.findall(line[:4000])
    if prints:
        return "c10d: " + "; ".join(f"rank {r} {op} [{shape}] #{seq}" for r, seq, op, shape in prints[:4])
    return line.strip()[:300]


def claims_of(detail: str) -> dict[int, Call]:
    """The calls c10d's words (as mismatch_words shortens them) say ranks made; {} for any other words."""
    if not detail.startswith("c10d: "):
        return {}
    return {int(rank): Call(group="", seq=int(seq), op=op.lower(), done=True, created_ns=0,
                            sizes=(tuple(int(d) for d in shape.replace(" ", "").split(",") if d),))
            for rank, op, shape, seq in CLAIM.findall(detail)}


def died_line(records: list[RankRecord], rank: int, op: str) -> str:
    """What the rank that died called, as far as its error tells (its records are gone)."""
    detail = next((r.detail for r in records if r.rank == rank), "")
    if (m := GLOO_SHORT.search(detail)) is not None and int(m[1]) > int(m[2]):
        return f"a smaller {op} (it received {m[1]} bytes where its own call expected {m[2]})"
    words = re.sub(r"^.*?\] ", "", detail.replace("what():", "").strip())  # gloo's `[enforce fail at file:line]`
    return f"another call (its error: {words})" if words else "another call"


def smaller_than_sent(records: list[RankRecord], rank: int) -> bool:
    """Whether the rank's error says it received more than its call expected (gloo's words)."""
    detail = next((r.detail for r in records if r.rank == rank), "")
    m = GLOO_SHORT.search(detail)
    return m is not None and int(m[1]) > int(m[2])


def numel(shape: tuple[int, ...]) -> int:
    """Elements of a tensor of `shape`."""
    n = 1
    for d in shape:
        n *= d
    return n


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
