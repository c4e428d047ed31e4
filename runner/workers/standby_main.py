"""The fork server and the standbys it forks: one interpreter imports `restart.preload` once, forks every worker.

Run by the agent (runner.workers.standby) as `python -u <this file> <control fd> <sys.path[0]> <job> <module>...`
with the workers' python, in its own session and cgroup, with the workers' environment less the per-attempt
contract. Standard library only, and never imported as part of the `runner` package: the interpreter must hold
nothing of the agent's.

1. The server puts `<sys.path[0]>` first on sys.path, imports each module (CUDA is never initialised: importing
   torch does not), moves what the imports made out of the cyclic GC's way (gc.freeze: a forked child's reference
   counts then dirty fewer shared pages, and its teardown skips them), and says `ready <seconds> <rss kB>` on its
   control socket (a SOCK_SEQPACKET); `failed <module>` or `unsafe <why>` instead, then exits.
2. Each request on the control socket (one JSON message: the standby's tag, cgroup and the agent's pid, with the
   standby's own socket attached) is served by a double fork: the intermediate child forks the standby and exits
   at once, so the standby is reparented to the agent (the child subreaper) and is the agent's child like any
   worker. Before every fork the server checks it is safe to fork: no thread besides the main one (a thread pool
   that stops itself at fork, as OpenBLAS's does, is fine), CUDA not initialised; otherwise it says `unsafe <why>`
   and exits (the agent starts workers cold).
3. The standby starts its own session, moves into its cgroup, writes its tag over the server's in its initial
   environment (what /proc/<pid>/environ shows), waits until the agent is its parent, sends the agent a pidfd of
   itself with `ready`, and waits for its orders: one length-prefixed JSON message {"argv", "env", "cwd"} with the
   worker's stdout and stderr file descriptors attached.
4. It becomes the worker: stdout/stderr replaced, cwd and the whole environment set, then runs `python -u script
   args` or `python -u -m module args` exactly as a fresh interpreter would: `__main__`, sys.argv, sys.path[0],
   `__file__`, sys.orig_argv; uncaught exceptions, SystemExit and KeyboardInterrupt end the process as they would.

Every write of the server and of a standby before it becomes the worker is fail-soft: its log may be on a full or
read-only disk, and nothing here may die of that.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import socket
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Self

HEADER = 8  # bytes of the big-endian length before the JSON orders
MAX_ORDERS = 64 << 20  # an environment and argv larger than this are refused (the agent then starts a cold worker)
MAX_REQUEST = 65536  # a fork request (JSON) larger than this is refused
TAG_VAR = "RUNNER_WORKER_TAG"  # runner.system.procs.TAG_VAR (this file imports nothing of runner's)
TAG_PAD = "~"  # fills the tag's room in the initial environment: never a character of a tag
FLIGHT_SOCKET_VAR = "RUNNER_FLIGHT_RECORDER_SOCKET"  # runner.contract.FLIGHT_SOCKET_VAR
SERVER_SOCKET_VAR = "TORCH_WORKER_SERVER_SOCKET"  # torch.distributed.elastic.control_plane's
PARENT_WAIT_S = 10.0  # a forked standby waits this long at most for the agent to become its parent
_HERE = os.path.abspath(__file__)
JOB = "?"  # the job's name (argv[3]), in the titles of the server, its standbys and their workers
NOENV = "SPT_NOENV"  # runner.system.title.NOENV: setproctitle leaves /proc/<pid>/environ (the tag) alone


def set_title(title: str) -> None:
    """runner.system.title.set_title (this file imports nothing of runner's): `title` in ps, comm left, best effort."""
    had = os.environ.get(NOENV)
    os.environ[NOENV] = "1"
    try:
        with contextlib.suppress(ImportError, OSError):
            import setproctitle

            with open("/proc/thread-self/comm", encoding="utf-8", errors="replace") as f:
                comm = f.read().rstrip("\n")
            setproctitle.setproctitle(title)
            setproctitle.setthreadtitle(comm)
    finally:
        if had is None:
            os.environ.pop(NOENV, None)


def say(stream: socket.socket, line: str) -> bool:
    """Send one line to the agent; False when it is gone (never raises)."""
    try:
        stream.sendall(line.encode() + b"\n")
    except OSError:
        return False
    return True


def note(text: str) -> None:
    """A line in the server's own log; lost, not fatal, when the disk refuses it."""
    with contextlib.suppress(OSError, ValueError):
        print(text, flush=True)


def main() -> None:
    """Preload, then serve fork requests; returns into a standby's life only in a forked child."""
    global JOB
    ctl_fd, path0, JOB, modules = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
    set_title(f"runner: fork server of job {JOB}")
    sys.path[0] = path0
    began = time.monotonic()
    ctl = socket.socket(fileno=ctl_fd)
    for name in modules:
        try:
            __import__(name)
        except BaseException as e:
            note(f"runner fork server: preload of {name!r} failed: {type(e).__name__}: {e}")
            say(ctl, f"failed {name}")
            raise SystemExit(0) from None
    if "torch" in sys.modules:  # what serve_flight_recorder() needs, imported once here (5 ms), not per worker
        with contextlib.suppress(Exception):
            __import__("torch.distributed.elastic.control_plane")
    # What the imports made lives as long as the process: the cyclic GC need never scan it again, nor at the
    # interpreter's teardown (0.55 -> 0.12 s for torch here, from a crashed worker's last statement to its exit).
    # Objects the worker makes are collected as ever.
    gc.freeze()
    if refused(ctl):
        raise SystemExit(0)
    took = time.monotonic() - began
    note(f"runner fork server: ready, imported {modules} in {took:.2f} s")
    if not say(ctl, f"ready {took:.3f} {rss_kb()}"):
        raise SystemExit(0)
    job = serve(ctl)
    if job is None:
        raise SystemExit(0)  # the agent hung up (or forking became unsafe): this server is no longer wanted
    standby(*job)


def rss_kb() -> int:
    """This process's resident memory in KiB (0 when unknown)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def refused(ctl: socket.socket) -> bool:
    """True, once said to the agent and in the log, when forking is unsafe now (the server then exits)."""
    why = unsafe_to_fork()
    if why:
        note(f"runner fork server: not forking: {why}")
        say(ctl, f"unsafe {why}")
    return bool(why)


def unsafe_to_fork() -> str:
    """Why forking this interpreter now could hand a child a held lock or a CUDA context ('' when it cannot)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None:
        try:
            initialised = bool(cuda.is_initialized())
        except Exception as e:
            return f"cannot tell whether CUDA is initialised: {type(e).__name__}: {e}"
        if initialised:
            return "the preload initialised CUDA: a CUDA context cannot be used in a forked child"
    try:
        tasks = os.listdir("/proc/self/task")
        if len(tasks) > 1:
            # A pool that stops itself at fork (pthread_atfork, as OpenBLAS's does: numpy starts it at import)
            # is harmless: fork a probe that exits at once, and count again once its handlers ran.
            probe = os.fork()
            if probe == 0:
                os._exit(0)
            os.waitpid(probe, 0)
            tasks = os.listdir("/proc/self/task")
    except OSError as e:
        return f"cannot count this process's threads: {e}"
    if len(tasks) > 1:
        names = []
        for tid in tasks:
            with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as f:
                names.append(f.read().strip())
        return (f"the preload started {len(tasks) - 1} thread(s) besides the main one that live on across a fork "
                f"({', '.join(names)}); a thread may hold a lock a forked child would inherit held")
    return ""


@dataclass(frozen=True)
class Request:
    """One fork request: the standby's tag, its cgroup ('' for none), the pid that must become its parent."""

    tag: str
    cgroup: str
    parent: int

    @classmethod
    def parse(cls, data: bytes) -> Request | None:
        """The request in `data`, or None when it is not one (refused: no fork)."""
        try:
            raw = json.loads(data)
        except ValueError:
            return None
        if not isinstance(raw, dict):
            return None
        tag, cgroup, parent = raw.get("tag"), raw.get("cgroup"), raw.get("parent")
        if not (isinstance(tag, str) and isinstance(cgroup, str) and isinstance(parent, int)):
            return None
        return cls(tag, cgroup, parent)


def serve(ctl: socket.socket) -> tuple[Request, socket.socket] | None:
    """Fork a standby per request until the agent hangs up; returns only in a standby (its request and socket)."""
    while True:
        got = next_request(ctl)
        if got is None:
            return None
        request, chan = got
        if refused(ctl):
            chan.close()
            return None
        if request is None:
            chan.close()  # the agent sees its socket close: a lost standby
            continue
        pid = os.fork()
        if pid == 0:  # the intermediate child: fork the standby and exit, so that it reparents to the agent
            try:
                if os.fork() == 0:
                    ctl.close()
                    return request, chan
            except OSError:
                os._exit(1)
            os._exit(0)
        chan.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def next_request(ctl: socket.socket) -> tuple[Request | None, socket.socket] | None:
    """The next request (None: not one) with the standby's socket; None when the agent hung up."""
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(ctl, MAX_REQUEST, 1)
        except OSError:
            return None
        if not data:
            for fd in fds:
                os.close(fd)
            return None
        if fds:
            return Request.parse(data), socket.socket(fileno=fds[0])


def standby(request: Request, chan: socket.socket) -> None:
    """A forked standby: its own session, cgroup and tag; the agent's child; then the worker its orders describe."""
    os.setsid()
    if request.cgroup:
        try:
            with open(os.path.join(request.cgroup, "cgroup.procs"), "w", encoding="ascii") as f:
                f.write(str(os.getpid()))
        except OSError as e:
            note(f"runner standby: cannot enter cgroup {request.cgroup}: {e}")
            raise SystemExit(1) from None
    retag(request.tag)
    set_title(f"runner: standby of job {JOB}")
    deadline = time.monotonic() + PARENT_WAIT_S
    while os.getppid() != request.parent:  # the intermediate child is exiting; then the agent (subreaper) adopts
        if time.monotonic() > deadline:
            note(f"runner standby: parent is {os.getppid()}, not the agent {request.parent}")
            raise SystemExit(1)
        time.sleep(0.0005)
    me = os.pidfd_open(os.getpid())
    try:
        socket.send_fds(chan, [b"ready\n"], [me])
    except OSError:
        raise SystemExit(0) from None  # the agent no longer wants this standby
    finally:
        os.close(me)
    orders, fds = receive(chan)
    chan.close()
    if orders is None:
        raise SystemExit(0)  # the agent hung up: this standby is no longer wanted
    become(orders, fds)


def retag(tag: str) -> None:
    """Write `tag` over the server's own in this process's initial environment (/proc/<pid>/environ).

    A forked process shows its parent's initial environment there; the agent and the guard find a worker's
    processes by the tag in it. The server was started with room for a tag (padded with TAG_PAD, never part of a
    tag, so the tag stays a prefix match); it is overwritten in place.
    """
    import ctypes

    area = own_area(47, "environ")  # env_start and env_end: fields 50 and 51 of stat
    if area is None:
        return
    start, current = area
    key = f"{TAG_VAR}=".encode()
    at = current.find(b"\0" + key)
    at = 0 if current.startswith(key) else (at + 1 if at >= 0 else -1)
    if at < 0:
        return
    value_at = at + len(key)
    room = current.find(b"\0", value_at) - value_at
    new = tag.encode()
    if room < len(new):
        return
    ctypes.memmove(start + value_at, new.ljust(room, TAG_PAD.encode()), room)


def receive(sock: socket.socket) -> tuple[dict[str, object] | None, list[int]]:
    """The orders and the two descriptors, or (None, []) when the agent hung up first."""
    try:
        data, fds, _flags, _addr = socket.recv_fds(sock, 65536, 2)
    except OSError:
        return None, []
    if len(data) < HEADER or len(fds) != 2:
        return None, fds
    size = int.from_bytes(data[:HEADER], "big")
    if size > MAX_ORDERS:
        return None, fds
    body = bytearray(data[HEADER:])
    while len(body) < size:
        try:
            chunk = sock.recv(min(size - len(body), 1 << 20))
        except OSError:
            return None, fds
        if not chunk:
            return None, fds
        body += chunk
    return json.loads(bytes(body)), fds


def become(orders: dict[str, object], fds: list[int]) -> None:
    """Turn this interpreter into the worker `orders` describes, and run it."""
    argv = [str(a) for a in orders["argv"]]  # type: ignore[attr-defined]
    env: dict[str, str] = orders["env"]  # type: ignore[assignment]
    out, err = fds
    for stream in (sys.stdout, sys.stderr):  # what the standby wrote to its log: lost, not fatal, on a full disk
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.close(out)
    os.close(err)
    os.chdir(str(orders["cwd"]))
    os.environ.clear()
    os.environ.update(env)
    sys.orig_argv = list(argv)
    rest = argv[2:]  # past `python -u`
    program = rest[1] if rest[0] == "-m" else os.path.basename(rest[0])  # `pkill -f train.py` finds it, as a cold one
    set_title(f"runner: worker rank {env.get('RANK', '?')} of job {JOB} (attempt "
              f"{env.get('TORCHELASTIC_RESTART_COUNT', '?')}) {program}")
    sys.excepthook = without_own_frames(sys.excepthook)
    serve_flight_recorder(os.environ.get(FLIGHT_SOCKET_VAR, ""))
    ending = CleanEnd(os.environ.get("RUNNER_HEARTBEAT_FILE", ""))
    atexit.register(ending.mark)  # registered first, so it runs after the script's own handlers
    with ending:
        if rest[0] == "-m":
            run_module(rest[1], rest[2:])
        else:
            run_script(rest[0], rest[1:])


def serve_flight_recorder(path: str) -> None:
    """Start torch's worker server on `path`, so the agent can read this worker's flight recorder when it hangs.

    Only when the preload imported torch (the default): a worker of a fork server without torch, or a script that
    does not use it, is not made to import it. The server is torch's public `worker_main()` (the socket it reads
    from TORCH_WORKER_SERVER_SOCKET, set here for the call only: a script that enters `worker_main()` itself with
    its own socket is not disturbed). It answers from a C++ thread of its own, without the GIL: a worker whose
    main thread is blocked in a collective answers too. Its "listening" line is kept off the worker's stderr, and
    the server is deliberately never released: its shutdown prints two more lines at every exit; the process's
    end ends its thread. Anything that fails here leaves the worker without the server (the agent says so).
    """
    if not path or "torch" not in sys.modules:
        return
    with contextlib.suppress(FileNotFoundError, OSError):
        os.unlink(path)  # the socket of this rank's worker of an earlier attempt
    own = os.environ.get(SERVER_SOCKET_VAR)
    os.environ[SERVER_SOCKET_VAR] = path
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        from torch.distributed.elastic.control_plane import worker_main

        server = worker_main()  # torch's @record types it as possibly None
        if server is None:
            return
        server.__enter__()
        import ctypes

        ctypes.pythonapi.Py_IncRef(ctypes.py_object(server))  # never released (see above)
    except Exception:  # noqa: S110 - the worker runs without it; the agent reports "no recorder"
        pass
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)
        if own is None:
            del os.environ[SERVER_SOCKET_VAR]
        else:
            os.environ[SERVER_SOCKET_VAR] = own


