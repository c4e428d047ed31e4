"""The soak's infrastructure: its etcd (on this machine, or on hosts of its own with --hosts), the network namespace a
node runs in, the logs tmpfs.

Two ways to make a network namespace remain: `Netns` below (one node's namespace on a veth pair, for the `partition`
class of the default mode) and runner/testing/hosts.py's `Lab`, which --hosts uses for every node. The default mode
keeps `Netns` because a `Lab` host is more than a network namespace: its own PID namespace renumbers the node's
workers, which the default mode's pid-based faults and checks read from this machine's /proc; --hosts
(bench/soak/hosts.py) reads them through the host instead. Moving `partition` onto a `Lab` host means running that
mode's worker faults through bench/soak/hosts.py's pid translation: not done yet.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import time
from pathlib import Path

from runner.testing.etcd_cluster import HOST_DATA, EtcdCluster, Member
from runner.testing.etcd_server import EtcdServer


class ChaosEtcd(EtcdServer):
    """runner/testing/etcd_server.py's etcd, also listening on `extra_host` (the veth address a namespaced node
    reaches)."""

    def __init__(self, data_dir: Path, extra_host: str | None) -> None:
        super().__init__(data_dir, extra_client_hosts=(extra_host,) if extra_host else ())
        self.started_at = 0.0  # time.time() of the last start: etcd renews every lease's TTL when it starts
        self.held_down = False  # stopped by a fault until the fault starts it again

    def start(self) -> None:
        """Start etcd (same data, same ports) and note when."""
        super().start()
        self.started_at = time.time()
        self.held_down = False

    def stop(self) -> None:
        """SIGTERM etcd: down until start() (a fault holds it down)."""
        self.held_down = True
        super().stop()

    def exited_unasked(self) -> int | None:
        """etcd's exit status (a negative signal number, as Popen gives it) when it ended and nothing of the soak
        stopped it; None while it runs or stays down on purpose."""
        if self.proc is None or self.held_down or self.proc.poll() is None:
            return None
        return self.proc.returncode

    def wipe(self) -> None:
        """SIGKILL, delete the data dir, start fresh on the same ports."""
        self.kill()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self.start()


class HostEtcd:
    """--hosts: the soak's etcd, a cluster of 1 or 3 members on hosts of their own (runner/testing/etcd_cluster.py).

    What the soak's faults and checks ask of it: whether every member runs, a member stopped until the fault starts it
    again (`held`), a member killed and started again, the whole cluster wiped, and an exit no fault caused. With 3
    members a fault hits the leader (etcd's own status), so the cluster elects another; with 1, the only member.
    """

    def __init__(self, cluster: EtcdCluster) -> None:
        self.cluster = cluster
        self.started_at = 0.0  # time.time() of the last start, stop or kill: a new leader renews every lease's TTL
        self.held: set[str] = set()  # members a fault stopped, until it starts them again

    @property
    def endpoint(self) -> str:
        """Every member's client endpoint, comma-separated (the spec lists them all)."""
        return ",".join(self.cluster.endpoints)

    @property
    def up(self) -> bool:
        """Every member runs."""
        return all(m.up for m in self.cluster.members)

    @property
    def readable(self) -> bool:
        """A quorum of members runs (the keys can be read)."""
        return sum(m.up for m in self.cluster.members) * 2 > len(self.cluster.members)

    def start_cluster(self) -> None:
        """Start every member and wait until each answers."""
        self.cluster.start()
        self.started_at = time.time()

    def target(self) -> Member:
        """The member a fault hits: the leader of 3, the only one of 1."""
        members = self.cluster.members
        return members[0] if len(members) == 1 else self.cluster.leader()

    def stop(self, m: Member) -> None:
        """SIGTERM one member: down until start() (a fault holds it down)."""
        self.held.add(m.name)
        if m.proc is not None and m.up:
            m.proc.terminate()
            m.proc.wait(timeout=15)
        self.started_at = time.time()

    def start(self) -> None:
        """Start every member that is down again, on its data, and wait until each answers."""
        for m in self.cluster.members:
            if not m.up:
                self.cluster.restart(m)
        self.held.clear()
        self.started_at = time.time()

    def restart(self, m: Member) -> None:
        """SIGKILL one member and start it again at once, on its data."""
        self.cluster.restart(m)
        self.started_at = time.time()

    def wipe(self) -> None:
        """SIGTERM every member, delete every member's data (in its host's /tmp), start a new cluster on the same
        addresses: every key forgotten."""
        self.cluster.restart_empty()
        self.held.clear()
        self.started_at = time.time()

    def exited_unasked(self) -> int | None:
        """The exit status of a member that ended while nothing of the soak stopped it; None if none did."""
        for m in self.cluster.members:
            if m.proc is not None and m.name not in self.held and m.proc.poll() is not None:
                return m.proc.returncode
        return None

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of every member's log, each headed by its last panic line, if any (a Go panic's stack
        would hide it)."""
        out = []
        for m in self.cluster.members:
            with contextlib.suppress(OSError):
                text = (m.host.lab.shared / f".etcd-{m.name}.log").read_text(errors="replace").splitlines()
                panic = next((line for line in reversed(text) if line.startswith("panic:") or '"panic"' in line), "")
                out.append(f"--- etcd member {m.name} ({HOST_DATA} on its host)"
                           + (f"\n{panic[:1000]}\n..." if panic else "") + "\n" + "\n".join(text[-lines:]))
        return "\n".join(out)

    def kill(self) -> None:
        """Kill every member (never raises)."""
        self.cluster.close()


class Netns:
    """A network namespace joined to this one by a veth pair; one node runs in it; `down()` is the partition.

    Host side: <veth>h with 10.213.X.1/30 (stays reachable from this namespace when the link is down: a local
    address); namespace side: <veth>n with 10.213.X.2/30, default route through the host side.
    """

    def __init__(self) -> None:
        tag = os.getpid() % 10_000_000
        self.name, self.vh, self.vn = f"chaos{tag}", f"chv{tag}h", f"chv{tag}n"
        used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, timeout=10, check=True).stdout
        start = os.getpid() % 256  # two soaks at once start their search apart
        free = [x for x in (*range(start, 256), *range(start)) if f"10.213.{x}." not in used]
        if not free:
            raise OSError("no free 10.213.X.0/30 subnet")
        self.host_addr, self.ns_addr = f"10.213.{free[0]}.1", f"10.213.{free[0]}.2"
        self.made = False
        self.cut = False

    def _ip(self, *args: str) -> None:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=False)
        if done.returncode:
            raise OSError(f"ip {' '.join(args)}: {done.stderr.strip()}")

    def setup(self) -> None:
        """Create the namespace and the veth pair (root only); raises OSError with the reason."""
        self._ip("netns", "add", self.name)
        self.made = True
        self._ip("link", "add", self.vh, "type", "veth", "peer", "name", self.vn)
        self._ip("link", "set", self.vn, "netns", self.name)
        self._ip("addr", "add", f"{self.host_addr}/30", "dev", self.vh)
        self._ip("link", "set", self.vh, "up")
        self._ip("-n", self.name, "addr", "add", f"{self.ns_addr}/30", "dev", self.vn)
        self._ip("-n", self.name, "link", "set", self.vn, "up")
        self._ip("-n", self.name, "link", "set", "lo", "up")
        self._ip("-n", self.name, "route", "add", "default", "via", self.host_addr)

    def wrap(self, argv: list[str]) -> list[str]:
        """argv run inside the namespace (nsenter execs it: the pid stays the one Popen returns)."""
        return ["nsenter", f"--net=/var/run/netns/{self.name}", *argv]

    def down(self) -> None:
        """Partition: the host side of the link goes down (the namespace's packets go nowhere)."""
        self._ip("link", "set", self.vh, "down")
        self.cut = True

    def up(self) -> None:
        """Heal the partition."""
        self._ip("link", "set", self.vh, "up")
        self.cut = False

    def teardown(self) -> None:
        """Delete the pair and the namespace (never raises)."""
        if not self.made:
            return
        for args in (("link", "del", self.vh), ("netns", "del", self.name)):
            with contextlib.suppress(OSError):
                self._ip(*args)
        self.made = False


def mount_tmpfs(path: Path, mib: int) -> str | None:
    """Mount a tmpfs of `mib` MiB at `path`; None, or why it could not."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m,mode=0755", "chaos-logs", str(path)],
                              capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None if done.returncode == 0 else (done.stderr.strip() or f"mount exited {done.returncode}")


def umount(path: Path) -> None:
    """Unmount (lazily if busy); never raises."""
    for args in (["umount", str(path)], ["umount", "-l", str(path)]):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            if subprocess.run(args, capture_output=True, timeout=20, check=False).returncode == 0:
                return


def fill(folder: Path) -> int:
    """Write one file into `folder` until its file system is full; the bytes written."""
    path, size = folder / ".chaos-filler", 0
    chunk = b"\0" * (1 << 20)
    with path.open("wb", buffering=0) as f:
        for piece in (chunk, chunk[:4096]):
            while True:
                try:
                    size += f.write(piece)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
    return size
