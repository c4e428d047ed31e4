"""The part of aetcd the etcd rendezvous relies on: its public `aetcd.rpc` module (etcd's protos and gRPC stubs).

If an aetcd upgrade breaks this, the failure says which name or field went missing and what to do, instead of the
rendezvous failing at run time on a cluster.
"""

from __future__ import annotations

import ast
import asyncio
import re
from importlib import metadata
from pathlib import Path

import pytest
from aetcd import rpc

from runner.rendezvous.etcd.client import RPC_SURFACE

ROOT = Path(__file__).resolve().parents[2]
ETCD_PACKAGE = ROOT / "runner" / "rendezvous"
ADVICE = ("aetcd {version} changed the public surface runner/rendezvous/etcd relies on: {problem}. Keep aetcd in "
          "the range pinned in pyproject.toml, or adapt runner/rendezvous/etcd/client.py and RPC_SURFACE.")


def pinned_range() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(lowest, first excluded) aetcd versions from pyproject.toml's dependencies."""
    text = (ROOT / "pyproject.toml").read_text()
    found = re.search(r'"aetcd>=([\d.]+),<([\d.]+)"', text)
    assert found, 'pyproject.toml must pin aetcd as a range: "aetcd>=X,<Y"'
    return version_tuple(found.group(1)), version_tuple(found.group(2))


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def test_installed_aetcd_is_in_the_pinned_range() -> None:
    """The aetcd installed is one this surface was tested with."""
    installed = metadata.version("aetcd")
    low, high = pinned_range()
    assert low <= version_tuple(installed) < high, (
        f"aetcd {installed} is outside the tested range >={low},<{high} pinned in pyproject.toml")


@pytest.mark.parametrize("name", sorted(RPC_SURFACE))
def test_rpc_names_and_fields_exist(name: str) -> None:
    """Every stub, function and message we use is in aetcd.rpc, with every field we read or set."""
    version = metadata.version("aetcd")
    assert hasattr(rpc, name), ADVICE.format(version=version, problem=f"aetcd.rpc.{name} is gone")
    fields = RPC_SURFACE[name]
    if fields:
        declared = {f.name for f in getattr(rpc, name).DESCRIPTOR.fields}
        missing = sorted(set(fields) - declared)
        assert not missing, ADVICE.format(version=version, problem=f"aetcd.rpc.{name} lacks field(s) {missing}")


def test_enum_values_we_use_exist() -> None:
    """Comparison targets/results, range sorting and event kinds keep their names."""
    version = metadata.version("aetcd")
    for owner, names in ((rpc.Compare, ("EQUAL", "CREATE", "MOD", "VALUE")),
                         (rpc.RangeRequest, ("ASCEND", "CREATE")), (rpc.Event, ("PUT", "DELETE"))):
        for enum_name in names:
            assert hasattr(owner, enum_name), ADVICE.format(
                version=version, problem=f"{owner.__name__}.{enum_name} is gone")


def test_stubs_have_the_methods_we_call() -> None:
    """KV, Lease, Watch and Auth stubs expose the RPCs the client calls (built on a channel that never dials)."""
    async def check() -> None:
        channel = rpc.insecure_channel("127.0.0.1:1")  # never dialled: stubs only bind method names
        try:
            for stub, methods in ((rpc.KVStub, ("Range", "Put", "DeleteRange", "Txn")),
                                  (rpc.LeaseStub, ("LeaseGrant", "LeaseKeepAlive", "LeaseRevoke")),
                                  (rpc.WatchStub, ("Watch",)), (rpc.AuthStub, ("Authenticate",))):
                made = stub(channel)
                for method in methods:
                    assert hasattr(made, method), f"{stub.__name__}.{method} is gone from aetcd.rpc"
        finally:
            await channel.close()
    asyncio.run(check())


def imported_aetcd_names() -> set[str]:
    """Every `aetcd...` module or name imported by runner/rendezvous."""
    names: set[str] = set()
    for path in ETCD_PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("aetcd"):
                names.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names if a.name.startswith("aetcd"))
    return names


def test_only_the_public_rpc_module_is_imported() -> None:
    """runner/rendezvous imports nothing of aetcd but `aetcd.rpc`, and no private name of any module."""
    assert imported_aetcd_names() == {"aetcd.rpc"}, imported_aetcd_names()
    for path in ETCD_PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in (
                    "rpc", "grpc", "aetcd"):
                assert not node.attr.startswith("_"), f"{path}: private name {node.value.id}.{node.attr}"
