"""Simulated hosts on one Linux machine, for tests and benchmarks of what crosses machines (the runner never uses it).

A `Lab` is a bridge; each `Host` on it has, like a machine of its own:
- its own network namespace, joined to the bridge by a veth pair, with its own address (10.215.N.K/24) and its own
  loopback (no host reaches another's 127.0.0.1);
- its own hostname (a UTS namespace) and an /etc/hosts naming every host of the lab (bind-mounted, rewritten in place
  when a host is added, so every host sees every name);
- its own /tmp (a tmpfs in a mount namespace of its own) and its own per-user state ($XDG_STATE_HOME in that /tmp);
  the lab's shared folder (a test's tmp_path: the "shared file system" of a cluster) is mounted back at its path;
- its own processes: a PID namespace whose init (a small reaper) is PID 1, with /proc mounted anew, so a process in
  the host sees only that host's processes. `lose()` kills that init: the kernel kills every process of the host at
  once, as a machine that loses power. `cut()` takes its link down (a partition: it reaches nobody and nobody reaches
  it); `heal()` brings it back.

Everything runs as root (`ip netns`, `unshare`, `nsenter`, `mount`); `why_not()` says why a lab cannot be built here,
for a skip with the reason. `Lab.close()` kills every host and deletes the namespaces, the veths and the bridge, on
every ending.
"""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Self

SETUP_TIMEOUT_S = 20.0
HOST_TMP = "/tmp"  # noqa: S108 - each host's own tmpfs, never this machine's /tmp
HOST_STATE = "/tmp/xdg-state"  # noqa: S108 - the same
NSPID = "NSpid:"
# PID 1 of a host: reaps every orphan (as init does) and ends on SIGTERM; SIGKILL from outside ends the host.
REAPER = ("import os, signal\n"
          "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})\n"
          "signal.signal(signal.SIGTERM, lambda *_: os._exit(0))\n"
          "print('ready', flush=True)\n"
          "while True:\n"
          "    try:\n"
          "        while os.waitpid(-1, os.WNOHANG)[0]:\n"
          "            pass\n"
          "    except ChildProcessError:\n"
          "        pass\n"
          "    signal.sigtimedwait({signal.SIGCHLD}, 1.0)\n")


def why_not() -> str | None:
    """None where simulated hosts can be built here, else why not (for pytest.skip)."""
    if os.geteuid() != 0:
        return "simulated hosts need root (network, UTS, mount and PID namespaces)"
    for tool in ("ip", "nsenter", "unshare", "mount"):
        if not any((Path(d) / tool).exists() for d in os.environ.get("PATH", "/usr/sbin:/usr/bin").split(":")):
            return f"simulated hosts need the `{tool}` command"
    probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "--pid", "--fork", "true"],
                           capture_output=True, text=True, timeout=20, check=False)
    if probe.returncode:
        return f"namespaces cannot be created here: {probe.stderr.strip() or probe.returncode}"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=False)
    if check and done.returncode:
        msg = f"ip {' '.join(args)}: {done.stderr.strip()}"
        raise OSError(msg)
    return done


def _free_subnet() -> int:
    """N of a 10.215.N.0/24 no interface of this machine uses (two labs at once, e.g. two sessions, keep apart)."""
    used = _ip("-o", "-4", "addr").stdout
    start = os.getpid() % 250 + 1
    candidates: list[int] = [*range(start, 251), *range(1, start)]
    for n in candidates:
        if f"10.215.{n}." not in used:
            return n
    msg = "no free 10.215.N.0/24 subnet for simulated hosts"
    raise OSError(msg)