ENDED_FILE = "code_ended"  # runner.contract.CODE_ENDED_FILE (this file imports nothing of runner's)


class CleanEnd:
    """Whether the worker's code ended cleanly (returned, or exit code 0); if so, say so in its log dir at exit.

    The mark is written by the last Python atexit handler, once the script's own are done. What can still go wrong
    after it is the interpreter's and C++'s teardown: gloo's threads meeting it sometimes abort the process
    ("terminate called without an active exception", SIGABRT) although the work is done, under runner and torchrun
    alike (bench/abort_at_exit.py). The agent then counts that worker as succeeded (with a warning) instead of
    restarting a job whose work is over.
    """

    def __init__(self, heartbeat_file: str) -> None:
        self.folder = os.path.dirname(heartbeat_file)
        self.clean = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, _tb: object) -> None:
        self.clean = kind is None or (isinstance(value, SystemExit) and value.code in (None, 0))

    def mark(self) -> None:
        """At exit: write the mark if the code ended cleanly (nothing if the log dir cannot take it)."""
        if self.clean and self.folder:
            with contextlib.suppress(OSError), open(os.path.join(self.folder, ENDED_FILE), "w") as f:
                f.write("ended\n")


def own_area(first: int, name: str) -> tuple[int, bytes] | None:
    """(start address, bytes) of the memory the kernel shows as /proc/self/`name`, or None.

    The area lies between the stat fields at index `first` and `first + 1` (the list starts at field 3); None unless
    the file's length proves it is that very area.
    """
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[first]), int(fields[first + 1])
        with open(f"/proc/self/{name}", "rb") as f:
            current = f.read()
    except (OSError, ValueError, IndexError):
        return None
    if end - start <= 0 or end - start != len(current):
        return None
    return start, current


