"""A worker that fails in a chosen way (no torch), for the failure-class tests.

Writes <dir>/rank<R>.attempt<A>.json with its pid first, then, while attempt < --fail-attempts:
- raise:  raises ValueError with the same message every attempt (an address that varies: the fingerprint ignores it)
- vary:   raises a different exception type every attempt
- wait:   sleeps (the test kills it)
- alloc:  allocates memory until the kernel's OOM killer stops it
- exit:   exits with code 3, without a traceback
On later attempts it exits 0.
"""

import argparse
import json
import os
import time

ERRORS = (ValueError, KeyError, RuntimeError, TypeError, LookupError, OSError, ArithmeticError, AssertionError)


def fail(mode: str, attempt: int) -> None:
    if mode == "raise":
        raise ValueError(f"bad batch at {hex(id(object()))}")
    if mode == "vary":
        raise ERRORS[attempt % len(ERRORS)]("a different error every attempt")
    if mode == "wait":
        time.sleep(600)
    if mode == "alloc":
        hoard = []
        while True:
            hoard.append(bytearray(16 * 1024 * 1024))  # touched: bytearray zero-fills
    raise SystemExit(3)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--mode", required=True, choices=("raise", "vary", "wait", "alloc", "exit"))
    p.add_argument("--fail-attempts", type=int, default=1)
    a = p.parse_args()
    rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    path = os.path.join(a.dir, f"rank{rank}.attempt{attempt}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "attempt": attempt}, f)
    os.replace(path + ".tmp", path)
    if attempt < a.fail_attempts:
        fail(a.mode, attempt)


if __name__ == "__main__":
    main()
