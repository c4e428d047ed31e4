"""Read every local worker's flight recorder when a hang is found, and name the culprit (docs/hangs.md).

Each worker forked from a fork server that preloaded torch runs torch's worker server (`worker_main()`, started
in runner/workers/standby_main.py) on its own unix socket, `$RUNNER_FLIGHT_RECORDER_SOCKET`, in a private
folder of the agent's. Its `fr_trace_json` handler answers from a C++ thread, so a worker whose main thread is
blocked in a collective answers too; NCCL's collectives are in a recorder of their own, which `dump_nccl_trace_json`
answers (seen on a GPU machine: bench/gpu_nccl_check.py): both are asked, and their entries read together. The
query is plain HTTP/1.1 over that socket, bounded in time (every rank at once, one deadline) and in size; the
answer is kept beside the rank's logs as `flight_recorder.json` and parsed by runner.hangs. A stopped process
(SIGSTOP) is not asked: its state says why it cannot answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol

import structlog

from runner.contract import FLIGHT_SOCKET_VAR
from runner.hangs import Answer, Culprit, RankRecord, analyse, merge_dumps, read_dump
from runner.system import procs
from runner.system.soft_io import warn_once
from runner.watchdog.stacks import capture_stacks
from runner.workers.group import Worker

QUERY_TIMEOUT_S = 3.0  # every rank is asked at once; this bounds the whole query
SHARE_TIMEOUT_S = 5.0  # several nodes: how long the other nodes' records are waited for (etcd)
MAX_DUMP_BYTES = 32 << 20  # one rank's answer; a larger one is cut (and then fails to parse: "no records")
HANDLERS = ("fr_trace_json", "dump_nccl_trace_json")  # every backend's recorder; NCCL's (404 without NCCL)
DUMP_FILE = "flight_recorder.json"


class Share(Protocol):
    """The rendezvous's share_hang: this node's records out, every node's back (bounded; never raises)."""

    async def __call__(self, local: list[RankRecord], *, timeout: float) -> list[RankRecord]:
        """Every rank's record of the round."""
        ...