def run_script(script: str, args: list[str]) -> None:
    """What `python -u script args` does once the interpreter is up."""
    path = os.path.abspath(script)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    with open(path, "rb") as f:
        source = f.read()
    from importlib.machinery import SourceFileLoader

    main_module = types.ModuleType("__main__")
    main_module.__dict__.update(
        __file__=path, __cached__=None, __package__=None, __spec__=None, __annotations__={},
        __loader__=SourceFileLoader("__main__", path), __builtins__=__builtins__,
    )
    sys.modules["__main__"] = main_module
    code = compile(source, path, "exec", dont_inherit=True)
    exec(code, main_module.__dict__)  # noqa: S102 - running the user's own script is this process's purpose


def run_module(module: str, args: list[str]) -> None:
    """What `python -u -m module args` does once the interpreter is up."""
    import runpy

    sys.argv = [module, *args]  # runpy puts the module's file in argv[0], as -m does
    sys.path[0] = os.getcwd()
    # The interpreter's own __main__ starts with an empty __annotations__; runpy's module for -m does not.
    runpy.run_module(module, init_globals={"__annotations__": {}}, run_name="__main__", alter_sys=True)


Hook = Callable[[type[BaseException], BaseException, types.TracebackType | None], object]


def without_own_frames(hook: Hook) -> Hook:
    """sys.excepthook that leaves this file's frames out of a traceback, as a fresh interpreter has none of them."""

    def excepthook(kind: type[BaseException], value: BaseException, tb: types.TracebackType | None) -> None:
        while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) == _HERE:
            tb = tb.tb_next
        hook(kind, value.with_traceback(tb), tb)

    return excepthook


if __name__ == "__main__":
    main()
