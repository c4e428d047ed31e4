"""Replica groups on several nodes with the job's own hosted etcd: refused, whatever `hosted_members` says, naming
the fix (an etcd outside the job). The groups' seats and rendezvous run on an etcd the agent only connects to: no
node would host it (a first try, with three members, saw every node wait for an etcd nobody started, then exit 3),
and the members grow by the job's rounds, which groups of one node never form. Accepting the field would ignore it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import EXAMPLES, runner_cli
from hosted_helpers import HOSTED_PORT

STEPS = 300


def spec(members: int = 3, count: int = 3) -> str:
    """`count` groups of one node and one worker each; the rendezvous hosted by a, over `members` members."""
    return f"""
version: 1
name: fthosted
entrypoint:
  script: "{EXAMPLES / 'ft_train.py'}"
  args: ["--steps", "{STEPS}", "--sha-every", "50", "--step-sleep", "0.03", "--quorum-timeout", "5",
         "--global-batch", "36"]
nodes: {count}
rendezvous: {{backend: etcd, hosted: true, hosted_members: {members}, endpoints: ["a:{HOSTED_PORT}"], last_call: 0s,
             lease_ttl: 5s, join_timeout: 90s, connect_timeout: 10s}}
replica_groups: {{count: {count}, nproc_per_node: 1, nodes_per_group: 1, min_active: 1,
                  lighthouse: {{heartbeat_timeout: 1s}}}}
env: {{OMP_NUM_THREADS: "1"}}
restart: {{max_restarts: 3, backoff: {{initial: 0s}}}}
shutdown: {{grace_period: 5s}}
logs: {{dir: "${{LOGS}}", format: json}}
"""


def refusal(tmp_path: Path, text: str) -> tuple[int, str]:
    """`runner validate` on `text`: exit code and stderr."""
    path = tmp_path / "job.yaml"
    path.write_text(text)
    done = runner_cli("validate", str(path), env={**os.environ, "LOGS": str(tmp_path / "logs")})
    return done.returncode, done.stderr


@pytest.mark.parametrize(("members", "count"), [(1, 3), (3, 3), (5, 5), (3, 2)])
def test_a_hosted_etcd_is_refused_with_groups_on_several_nodes_naming_the_fix(tmp_path: Path, members: int,
                                                                              count: int) -> None:
    code, err = refusal(tmp_path, spec(members, count))
    assert code == 2 and "outlives any one node" in err and "whatever rendezvous.hosted_members says" in err, err
    assert "set rendezvous.hosted: false" in err and "Traceback" not in err, err
