"""EtcdRendezvous across separate processes: a round, and a SIGKILLed node seen as lost via its lease."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rdzv_helpers import Node, make_spec, run

from runner.events import PeerLost
from runner.testing.etcd_server import EtcdServer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

NODE_SCRIPT = """
import asyncio, json, sys
sys.path[:0] = [{root!r}, {root!r} + "/tests"]
from rdzv_helpers import Node, make_spec

async def main():
    node = await Node(make_spec({endpoint!r}), {name!r}).open()
    res = await node.rdzv.next_round(0)
    print(json.dumps({{"rank": res.group_rank, "nodes": res.nodes, "port": res.master_port}}), flush=True)
    if {hang!r}:
        await asyncio.sleep(3600)
    await node.rdzv.close("succeeded")

asyncio.run(main())
"""


def spawn(endpoint: str, name: str, *, hang: bool = False) -> subprocess.Popen[str]:
    """A node in its own Python process; prints its result as one JSON line."""
    code = NODE_SCRIPT.format(root=str(ROOT), endpoint=endpoint, name=name, hang=hang)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)


def result_line(lines: list[str]) -> dict[str, object]:
    """The JSON result line among a node's stdout lines (structlog writes there too)."""
    return dict(json.loads(next(line for line in reversed(lines) if line.startswith("{"))))


def first_result(proc: subprocess.Popen[str]) -> dict[str, object]:
    """Read a running node's stdout until its JSON result line."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("{"):
            return dict(json.loads(line))
    msg = "node process ended without a result"
    raise AssertionError(msg)


def test_two_processes_form_one_round(etcd: EtcdServer) -> None:
    """Two node processes agree on ranks and master port."""
    procs = [spawn(etcd.endpoint, name) for name in ("p1", "p0")]
    try:
        outs = [result_line(p.communicate(timeout=60)[0].splitlines()) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert [o["rank"] for o in outs] == [1, 0]
    assert outs[0]["nodes"] == ["p0", "p1"] and outs[0]["port"] == outs[1]["port"]


def test_killed_process_is_lost_when_its_lease_expires(etcd: EtcdServer) -> None:
    """SIGKILL one node process mid-run: the other node gets PeerLost once the lease TTL passes."""
    proc = spawn(etcd.endpoint, "victim", hang=True)
    try:
        async def body() -> None:
            node = await Node(make_spec(etcd.endpoint), "survivor").open()
            await node.rdzv.next_round(0)
            line = await asyncio.to_thread(first_result, proc)
            assert line["nodes"] == ["survivor", "victim"]
            proc.kill()
            lost = await node.event(PeerLost)
            assert lost.node == "victim" and "lease" in lost.why
            await node.rdzv.close("failed")
        run(body)
    finally:
        proc.kill()
        proc.wait()
