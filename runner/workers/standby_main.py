"""A standby worker: an interpreter that imports `restart.preload` ahead of time, then becomes a worker on orders.

Run by the agent (runner.workers.standby) as `python -u <this file> <socket fd> <sys.path[0]> <module>...` with the
worker's python, in the worker's own session, cgroup and environment (less the per-attempt contract variables).
Standard library only, and never imported as part of the `runner` package: the interpreter must hold nothing of
the agent's.

1. Puts `<sys.path[0]>` (where the worker's own modules are found) first on sys.path and imports each module
   (CUDA is never initialised: importing torch does not), then moves what the imports made out of the cyclic
   GC's way (gc.freeze). A module that fails to import is reported (`failed
   <module>` instead of `ready`, the error on stderr): the agent then stops it and starts workers cold.
2. Says `ready` on the socket and waits for its orders: one length-prefixed JSON message
   {"argv": [...], "env": {...}, "cwd": "..."} with the worker's stdout and stderr file descriptors attached.
3. Becomes the worker: stdout/stderr replaced, cwd and the whole environment set, then runs `python -u script args`
   or `python -u -m module args` exactly as a fresh interpreter would: `__main__`, sys.argv, sys.path[0], `__file__`,
   sys.orig_argv; uncaught exceptions, SystemExit and KeyboardInterrupt end the process as they would there.
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
from typing import Self

HEADER = 8  # bytes of the big-endian length before the JSON orders
MAX_ORDERS = 64 << 20  # an environment and argv larger than this are refused (the agent then starts a cold worker)
_HERE = os.path.abspath(__file__)


def main() -> None:
    """Preload, wait for orders, run them."""
    fd, path0, modules = int(sys.argv[1]), sys.argv[2], sys.argv[4:]  # argv[3]: room for the worker's argv
    sys.path[0] = path0
    began = time.monotonic()
    said = b"ready\n"
    for name in modules:
        try:
            __import__(name)
        except BaseException as e:  # even SystemExit or KeyboardInterrupt from a module: the preload failed
            print(f"runner standby: preload of {name!r} failed: {type(e).__name__}: {e}", file=sys.stderr)
            said = f"failed {name}\n".encode()
            break
    # What the imports made lives as long as the process: the cyclic GC need never scan it again, nor at the
    # interpreter's teardown (0.55 -> 0.12 s for torch here, from a crashed worker's last statement to its exit).
    # Objects the worker makes are collected as ever.
    gc.freeze()
    sock = socket.socket(fileno=fd)
    with contextlib.suppress(OSError):
        sock.sendall(said)
    if said == b"ready\n":  # the standby's own log (its stdout until it becomes a worker)
        print(f"runner standby: ready, imported {modules} in {time.monotonic() - began:.2f} s", flush=True)
    orders, fds = receive(sock)
    sock.close()
    if orders is None:
        raise SystemExit(0)  # the agent hung up: this standby is no longer wanted
    become(orders, fds)  # orders sent before a failed preload ended run as a cold worker would


def receive(sock: socket.socket) -> tuple[dict[str, object] | None, list[int]]:
    """The orders and the two descriptors, or (None, []) when the agent hung up first."""
    data, fds, _flags, _addr = socket.recv_fds(sock, 65536, 2)
    if len(data) < HEADER:
        return None, fds
    size = int.from_bytes(data[:HEADER], "big")
    if size > MAX_ORDERS:
        return None, fds
    body = bytearray(data[HEADER:])
    while len(body) < size:
        chunk = sock.recv(min(size - len(body), 1 << 20))
        if not chunk:
            return None, fds
        body += chunk
    return json.loads(bytes(body)), fds


def become(orders: dict[str, object], fds: list[int]) -> None:
    """Turn this interpreter into the worker `orders` describes, and run it."""
    argv = [str(a) for a in orders["argv"]]  # type: ignore[attr-defined]
    env: dict[str, str] = orders["env"]  # type: ignore[assignment]
    out, err = fds
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.close(out)
    os.close(err)
    os.chdir(str(orders["cwd"]))
    os.environ.clear()
    os.environ.update(env)
    sys.orig_argv = list(argv)
    retitle(argv)
    sys.excepthook = without_own_frames(sys.excepthook)
    rest = argv[2:]  # past `python -u`
    ending = CleanEnd(os.environ.get("RUNNER_HEARTBEAT_FILE", ""))
    atexit.register(ending.mark)  # registered first, so it runs after the script's own handlers
    with ending:
        if rest[0] == "-m":
            run_module(rest[1], rest[2:])
        else:
            run_script(rest[0], rest[1:])


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


def retitle(argv: list[str]) -> None:
    """Make /proc/self/cmdline (ps, top, pkill -f) show the worker's argv, as setproctitle does.

    The kernel shows the memory between the stat fields arg_start and arg_end: it is overwritten in place (the
    standby's argv reserved room for it; a longer argv is cut). Only when /proc/self/cmdline proves the area is the
    one this interpreter started with; Python holds its own copies of the strings, so nothing else changes.
    """
    import ctypes

    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # fields 48 and 49 of stat; the list starts at field 3
        with open("/proc/self/cmdline", "rb") as f:
            current = f.read()
    except (OSError, ValueError, IndexError):
        return
    size = end - start
    if size <= 0 or len(current) != size or not current.endswith(b"\0"):
        return
    title = b"\0".join(a.encode(errors="surrogateescape") for a in argv)[: size - 1]
    ctypes.memmove(start, title.ljust(size, b"\0"), size)


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
