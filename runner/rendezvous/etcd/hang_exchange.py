"""A hang's records from every node of the round, through etcd (docs/hangs.md).

The node that finds a hang writes the round's `hang` key (an annex of the control key: every member's news watch
carries it, runner/rendezvous/etcd/monitor.py turns it into a HangQuery event), then its own answer. Every member
that hears it reads its own workers' flight recorders and writes its answer under `rounds/<r>/hang/<node>`. Each
of them then reads the answers until every member of the round answered, or the bound passes: a node that did not
answer is shown as such (its ranks `silent`), and the analysis goes on with what came. Every node analyses the
same answers, so every node names the same culprit. Answers are bounded (runner.hangs.to_wire) and read back
validated (runner.hangs.from_wire).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from runner.errors import RendezvousError
from runner.hangs import Answer, RankRecord, from_wire, to_wire
from runner.rendezvous.etcd.client import EtcdSession, absent, prefix_range, put_op
from runner.rendezvous.etcd.keys import JobKeys, dump, load

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

    from runner.rendezvous.base import RendezvousResult

POLL_S = 0.1
MAX_ANSWER_BYTES = 1 << 20  # one node's answer (etcd's default request limit is 1.5 MiB)


async def share(session: EtcdSession, keys: JobKeys, result: RendezvousResult, local: list[RankRecord], *,
                timeout: float, log: FilteringBoundLogger) -> list[RankRecord]:
    """Ask every member (once per round), give this node's records, and return every member's within `timeout`.

    etcd unreachable: this node's records alone (logged); never raises for etcd, never waits past `timeout`.
    """
    r, me = result.round, result.node
    answer = dump(to_wire(local))
    if len(answer) > MAX_ANSWER_BYTES:
        answer = dump(to_wire([RankRecord(x.rank, x.node, x.answer, x.calls[-8:], x.detail) for x in local]))
    ask, mine = keys.hang(r), keys.hang_answer(r, me)
    answers: dict[str, list[RankRecord]] = {me: local}
    try:
        async with asyncio.timeout(timeout):
            await session.call(lambda c: c.txn([absent(ask)], [put_op(ask, dump({"by": me})), put_op(mine, answer)],
                                               [put_op(mine, answer)]), budget=timeout)
            while not all(n in answers for n in result.nodes):
                _, (kvs,) = await session.call(lambda c: c.snapshot([prefix_range(keys.hang_answers(r))]),
                                               budget=timeout)
                for kv in kvs:
                    node = JobKeys.leaf(kv.key)
                    if node in result.nodes and node != me and len(kv.value) <= MAX_ANSWER_BYTES:
                        answers[node] = [x for x in from_wire(load(kv.value)) if x.node == node]
                if not all(n in answers for n in result.nodes):
                    await asyncio.sleep(POLL_S)
    except (TimeoutError, RendezvousError) as e:
        log.warning("hang_answers_incomplete", round=r, answered=sorted(answers),
                    error=str(e) or f"not every node answered within {timeout:g} s")
    return [x for n in result.nodes for x in answers.get(n, silent(result, n))]


def silent(result: RendezvousResult, node: str) -> list[RankRecord]:
    """The ranks of a member that did not answer (ranks are group rank * nproc_per_node + local rank)."""
    k = result.nodes.index(node)
    return [RankRecord(k * result.nproc_per_node + i, node, Answer.SILENT, detail="its node did not answer")
            for i in range(result.nproc_per_node)]