class FlightRecorder:
    """The sockets of one agent's workers, and the query of all of them when a hang is found."""

    def __init__(self, entries: int, node: str, log: structlog.typing.FilteringBoundLogger,
                 share: Share | None = None) -> None:
        self.entries = entries  # 0: the recorder is off
        self.node = node
        self.log = log
        self.share = share  # several nodes: gives this node's records, returns every node's (the rendezvous)
        self.folder: Path | None = None
        self.capture = True  # py-spy the culprits (watchdog.capture_stacks)
        self._query: asyncio.Task[Culprit | None] | None = None  # one query of every rank per attempt

    def socket(self, local_rank: int) -> str:
        """The socket `local_rank`'s worker serves on ('' when the recorder is off or there is no folder)."""
        folder = self.open_folder()
        return str(folder / f"{local_rank}.sock") if folder is not None else ""

    def open_folder(self) -> Path | None:
        """The sockets' folder, made on first call (None when the recorder is off or the temp dir refuses it)."""
        if not self.entries:
            return None
        if self.folder is None:
            try:  # short (a unix socket's path is at most 107 bytes) and private (0700)
                self.folder = Path(tempfile.mkdtemp(prefix="runner-fr-"))
            except OSError as e:
                warn_once("flight_recorder_no_folder", Path(tempfile.gettempdir()), e)
        return self.folder

    def worker_env(self, local_ranks: Iterable[int]) -> dict[int, dict[str, str]]:
        """Per local rank: the socket its worker serves its records on (none when the recorder is off)."""
        return {r: {FLIGHT_SOCKET_VAR: sock} for r in local_ranks if (sock := self.socket(r))}

    def ask(self, workers: Iterable[Worker], timed_out: Iterable[int] = (),
            mismatched: Mapping[int, str] | None = None) -> asyncio.Task[Culprit | None]:
        """This attempt's query of every worker, started by the first to ask; the others share it.

        Askers: a watchdog expiry, a worker's collective timeout (`timed_out`: its rank), a worker's death of a
        collective mismatch (`mismatched`: its rank and its error), another node's hang query. No worker is
        signalled for it.
        """
        if self._query is None:
            work = self.culprit(list(workers), timed_out=frozenset(timed_out), mismatched=dict(mismatched or {}))
            self._query = asyncio.get_running_loop().create_task(work)
        return self._query

    def asked(self) -> bool:
        """Whether this attempt's records were asked for (a hang here, or another node's query)."""
        return self._query is not None

    async def named(self, workers: Iterable[Worker], timed_out: Iterable[int] = (),
                    mismatched: Mapping[int, str] | None = None) -> Culprit | None:
        """The culprit of this attempt's hang (None: the recorder is off, or the query failed: logged)."""
        try:
            return await asyncio.shield(self.ask(workers, timed_out, mismatched))
        except Exception:  # the hang is still reported, as it was seen
            self.log.exception("hang_culprit_failed")
            return None

    async def settled(self) -> Culprit | None:
        """The culprit once this attempt's query is over, if one was asked for (None: nobody asked)."""
        if self._query is None:
            return None
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.shield(self._query)
        return self.found()

    def found(self) -> Culprit | None:
        """The culprit this attempt's query found, once it is done (None: not asked, not done, or off)."""
        task = self._query
        if task is None or not task.done() or task.cancelled() or task.exception() is not None:
            return None
        return task.result()

    def clear(self) -> None:
        """A new attempt: forget the last one's query."""
        if self._query is not None and not self._query.done():
            self._query.cancel()
        self._query = None

    def close(self) -> None:
        """Remove the sockets' folder."""
        self.clear()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    async def culprit(self, workers: list[Worker], *, timed_out: frozenset[int],
                      mismatched: dict[int, str] | None = None) -> Culprit | None:
        """Ask every worker, analyse, take the local culprits' stacks; None when the recorder is off."""
        if not self.entries:
            return None
        began = time.monotonic()
        records = list(await asyncio.gather(*(self.read(w, timed_out, mismatched or {}) for w in workers)))
        if self.share is not None:
            records = await self.share(records, timeout=SHARE_TIMEOUT_S)
        verdict = analyse(records, time.time_ns())
        by_rank = {w.plan.rank: w for w in workers}
        culprits = [by_rank[r] for r, n in verdict.culprits if n == self.node and r in by_rank]
        stacks, unread = await take_stacks(culprits, records, self.node, self.log) if self.capture else ({}, {})
        if self.capture:
            unread |= {r: f"it runs on node {n}: its stacks are in that node's report"
                       for r, n in verdict.culprits if n != self.node}
        took = time.monotonic() - began
        self.log.warning("hang_culprit", reason=verdict.reason(), finding=verdict.finding.value,
                         culprits=[r for r, _ in verdict.culprits], took_s=round(took, 3),
                         unread={r.rank: r.answer.value for r in records if r.answer is not Answer.ANSWERED})
        return Culprit(verdict, stacks, took, unread)

    def unasked(self, worker: Worker, timed_out: frozenset[int],
                mismatched: Mapping[int, str] | None = None) -> RankRecord | None:
        """The record of a worker that cannot be asked: it died of a mismatch, timed out, exited, or is stopped."""
        rank = worker.plan.rank
        if mismatched and rank in mismatched:
            return RankRecord(rank, self.node, Answer.MISMATCHED, detail=mismatched[rank][:300])
        if rank in timed_out:
            return RankRecord(rank, self.node, Answer.TIMED_OUT, detail="it gave up waiting in a collective")
        if worker.exited.done():
            return RankRecord(rank, self.node, Answer.EXITED, detail="exited before the query")
        if stopped(worker.pid):
            return RankRecord(rank, self.node, Answer.STOPPED, detail="process state T")
        return None

    async def read(self, worker: Worker, timed_out: frozenset[int] = frozenset(),
                   mismatched: Mapping[int, str] | None = None) -> RankRecord:
        """One worker's records, or how it failed to answer (a worker that ended during the query: exited)."""
        rank, path = worker.plan.rank, self.socket(worker.plan.local_rank)
        if (unasked := self.unasked(worker, timed_out, mismatched)) is not None:
            return unasked
        try:
            body, nccl = await asyncio.wait_for(asyncio.gather(query(path), query_nccl(path)), QUERY_TIMEOUT_S)
            body = merge_dumps(body, nccl)
        except (FileNotFoundError, ConnectionRefusedError) as e:
            why = f"no flight-recorder server at {path} ({type(e).__name__}): started cold, or torch not preloaded"
            return self.gone(worker) or RankRecord(rank, self.node, Answer.NO_RECORDER, detail=why)
        except TimeoutError:
            answer = Answer.STOPPED if stopped(worker.pid) else Answer.SILENT
            gone = self.gone(worker) if answer is Answer.SILENT else None
            return gone or RankRecord(rank, self.node, answer, detail=f"no answer within {QUERY_TIMEOUT_S:g} s")
        except NotServed as e:  # torch's handlers are unregistered as its process ends
            return RankRecord(rank, self.node, Answer.EXITING, detail=f"its process is ending: {e}"[:300])
        except (OSError, ValueError) as e:
            return self.gone(worker) or RankRecord(rank, self.node, Answer.SILENT, detail=f"query failed: {e}"[:300])
        keep(Path(worker.plan.log_dir, DUMP_FILE), body)
        return self.answered(rank, body)

    def answered(self, rank: int, body: bytes) -> RankRecord:
        """A rank's records from its dump; a dump with no records at all says its recorder is off."""
        calls = read_dump(body)
        if calls is None:
            why = "its dump has no entries: TORCH_FR_BUFFER_SIZE (or TORCH_NCCL_TRACE_BUFFER_SIZE) is 0 in its env"
            return RankRecord(rank, self.node, Answer.RECORDER_OFF, detail=why)
        return RankRecord(rank, self.node, Answer.ANSWERED, calls)

    def gone(self, worker: Worker) -> RankRecord | None:
        """The record of a worker that ended while it was asked (None: it still runs)."""
        if worker.exited.done():
            return RankRecord(worker.plan.rank, self.node, Answer.EXITED, detail="exited during the query")
        return None