class HostProcess(subprocess.Popen[bytes]):
    """A command started on a host: nsenter's Popen (its exit status is the command's), signals to the command.

    nsenter forks to enter a PID namespace and forwards no signal: `send_signal` (so `kill` and `terminate`) reaches
    the command itself, nsenter's one child.
    """

    def inner_pid(self, timeout: float = SETUP_TIMEOUT_S) -> int:
        """The command's pid here (the root PID namespace): nsenter's one child; 0 once it is gone."""
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                kids = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
                if kids:
                    return int(kids[0])
            if time.monotonic() > deadline:
                break
            time.sleep(0.005)
        return 0

    def send_signal(self, sig: int) -> None:
        """Signal the command (through a pidfd of nsenter's child, never a pid that could be recycled).

        SIGCONT also continues nsenter: it stops itself while its child is stopped, and would wait stopped for ever.
        """
        if sig == signal.SIGCONT and self.poll() is None:
            with contextlib.suppress(OSError):
                subprocess.Popen.send_signal(self, sig)
        pid = self.inner_pid()
        if not pid:
            return
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return
        try:
            if self.inner_pid(0) == pid:  # still nsenter's child once the pidfd is held: it is the command
                signal.pidfd_send_signal(fd, sig)
        except OSError:
            pass
        finally:
            os.close(fd)


