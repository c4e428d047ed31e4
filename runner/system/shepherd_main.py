"""Guard process: kills every process of the job if the agent dies, even by SIGKILL.

Started by runner.system.shepherd as `python -S -I -c <import this, run main()> <job tag> [<job cgroup>]` with a
pipe from the agent on stdin (standard library only: no site-packages are loaded).
The agent writes `+ PID START` when it starts a worker (START: its start time in /proc/PID/stat) and `- PID` once
that worker's processes are gone and it is about to reap it. The guard holds a pidfd on every listed worker, so it
never signals a process that merely got a recycled pid. When the pipe reaches EOF (the agent exited or closed it,
however it exited) the guard kills, each through a pidfd and only once proven ours:

- everything in the job's cgroup (`cgroup.kill`), when the agent made one;
- every process in a listed worker's process group or session, while that worker is not reaped (so its id is
  still its own);
- every process whose environment carries the job's tag (a worker's child that called setsid() keeps it);
- the listed workers themselves.
It ignores the signals a terminal or a scheduler sends to a process group, so only SIGKILL ends it early (and the
agent notices that at once through a pidfd and starts another).

With the etcd rendezvous the agent also writes `L MODULE TICKET` whenever its lease is granted or replaced
(runner.system.shepherd.DeathNote: MODULE names the handler, here runner.rendezvous.etcd.lease_revoke; TICKET is one
line of JSON) and a bare `L` once it gave the lease up itself.
When the agent died holding a lease, the guard calls MODULE's `on_agent_death(TICKET)` right after the kill passes
(the workers come first; the wait for the cgroup to empty comes after): the node's keys vanish and its peers see it
lost within a second, not after the lease TTL. The revoke gives up after lease_revoke.REVOKE_BUDGET_S, so a dead etcd
delays the guard's exit by that at most. The ticket (with the etcd password, when auth is on) stays in this
process's memory. The guard imports nothing above runner.system until then, and only a module under `runner.`.

`D PATH` names a private temp folder of the agent's (the flight recorder's sockets): removed last, so that an agent
SIGKILLed leaves nothing in the temp dir. Only a folder that is still what the agent made is removed: a directory,
not a link, named `runner-*`, owned by this user and closed to others (mkdtemp's 0700); at most MAX_FOLDERS.
"""

import contextlib
import os
import shutil
import signal
import stat
import sys
import time
from pathlib import Path

from runner.system import procs
from runner.system.cgroup import JobCgroup

ROUNDS = 20  # kill passes at most: a process forked during one pass is found by the next
CGROUP_WAIT_S = 10.0
MAX_FOLDERS = 16  # `D` folders kept (an agent names one or two)


class Orders:
    """What the agent told the guard so far: its workers (pidfds), its lease's ticket, its private folders."""

    def __init__(self) -> None:
        self.leaders: dict[int, int] = {}  # worker pid -> pidfd
        self.ticket = b""  # how to revoke the agent's etcd lease (decoded only if the agent dies holding one)
        self.folders: list[bytes] = []  # the agent's private temp folders, removed after the kill

    def take(self, line: bytes) -> None:
        """One line of the agent's; anything malformed is ignored."""
        if line[:1] == b"L" and line[1:2] in (b" ", b"\n", b""):
            self.ticket = line[1:].strip()
            return
        if line[:2] == b"D " and line[2:3] == b"/":
            folder = line[2:].rstrip(b"\n")
            if folder not in self.folders and len(self.folders) < MAX_FOLDERS:
                self.folders.append(folder)
            return
        words = line.split()
        if len(words) == 3 and words[0] == b"+" and words[1].isdigit() and words[2].isdigit():
            self.watch(int(words[1]), int(words[2]))
        elif len(words) == 2 and words[0] == b"-" and words[1].isdigit():
            fd = self.leaders.pop(int(words[1]), None)
            if fd is not None:
                os.close(fd)

    def watch(self, pid: int, start_time: int) -> None:
        """Hold a pidfd on worker `pid` if it is still the process the agent started."""
        fd = procs.pidfd(pid)
        st = procs.read_stat(pid)
        if fd is not None and (st is None or st.start_time != start_time or not procs.exists(fd)):
            os.close(fd)  # not the process the agent started: never ours to kill
            fd = None
        if fd is not None:
            old = self.leaders.pop(pid, None)
            if old is not None:
                os.close(old)
            self.leaders[pid] = fd


def main() -> None:
    """Track workers from stdin; at EOF kill what is left of the job, then remove the agent's folders."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    tag = sys.argv[1]
    cgroup = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    orders = Orders()
    for line in sys.stdin.buffer:
        orders.take(line)
    kill_job(orders.leaders, tag, cgroup, orders.ticket)
    for folder in orders.folders:
        remove_folder(os.fsdecode(folder))


def remove_folder(path: str) -> None:
    """Remove `path` if it is still a private `runner-*` directory of this user's (see the module's `D` line)."""
    try:
        st = os.lstat(path)
    except OSError:
        return  # gone already: the agent removed it at its end
    private = stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077
    if private and os.path.basename(path).startswith("runner-"):
        shutil.rmtree(path, ignore_errors=True)
    else:
        say(f"runner guard: left {path!r} (not a private runner-* folder of this user's)\n")


def kill_job(leaders: dict[int, int], tag: str, cgroup: Path | None, ticket: bytes = b"") -> None:
    """Kill the job (kill_all), revoke the lease of `ticket` if any, then wait for the cgroup to empty and remove it.

    The revoke comes after the kill passes (the job's processes are signalled first, whatever etcd does) and
    before the cgroup wait (the peers learn of the loss without waiting for our processes to be reaped).
    """
    kill_all(leaders, tag, cgroup)
    if ticket:
        carry_out(ticket)
    if cgroup is not None:
        deadline = time.monotonic() + CGROUP_WAIT_S
        while JobCgroup.populated(cgroup) and time.monotonic() < deadline:
            time.sleep(0.02)
        JobCgroup(cgroup).remove(max(0.0, deadline - time.monotonic()))


def kill_all(leaders: dict[int, int], tag: str, cgroup: Path | None) -> None:
    """SIGKILL every process of the job that can be proven ours, until a pass finds none."""
    if cgroup is not None:
        JobCgroup.kill(cgroup)
    for _ in range(ROUNDS):
        hit: dict[int, int] = {}
        for pid, fd in leaders.items():
            hit |= procs.signal_matching(procs.in_session(pid, fd), signal.SIGKILL)
        if tag:
            hit |= procs.signal_matching(procs.tagged(tag), signal.SIGKILL)
        for fd in leaders.values():
            procs.send(fd, signal.SIGKILL)
        procs.close_all(hit)
        if not hit:
            break


def carry_out(note: bytes) -> None:
    """Call the death note's handler (`MODULE PAYLOAD`): only a module under `runner.`; anything else is ignored."""
    import importlib

    module, _, payload = note.partition(b" ")
    name = module.decode("ascii", "replace")
    if not name.startswith("runner.") or not payload:
        say(f"runner guard: ignored a death note for {name!r}\n")
        return
    importlib.import_module(name).on_agent_death(payload)


def say(text: str) -> None:
    """One line on the guard's stderr, unbuffered: a stderr that cannot take it costs the line, never the guard's work.

    The guard's stderr is the agent's: a file on a full disk, or a pipe nobody reads any more.
    """
    with contextlib.suppress(OSError):
        os.write(2, text.encode(errors="replace"))


if __name__ == "__main__":
    main()
