"""A worker for the standby tests: records how its interpreter looks at its first statement, then behaves as told.

Writes $OUT/rank<R>.attempt<A>.json. The same script runs cold and in a standby: the records must match (except
what a standby changes on purpose: `torch` already imported). PROBE_CRASH_ATTEMPTS=N: on attempts < N rank 1 raises
once $OUT/go exists (the test creates it when the standbys are warm), the others wait to be stopped. Later attempts
end as PROBE_END says: "exit:<code>", "raise",
"interrupt" (KeyboardInterrupt), "spawn" (a multiprocessing spawn child that needs __main__ importable).
"""

import sys

PRELOADED = "torch" in sys.modules  # before anything else: was the interpreter warm?

import gc  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402
import os  # noqa: E402
import pickle  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402

GLOBALS_AT_START = sorted(k for k in globals() if k.startswith("__"))


class Thing:
    """Pickled through __main__ (a class a script defines must pickle by reference)."""

    value = 42


def spawned(path: str) -> None:
    with open(path, "w") as f:
        f.write("spawned")


def fd_kind(fd: int) -> str:
    target = os.readlink(f"/proc/self/fd/{fd}")
    return target.split(":")[0] if ":" in target else ("devnull" if target == "/dev/null" else "file")


def record() -> dict[str, object]:
    env = dict(os.environ)
    tag = env.get("RUNNER_WORKER_TAG", "")
    with open("/proc/self/environ", "rb") as f:
        initial_env = f.read()
    main = sys.modules["__main__"]
    return {
        "preloaded": PRELOADED,
        "argv": sys.argv,
        "orig_argv_tail": sys.orig_argv[1:],
        "path0": sys.path[0],
        "file": __file__,
        "name": __name__,
        "main_is_module": main.__dict__ is globals(),
        "spec": None if __spec__ is None else [__spec__.name, __spec__.origin, type(__spec__.loader).__name__],
        "loader": type(__loader__).__name__,
        "package": __package__,
        "cached": __cached__,
        "globals": GLOBALS_AT_START,
        "cwd": os.getcwd(),
        "signals": {s.name: repr(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGPIPE, signal.SIGTERM,
                                                                 signal.SIGHUP, signal.SIGUSR1, signal.SIGCHLD)},
        "leader": os.getpgid(0) == os.getpid() == os.getsid(0),
        "fds": [fd_kind(0), fd_kind(1), fd_kind(2)],
        "unbuffered": sys.stdout.write_through,
        "env_keys": sorted(env),
        "contract": {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT")},
        "tag_in_proc_environ": bool(tag) and f"RUNNER_WORKER_TAG={tag}".encode() in initial_env,
        "pickled": pickle.loads(pickle.dumps(Thing())).value,
        "cmdline": open("/proc/self/cmdline", "rb").read().rstrip(b"\0").decode().split("\0")[1:],
        "title": open("/proc/self/cmdline", "rb").read().rstrip(b"\0").replace(b"\0", b" ").decode(),
        "gc_frozen": gc.get_freeze_count(),
        "pid": os.getpid(),
        "ppid": os.getppid(),
    }


def main() -> None:
    out = os.environ["OUT"]
    rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    info = record()
    path = os.path.join(out, f"rank{rank}.attempt{attempt}.json")
    with open(path + ".tmp", "w") as f:  # then renamed: a reader never sees it half written
        json.dump(info, f)
    os.replace(path + ".tmp", path)
    print(f"probe rank {rank} attempt {attempt}", flush=True)
    crasher = min(1, int(os.environ["WORLD_SIZE"]) - 1)  # rank 1 (rank 0 when alone)
    if attempt < int(os.environ.get("PROBE_CRASH_ATTEMPTS", "0")):  # it crashes once told; the others wait
        while rank != crasher or not os.path.exists(os.path.join(out, "go")):
            time.sleep(0.05)
        # The crash stops the other ranks: first let each write its record (a peer still starting would be stopped
        # before it wrote one, and the test reads every rank's), for at most 30 s.
        peers = [os.path.join(out, f"rank{r}.attempt{attempt}.json") for r in range(int(os.environ["WORLD_SIZE"]))]
        deadline = time.monotonic() + 30
        while not all(os.path.exists(p) for p in peers) and time.monotonic() < deadline:
            time.sleep(0.01)
        raise ValueError("probe crash")
    end = os.environ.get("PROBE_END", "exit:0")
    if end == "raise":
        raise RuntimeError("probe raised")
    if end == "interrupt":
        raise KeyboardInterrupt
    if end == "spawn":
        child = multiprocessing.get_context("spawn").Process(target=spawned, args=(os.path.join(out, f"spawned{rank}"),))
        child.start()
        child.join(60)
        sys.exit(child.exitcode)
    sys.exit(int(end.split(":")[1]))


if __name__ == "__main__":
    main()