@dataclass
class Host:
    """One simulated machine of a `Lab`: see the module's docstring."""

    lab: Lab
    name: str
    ip: str
    netns: str
    veth: str  # the bridge's end of the link
    init: subprocess.Popen[bytes] | None = None
    init_pid: int = 0  # the host's PID 1, as this (the root) PID namespace numbers it
    lost: bool = False
    cut_off: bool = False
    procs: list[HostProcess] = field(default_factory=list)

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The environment a process of this host starts with: this one's, with the host's own state folder."""
        base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RUNNER_NODE", "XDG_"))}
        return {**base, "XDG_STATE_HOME": HOST_STATE, "TMPDIR": HOST_TMP, "HOSTNAME": self.name, **(extra or {})}

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` run inside the host: its network, hostname, mounts and processes (nsenter forks it there)."""
        assert self.init_pid, f"host {self.name} is not started"
        return ["nsenter", f"--target={self.init_pid}", "--net", "--uts", "--mount", "--pid", "--", *argv]

    def popen(self, argv: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
              stdout: IO[bytes] | int | None = None, stderr: IO[bytes] | int | None = None,
              stdin: int | None = subprocess.DEVNULL) -> HostProcess:
        """Start `argv` on this host; the Popen is nsenter's (its exit code is the command's; signals reach it)."""
        inner = argv if cwd is None else ["sh", "-c", 'cd "$0" && exec "$@"', str(cwd), *argv]
        proc = HostProcess(self.wrap(inner), env=env or self.env(), stdout=stdout, stderr=stderr, stdin=stdin)
        self.procs.append(proc)
        return proc

    def run(self, argv: list[str], *, timeout: float = 60.0, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run `argv` on this host to its end; its output as text.

        Bytes that are no UTF-8 (etcd's binary keys read by a stranger) are replaced: the caller's assertion on the
        output decides, never a decoding error.
        """
        inner = argv if cwd is None else ["sh", "-c", 'cd "$0" && exec "$@"', str(cwd), *argv]
        return subprocess.run(self.wrap(inner), env=env or self.env(), capture_output=True, text=True,
                              errors="replace", timeout=timeout, check=False)

    def pids(self) -> dict[int, int]:
        """Every live process of this host: its pid inside the host -> its pid here (the root PID namespace)."""
        if self.lost or not self.init_pid:
            return {}
        try:
            mine = os.readlink(f"/proc/{self.init_pid}/ns/pid")
        except OSError:
            return {}
        found: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.readlink(entry / "ns" / "pid") != mine:
                    continue
                status = (entry / "status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith(NSPID) and " Z " not in status.split("State:", 1)[1][:8]:
                    inner = int(line.split()[-1])
                    found[inner] = int(entry.name)
        return found

    def alive(self, pid: int) -> bool:
        """Whether the process that this host numbers `pid` lives (and is no zombie)."""
        return pid in self.pids()

    def kill(self, pid: int, sig: signal.Signals = signal.SIGKILL) -> bool:
        """Signal the process this host numbers `pid` (pidfd, checked to be that host's); False if it is gone."""
        outer = self.pids().get(pid)
        if outer is None:
            return False
        try:
            fd = os.pidfd_open(outer)
        except OSError:
            return False
        try:
            if self.pids().get(pid) != outer:  # recycled between the lookup and the pidfd: not ours
                return False
            signal.pidfd_send_signal(fd, sig)
        except OSError:
            return False
        finally:
            os.close(fd)
        return True

    def lose(self) -> None:
        """The machine is gone: SIGKILL of its PID 1, so the kernel kills every process of the host at once.

        Through a pidfd of the PID 1 found when the host started, checked to be unshare's child still; a host that
        never got a PID 1 (its start failed) loses its unshare only. Never a bare pid: pid 0 would be this process's
        own group (the test run itself).
        """
        if self.init is not None and not self.lost:
            if self.init_pid > 0:
                with contextlib.suppress(OSError):
                    fd = os.pidfd_open(self.init_pid)
                    try:
                        kids = Path(f"/proc/{self.init.pid}/task/{self.init.pid}/children").read_text().split()
                        if str(self.init_pid) in kids:  # still unshare's child: the host's PID 1, not a recycled pid
                            signal.pidfd_send_signal(fd, signal.SIGKILL)
                    finally:
                        os.close(fd)
            if self.init.poll() is None:
                subprocess.Popen.kill(self.init)
            self.init.wait(timeout=30)
        self.lost = True

    def cut(self) -> None:
        """Partition: the host's link to the bridge goes down (its packets reach nobody, nobody reaches it)."""
        _ip("link", "set", self.veth, "down")
        self.cut_off = True

    def heal(self) -> None:
        """The link comes back."""
        _ip("link", "set", self.veth, "up")
        self.cut_off = False

    def close(self) -> None:
        """Lose the host (if not lost yet), reap what was started on it, delete its namespace (never raises)."""
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.lose()
        for proc in self.procs:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                if proc.poll() is None:
                    subprocess.Popen.send_signal(proc, signal.SIGKILL)  # nsenter itself: its host is gone
                proc.wait(timeout=10)
        _ip("link", "del", self.veth, check=False)
        _ip("netns", "del", self.netns, check=False)


def kept_through_tmp(shared: Path) -> list[Path]:
    """What a host sees at the same path although its /tmp is its own (outermost first, none inside another).

    The shared folder, and the Python prefix and the runner's checkout when they live under /tmp (a clone in /tmp/x
    runs its tests on hosts too).
    """
    tmp = Path("/tmp")  # noqa: S108 - the path a host mounts its own tmpfs on, not a file made here
    wanted = [shared, Path(sys.prefix).resolve(), Path(__file__).resolve().parents[2]]
    under = sorted({p for p in wanted if p == shared or tmp in p.parents}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in under:
        if not any(k == path or k in path.parents for k in kept):
            kept.append(path)
    return kept


class Lab:
    """A bridge and the simulated hosts on it; `shared` is seen by every host at the same path. Root only."""

    def __init__(self, shared: Path) -> None:
        self.shared = shared.resolve()
        self.shared.mkdir(parents=True, exist_ok=True)
        self.subnet = _free_subnet()
        self.tag = f"r{self.subnet}"
        self.bridge = f"rbr{self.subnet}"
        self.bridge_ip = f"10.215.{self.subnet}.1"
        self.hosts: dict[str, Host] = {}
        self.hosts_file = self.shared / ".lab-hosts"
        self.aside = Path(f"/run/runner-lab-{self.subnet}")
        self._made = False

    def __enter__(self) -> Self:
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made = True
        _ip("addr", "add", f"{self.bridge_ip}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        self.aside.mkdir(parents=True, exist_ok=True)
        self.hosts_file.write_text("")
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def address(self, name: str) -> str:
        """The address host `name` has (or will have)."""
        return self.hosts[name].ip

    def add(self, name: str) -> Host:
        """Start a new host called `name` (also its hostname) and return it once it is up.

        A host of that name that was lost is replaced: its namespace is deleted and the new one gets its address (a
        machine that rebooted, or a replacement under the same name); one still up is refused.
        """
        old = self.hosts.get(name)
        if old is not None and not old.lost:
            msg = f"host {name} is up: lose() it before adding a new one of that name"
            raise ValueError(msg)
        if old is not None:
            old.close()
            k = int(old.ip.rsplit(".", 1)[1])
        else:
            k = len(self.hosts) + 2
        host = Host(self, name, f"10.215.{self.subnet}.{k}", f"{self.tag}-{name}", f"{self.tag}v{k}")
        self.hosts[name] = host
        self._write_hosts()
        ns_end = f"{self.tag}n{k}"
        _ip("netns", "add", host.netns)
        _ip("link", "add", host.veth, "type", "veth", "peer", "name", ns_end)
        _ip("link", "set", ns_end, "netns", host.netns)
        _ip("link", "set", host.veth, "master", self.bridge)
        _ip("link", "set", host.veth, "up")
        _ip("-n", host.netns, "link", "set", ns_end, "name", "eth0")
        _ip("-n", host.netns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        _ip("-n", host.netns, "link", "set", "lo", "up")
        self._boot(host)
        return host

    def _boot(self, host: Host) -> None:
        kept = kept_through_tmp(self.shared)
        asides = [self.aside / host.name / str(k) for k in range(len(kept))]
        for aside in asides:
            aside.mkdir(parents=True, exist_ok=True)
        script = " && ".join([
            "cd /",
            f"hostname {host.name}",
            f"mount --bind {self.hosts_file} /etc/hosts",
            *(f"mount --bind {shlex.quote(str(path))} {aside}" for path, aside in zip(kept, asides, strict=True)),
            "mount -t tmpfs -o mode=1777 host-tmp /tmp",
            *(f"mkdir -p {shlex.quote(str(path))} && mount --bind {aside} {shlex.quote(str(path))} && umount {aside}"
              for path, aside in zip(kept, asides, strict=True)),
            'exec python3 -c "$0"',
        ])
        host.init = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{host.netns}", "unshare", "--uts", "--mount", "--propagation", "private",
             "--pid", "--fork", "--mount-proc", "sh", "-c", script, REAPER],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        assert host.init.stdout is not None
        ready, _, _ = select.select([host.init.stdout], [], [], SETUP_TIMEOUT_S)
        line = host.init.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            host.init.kill()
            err = host.init.stderr.read().decode(errors="replace") if host.init.stderr else ""
            host.init.wait()
            msg = f"host {host.name} did not start: {err.strip() or 'no word within the setup timeout'}"
            raise OSError(msg)
        host.init_pid = self._pid_one(host.init.pid)

    @staticmethod
    def _pid_one(unshare_pid: int) -> int:
        """The pid (here) of the child unshare forked: the host's PID 1."""
        deadline = time.monotonic() + SETUP_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                for task in Path(f"/proc/{unshare_pid}/task").iterdir():
                    kids = (task / "children").read_text().split()
                    if kids:
                        return int(kids[0])
            time.sleep(0.01)
        msg = f"the host's PID 1 (a child of unshare {unshare_pid}) was not found"
        raise OSError(msg)

    def _write_hosts(self) -> None:
        """/etc/hosts of every host, rewritten in place (the bind mounts follow the same inode)."""
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback",
                 *(f"{h.ip} {h.name}" for h in self.hosts.values())]
        with self.hosts_file.open("r+" if self.hosts_file.exists() else "w") as f:
            f.seek(0)
            f.truncate()
            f.write("\n".join(lines) + "\n")

    def close(self) -> None:
        """Every host lost and deleted, then the bridge (never raises; safe to call twice)."""
        for host in self.hosts.values():
            host.close()
        if self._made:
            _ip("link", "del", self.bridge, check=False)
            self._made = False
        with contextlib.suppress(OSError):
            for d in self.aside.iterdir():  # <aside>/<host>/<k>: empty mount points (rmdir: never a mounted tree)
                for k in d.iterdir():
                    k.rmdir()
                d.rmdir()
            self.aside.rmdir()