async def take_stacks(culprits: list[Worker], records: Iterable[RankRecord], node: str,
                      log: structlog.typing.FilteringBoundLogger) -> tuple[dict[int, str], dict[int, str]]:
    """The local culprits' stacks by rank (py-spy), and why each of the others has none.

    A rank the records found stopped is never given to py-spy, which cannot read a stopped process: its reason is
    the records', even when the stop that follows a hang (SIGTERM, then SIGCONT) resumed it meanwhile.
    """
    held = {r.rank for r in records if r.answer is Answer.STOPPED and r.node == node}
    held |= {w.plan.rank for w in culprits if stopped(w.pid)}
    readable = [w for w in culprits if w.plan.rank not in held]
    texts = await asyncio.gather(*(capture_stacks(w.pid, log=log) for w in readable))
    stacks = {w.plan.rank: text for w, text in zip(readable, texts, strict=True) if text}
    unread = {w.plan.rank: no_stack(w, stopped_before=w.plan.rank in held)
              for w in culprits if w.plan.rank not in stacks}
    return stacks, unread


def no_stack(worker: Worker, *, stopped_before: bool = False) -> str:
    """Why a culprit's stack could not be read (py-spy's own reason is in agent.jsonl: stacks_unavailable).

    `stopped_before`: it was stopped when its stack was to be read (py-spy was not run on it).
    """
    if stopped_before or stopped(worker.pid):
        return "its process is stopped (state T): py-spy cannot read a stopped process"
    if worker.exited.done():
        return "its process had exited"
    return "py-spy could not read it (see the stacks_unavailable event in agent.jsonl)"


class NotServed(ValueError):
    """The worker's server answered that it has no flight-recorder handler (404): its process is ending."""


def keep(path: Path, body: bytes) -> None:
    """Write one rank's records beside its logs (a full or read-only disk: the analysis has them anyway)."""
    try:
        path.write_bytes(body)
    except OSError as e:
        warn_once("flight_recorder_write_failed", path, e)


def stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP, SIGTSTP, a tracer): state T or t."""
    st = procs.read_stat(pid)
    return st is not None and st.state in ("T", "t")


async def query_nccl(path: str) -> bytes | None:
    """NCCL's recorder (`dump_nccl_trace_json`); None where torch has no NCCL or the query fails.

    (The other handler's answer then says how the worker is.)
    """
    try:
        return await query(path, HANDLERS[1])
    except (OSError, ValueError):
        return None


async def query(path: str, handler: str = HANDLERS[0]) -> bytes:
    """The body of torch's worker server's `handler` answer at `path` (ValueError: not a 200 answer)."""
    if not path:
        raise FileNotFoundError("no socket")
    reader, writer = await asyncio.open_unix_connection(path)
    try:
        writer.write(f"POST /handler/{handler} HTTP/1.1\r\nHost: runner\r\nContent-Length: 0\r\n"
                     "Connection: close\r\n\r\n".encode())
        await writer.drain()
        data = bytearray()
        while len(data) <= MAX_DUMP_BYTES:
            more = await reader.read(1 << 20)
            if not more:
                break
            data += more
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    if len(status) >= 2 and status[1] == b"404":
        raise NotServed(body[:120].decode(errors="replace"))
    if len(status) < 2 or status[1] != b"200":
        raise ValueError(f"answer {head[:80]!r}")
    return body
