"""`runner convert -- torchrun ...`: round trips (the printed YAML loads as a spec with the right fields),
and unknown or unusable options give a clear message, exit 2, no traceback."""

from __future__ import annotations

import shlex
import subprocess
import sys
from typing import Any

import pytest

from runner.config import load_spec_text
from runner.config.spec import JobSpec
from runner.config.torchrun import to_yaml

CASES: list[tuple[str, dict[str, Any]]] = [
    ("torchrun --standalone --nproc-per-node=2 train.py --epochs 3",
     {"name": "train", "entrypoint.script": "train.py", "entrypoint.args": ("--epochs", "3"),
      "nproc_per_node": 2, "rendezvous.backend": "local", "restart.max_restarts": 0}),
    ("torchrun --nproc_per_node 8 -m pkg.train --lr 0.1",
     {"name": "pkg.train", "entrypoint.module": "pkg.train", "entrypoint.args": ("--lr", "0.1"), "nproc_per_node": 8}),
    (("torchrun --nnodes=4 --nproc-per-node=8 --rdzv-backend=etcd-v2 --rdzv-endpoint=etcd1:2379 --rdzv-id=exp7 "
      "--max-restarts=3 train.py"),
     {"name": "exp7", "nodes.min": 4, "nodes.max": 4, "rendezvous.backend": "etcd",
      "rendezvous.endpoints": ("etcd1:2379",), "restart.max_restarts": 3}),
    (("torchrun --nnodes 2:4 --rdzv_backend c10d --rdzv_endpoint head:29400 --rdzv_conf join_timeout=120,"
      "last_call_timeout=5 train.py"),
     {"nodes.min": 2, "nodes.max": 4, "rendezvous.backend": "etcd", "rendezvous.endpoints": ("head:2379",),
      "rendezvous.join_timeout": 120.0, "rendezvous.last_call": 5.0}),
    ("torchrun --no-python --nproc-per-node 2 bash run.sh fast",
     {"entrypoint.command": ("bash", "run.sh", "fast"), "entrypoint.script": None}),
    ("torchrun --redirects 3 --log-dir /var/log/job train.py", {"logs.tee": False, "logs.dir": "/var/log/job"}),
    ("torchrun --redirects 3 --tee 3 train.py", {"logs.tee": True}),
    ("python -m torch.distributed.run --nproc-per-node=2 --monitor-interval=1 --node-rank=0 train.py",
     {"nproc_per_node": 2, "name": "train"}),
    ("/opt/bin/torchrun --standalone train.py -- --flag", {"entrypoint.args": ("--", "--flag")}),
]


def field(spec: JobSpec, dotted: str) -> Any:
    """spec.a.b for 'a.b'."""
    value: Any = spec
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


@pytest.mark.parametrize(("command", "expected"), CASES, ids=[c[0][:60] for c in CASES])
def test_round_trip(command: str, expected: dict[str, Any]) -> None:
    """The YAML printed for a torchrun command line loads with the spec loader and has the expected fields."""
    spec = load_spec_text(to_yaml(shlex.split(command)), base_dir="/w", environ={})
    for dotted, value in expected.items():
        assert field(spec, dotted) == value, dotted


def test_notes_explain_what_has_no_equivalent() -> None:
    """Options the runner does without are listed as comments, not silently dropped."""
    text = to_yaml(shlex.split("torchrun --nnodes 2 --rdzv-backend c10d --monitor-interval 5 --master-port 1 t.py"))
    assert "# note: rdzv-backend c10d has no runner equivalent" in text
    assert "# note: --monitor-interval:" in text and "# note: --master-port:" in text


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m runner convert ARGS`."""
    return subprocess.run([sys.executable, "-m", "runner", "convert", *args],
                          capture_output=True, text=True, check=False)


def test_cli_prints_yaml_that_loads() -> None:
    """The real command prints the spec on stdout and exits 0."""
    done = cli("--", "torchrun", "--nproc-per-node", "2", "train.py")
    assert done.returncode == 0, done.stderr
    assert load_spec_text(done.stdout, environ={}).nproc_per_node == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--", "torchrun", "--bogus-flag", "1", "train.py"], "unknown torchrun option --bogus-flag"),
        (["--", "torchrun", "--nproc-per-node", "gpu", "train.py"], "--nproc-per-node gpu"),
        (["--", "torchrun", "--nnodes", "a:b", "train.py"], "--nnodes a:b"),
        (["--", "torchrun", "--standalone"], "no training script"),
        (["--", "torchrun", "--max-restarts"], "needs a value"),
        ([], "no torchrun command line"),
    ],
)
def test_bad_command_lines_exit_2_with_a_message(argv: list[str], message: str) -> None:
    """A clear one-line error and a fix on stderr, exit code 2, never a traceback."""
    done = cli(*argv)
    assert done.returncode == 2
    assert message in done.stderr and "runner: fix:" in done.stderr
    assert "Traceback" not in done.stderr
