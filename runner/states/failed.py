"""FAILED: class the root cause on the evidence, keep it, then fire `decide`.

The restart policy's guarded edges (runner/core/machine.py,
runner/core/restart_policy.py) choose retry, give_up or non_retryable.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from runner.core.machine import Step, Trigger
from runner.core.restart_policy import as_counted, gather
from runner.diagnosis import oom
from runner.outcomes import FailureClass, FailureKind
from runner.rendezvous.node_ledger import Mark
from runner.rundir.layout import RunDir
from runner.system.private_files import write_private

if TYPE_CHECKING:
    from runner.core.context import Context
    from runner.diagnosis.failure import Failure
    from runner.hangs import Verdict


async def handle(ctx: Context) -> Step:
    """Record the failure (nothing is lost); the policy decides what follows."""
    assert ctx.run.failure is not None  # every edge into FAILED sets it
    failure = ctx.run.failure = await with_culprit(ctx, with_evidence(ctx, ctx.run.failure))
    ctx.run.kept_out = kept_out(ctx, failure.hang)
    if (mark := own_mark(ctx, failure)) is not None:
        await ctx.rendezvous.note_node(mark)  # the node ledger (bounded; a warning when it cannot be written)
    ctx.run.failures.append(failure)
    save(ctx, failure)
    ctx.log.error("failure", **{k: v for k, v in failure.to_dict().items() if k not in ("traceback", "stacks")})
    await gather(ctx)  # the restart charge, if the policy needs it: the guards of `decide` only read
    if (counted := as_counted(ctx)) is not failure:  # a peer's failure, in the class the round was charged as
        ctx.run.failure = ctx.run.failures[-1] = counted
        save(ctx, counted)
        ctx.log.info("failure_classed", **{"class": counted.failure_class.value, "evidence": counted.evidence})
    return Step(Trigger.decide)


async def with_culprit(ctx: Context, failure: Failure) -> Failure:
    """A failure seen here while this node answered another node's hang query carries the culprit it found."""
    if failure.hang is not None or ctx.recorder is None:
        return failure
    found = await ctx.recorder.settled()  # bounded by the query's own bounds
    return replace(failure, hang=found.verdict) if found is not None and found.verdict.named else failure


def own_mark(ctx: Context, failure: Failure) -> Mark | None:
    """The node ledger's mark when the failure is this node's own: a worker of it failed, or it held up a hang.

    A hang with a culprit named elsewhere, a lost peer or a rendezvous timeout is not this node's doing: None.
    """
    verdict = failure.hang
    if verdict is not None and verdict.named and not verdict.died:  # a mismatch that aborts is the program's
        mine = ctx.inputs.node in {n for _, n in verdict.culprits}
        return Mark(time.time(), FailureClass.HANG.value, verdict.reason(), culprit=True) if mine else None
    if failure.kind in (FailureKind.WORKER, FailureKind.WATCHDOG):
        return Mark(time.time(), failure.failure_class.value, failure.reason)
    return None


def kept_out(ctx: Context, verdict: Verdict | None) -> str:
    """Why this node sits out the next round ('' when it does not): every culprit of the hang is on it.

    Only when watchdog.keep_out_culprit is on and the round's other nodes still make nodes.min; otherwise the
    node stays in, and says why.
    """
    if not ctx.spec.watchdog.keep_out_culprit or verdict is None or not verdict.named or verdict.died:
        return ""  # a mismatch that aborts is the program's, not the machine's
    node = ctx.inputs.node
    if {n for _, n in verdict.culprits} != {node}:
        return ""
    members = len(ctx.run.result.nodes) if ctx.run.result is not None else 1
    if members - 1 < ctx.spec.nodes.min:
        # A round of one node has no other to go on without it, and a job of a fixed size (nodes.min == nodes.max)
        # can never go on without one: that only restates the job's shape, so it is kept in agent.jsonl (info,
        # hidden on the console) rather than warned about after every hang. An elastic job that shrank to its
        # minimum is worth the warning: the node would sit out if nodes.min allowed it.
        say = ctx.log.warning if members > 1 and ctx.spec.nodes.min < ctx.spec.nodes.max else ctx.log.info
        say("culprit_kept_in", reason=f"without this node the round would have {members - 1} node(s), "
            f"fewer than nodes.min {ctx.spec.nodes.min}")
        return ""
    return f"kept out of the next round: this node held up the hang of attempt {ctx.run.attempt} ({verdict.reason()})"


def with_evidence(ctx: Context, failure: Failure) -> Failure:
    """`failure` classed `oom` when the failed worker's cgroup or the kernel log shows the OOM killer at work.

    The worker is still unreaped here (its cgroup and /proc entry remain until the group is stopped); the diagnosis
    reads the evidence (runner.diagnosis.oom `classed`).
    """
    if failure.kind is not FailureKind.WORKER or ctx.run.group is None or failure.local_rank is None:
        return failure
    worker = ctx.run.group.workers.get(failure.local_rank)
    if worker is None or worker.plan.rank != failure.rank:
        return failure
    return oom.classed(failure, worker.pid, worker.cgroup)


def save(ctx: Context, failure: Failure) -> None:
    """Write the failure next to the attempt's logs: <run dir>/attempt_<k>/failure.json (a warning if it can't)."""
    path = RunDir(ctx.inputs.run_dir).failure(failure.attempt)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_private(path, failure.record().to_json())
    except OSError as e:
        ctx.warnings.warn("failure_write_failed", path=str(path), error=str(e))
