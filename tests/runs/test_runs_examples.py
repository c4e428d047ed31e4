"""Runs of the examples leave no trace: the elastic example checkpoints inside its run dir (or where CKPT says),
and a new run starts fresh unless told to resume (RESUME=1)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import EXAMPLES
from multinode_helpers import Cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def source_tree_files() -> set[str]:
    """Every file under examples/ that git does not ignore (tracked or not)."""
    out = subprocess.run(["git", "ls-files", "--others", "--cached", "--exclude-standard", "examples"],
                         cwd=EXAMPLES.parents[1], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def two_nodes(nodes: Cluster, tag: str, **env: str) -> str:
    """Run examples/jobs/elastic.yaml on nodes a and b (both must succeed); their output."""
    nodes.env.update(ETCD=nodes.endpoint, STEPS="40", LAST_CALL="1s", JOB_NAME=f"el-{tag}", **env)
    started = [nodes.start(f"{tag}a", on="a"), nodes.start(f"{tag}b", on="b")]
    codes = {n.name: n.wait() for n in started}
    out = "".join(n.output() for n in started)
    assert set(codes.values()) == {0}, out
    return out


def test_elastic_example_checkpoints_in_its_run_dir_and_starts_fresh(request: pytest.FixtureRequest,
                                                                      tmp_path: Path) -> None:
    nodes: Cluster = request.getfixturevalue("cluster")
    nodes.spec = EXAMPLES / "elastic.yaml"
    before = source_tree_files()
    out = two_nodes(nodes, "x")
    assert "rank 0/2: resuming at step 0" in out and "done: 40 steps" in out, out
    checkpoints = [c for c in (nodes.tmp / "nodes").glob("*/runner-logs/el-x/*/elastic-checkpoint.pt")
                   if not c.parent.is_symlink()]
    assert len(checkpoints) == 1, checkpoints  # rank 0's node, inside its run dir
    assert source_tree_files() == before  # nothing written beside the example
    shared = tmp_path / "shared.pt"
    shutil.copy(checkpoints[0], shared)
    out = two_nodes(nodes, "y", CKPT=str(shared))
    assert "rank 0/2: resuming at step 0" in out, out  # a finished run's checkpoint is not resumed by default
    out = two_nodes(nodes, "z", CKPT=str(shared), RESUME="1")
    assert "rank 0/2: resuming at step 40" in out and "rank 1/2: resuming at step 40" in out, out
