"""Every bound the spec loader enforces, in one place, each with the reason for its value.

A spec file is hostile input: these bounds keep the cost of accepting or refusing any file to a fraction of a
second and a few tens of MB, and refuse values that the OS, Python or etcd would reject only at run time.
docs/spec.md lists them for users.
"""

from __future__ import annotations

# --- cost of reading a file -------------------------------------------------------------------------------------
MAX_FILE_BYTES = 1 << 20  # 1 MiB: a real spec is a few KB; everything in it ends up in argv/env (ARG_MAX ~2 MiB)
MAX_DEPTH = 32  # nesting levels (the deepest real spec has 4); libyaml's composer recurses in C and segfaults deep
MAX_VALUES = 20_000  # keys and values after alias/merge expansion (a real spec has < 200); "billion laughs" stop here
MAX_EXPANDED_CHARS = 4 * MAX_FILE_BYTES  # all ${VAR} substitutions together may add at most this much text
MAX_PROBLEMS = 100  # problems reported for one file; past this, one more line says the list was cut

# --- values the OS, Python or etcd accept ------------------------------------------------------------------------
MAX_INT = (1 << 63) - 1  # a YAML integer must fit in 64 bits (etcd, JSON tools and C APIs read int64)
MIN_INT = -(1 << 63)
MAX_ARG_BYTES = 131_072  # Linux MAX_ARG_STRLEN: execve refuses one argv or "KEY=VALUE" string longer (with its NUL)
MAX_DURATION_S = 9e9  # etcd's MaxLeaseTTL (9,000,000,000 s); Python's clocks overflow at 2**63 ns (~9.22e9 s)
MAX_NPROC = 1 << 22  # Linux PID_MAX_LIMIT: no machine can run more processes than this
MAX_WORLD_SIZE = (1 << 31) - 1  # torch.distributed keeps rank and world size in a C int
MAX_EXIT_CODE = 255  # waitpid reports 8 bits of exit status
MAX_PREFIX_WIDTH = 256  # width/precision in logs.prefix: each console line is padded to this at most
