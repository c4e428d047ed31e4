"""The chaos soak on simulated hosts whose nodes host the etcd (`bench/chaos.py --hosts --hosted --hosted-members 3`,
bench/soak/hosts.py): the rendezvous grows to three members on n0, n1 and n2, and host_loss, link_cut and kill_agent
hit any node, the hosting node n0 and the other member hosts included (issue 38).

A short seeded soak, four nodes (a free one replaces a lost member), `--single-member-faults` (every fault that may
take a member waits for three voting members, all up: under CI's load the growth window and a double fault made
seed 3 end its job as a documented loss, a timing the long soak covers): the verdict passes, each class fired, and at least one fault took away a voting member while the
others kept a quorum, a loss the job survived (`member_loss_survived` held); after the job no etcd process nor data
folder is left on any host (`no_etcd_left` held). About 60 s; marked `soak` and in the soaks' xdist group, as
tests/soak/test_soak_hosts.py. Skipped, with the reason, where simulated hosts cannot be made (runner.testing.hosts.why_not());
under CI=true that fails instead (tests/ci_skips.py).

It fails when the product loses what three members promise: with `hosted_members: 1` in the soak's spec while the
soak judges three members, the run failed (on `fenced`: the only member, cut off, kept its lease on its own etcd);
`member_loss_survived` is seen failing on its own in tests/soak/test_chaos_invariants.py.

A failure that is a runner bug the soak found and not yet fixed (KNOWN_BUGS, matched on the soak's output) is
reported as xfail with the bug's description, as tests/soak/test_soak_hosts.py does; any other failure fails the test.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from ci_skips import need
from soak_helpers import passed, row, run_chaos

from runner.testing.hosts import why_not

SEED = 3
# Seconds of faults, and 250 steps so that the job outlasts them: the cluster grows to 3 voting members in about 10 s,
# and again after each member lost; most faults wait for it (30 s and 150 steps: under CI's load link_cut never found
# its three members up before the job trained, 2026-11-28).
WINDOW_S = 45
CLASSES = ("host_loss", "link_cut", "kill_agent")

# Runner bugs the soak found that are still open, by description: matched on the soak's output, reported as xfail.
# Seed 14's (a restarted first node hosted alone) and seed 3's under CI (a node started again under its name while its
# predecessor's lease still ran: the others saw no loss) are fixed; none is open.
KNOWN_BUGS: dict[str, Callable[[str], bool]] = {}


@pytest.mark.integration
@pytest.mark.soak
@pytest.mark.xdist_group("soak")  # one soak at a time (tests/soak/test_chaos.py)
@pytest.mark.timeout(420)
def test_a_seeded_soak_whose_nodes_host_three_members_survives_a_member_hosts_loss(tmp_path: Path) -> None:
    need(why_not())
    out = run_chaos(["--hosts", "--hosted", "--hosted-members", "3", "--single-member-faults",
                     "--seed", str(SEED), "--duration", str(WINDOW_S),
                     "--job-window", str(WINDOW_S), "--failure-every", "3", "--steps", "250", "--nodes", "4",
                     "--classes", ",".join(CLASSES)], tmp_path, timeout=330, teardown=60)
    passed(out, f"seed {SEED} on hosts, hosted", KNOWN_BUGS)
    assert "hosting the etcd (hosted_members 3)" in out
    for cls in CLASSES:  # columns: class, drawn, injected, survived, no target, note
        assert int(row(out, cls)[2]) >= 1, row(out, cls)
    assert int(row(out, "member_loss_survived")[1]) >= 1, row(out, "member_loss_survived")  # invariant, held, ...
    assert int(row(out, "no_etcd_left")[1]) >= 1, row(out, "no_etcd_left")
