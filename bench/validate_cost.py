"""Cost of `runner validate` on big and hostile spec files, side by side with PyYAML's plain `yaml.safe_load`.

For each file, both run N times as child processes (fresh interpreters, as a user runs them):
  runner:    <venv>/bin/runner validate FILE
  safe_load: python -c "yaml.safe_load(open(FILE))"  (PyYAML's pure-Python safe loader, builds the data only)
Wall time is taken around fork..wait4 (median of N), peak memory is wait4's ru_maxrss of the child (max of N).
Files (written to a temp dir):
  1mb-env        1,000,000 bytes: a valid spec with a big env mapping
  largest-env    exactly MAX_FILE_BYTES with MAX_VALUES values (env mapping): the biggest spec the limits accept
  largest-args   exactly MAX_FILE_BYTES, MAX_VALUES values as entrypoint.args (a list)
  alias-bomb     "billion laughs": 9 levels of 9 aliases (refused by runner)
  deep-nesting   200,000 nested '[' (refused by runner; PyYAML's C composer would crash, its Python one recurses)
  hello          examples/jobs/hello.yaml

    python bench/validate_cost.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runner.config.limits import MAX_FILE_BYTES, MAX_VALUES

VENV_BIN = Path(sys.executable).parent
RUNNER = [str(VENV_BIN / "runner")] if (VENV_BIN / "runner").exists() else [sys.executable, "-m", "runner"]
SAFE_LOAD = [sys.executable, "-c", "import sys, yaml; yaml.safe_load(open(sys.argv[1], encoding='utf-8'))"]
HEAD = "name: big\nentrypoint: hello.py\n"


def env_spec(size: int, entries: int) -> str:
    """A valid spec of exactly `size` bytes with `entries` env variables (values padded to fit)."""
    head = HEAD + "env:\n"
    lines = [f"  V{i}: " for i in range(entries)]
    room = size - len(head) - sum(len(line) + 1 for line in lines)
    per, extra = divmod(room, entries)
    return head + "".join(f"{line}{'v' * (per + (i < extra))}\n" for i, line in enumerate(lines))


def args_spec(size: int, items: int) -> str:
    """A valid spec of exactly `size` bytes whose entrypoint has `items` args."""
    head = "name: big\nentrypoint:\n  script: hello.py\n  args:\n"
    room = size - len(head) - items * len("  - \n")
    per, extra = divmod(room, items)
    return head + "".join(f"  - {'a' * (per + (i < extra))}\n" for i in range(items))


def alias_bomb() -> str:
    levels = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    levels += [f"{chr(97 + i)}: &{chr(97 + i)} [{', '.join(['*' + chr(96 + i)] * 9)}]" for i in range(1, 9)]
    return HEAD + "x-bomb:\n" + "".join(f"  {line}\n" for line in levels)


def files(folder: Path) -> dict[str, Path]:
    texts = {  # MAX_VALUES counts keys and values: 7 and 9 of them are the specs' own
        "1mb-env": env_spec(1_000_000, 9_000),
        "largest-env": env_spec(MAX_FILE_BYTES, (MAX_VALUES - 7) // 2),
        "largest-args": args_spec(MAX_FILE_BYTES, MAX_VALUES - 9),
        "alias-bomb": alias_bomb(),
        "deep-nesting": HEAD + "x: " + "[" * 200_000 + "\n",
    }
    out = {}
    for name, text in texts.items():
        out[name] = folder / f"{name}.yaml"
        out[name].write_text(text, encoding="utf-8")
    (folder / "hello.py").write_text("")
    out["hello"] = ROOT / "examples" / "jobs" / "hello.yaml"
    return out


def measure(argv: list[str], env: dict[str, str]) -> tuple[int, float, int]:
    """(exit code, wall s, peak RSS KiB) of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, wall, usage.ru_maxrss


def series(argv: list[str], env: dict[str, str], runs: int) -> tuple[int, float, int]:
    results = [measure(argv, env) for _ in range(runs)]
    codes = {rc for rc, _, _ in results}
    return max(codes, key=abs), statistics.median(w for _, w, _ in results), max(r for _, _, r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    env = dict(os.environ)
    print(f"# {platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"median wall of {args.runs} runs, max ru_maxrss")
    header = (f"{'file':<14} {'bytes':>9} | {'runner rc':>9} {'wall s':>7} {'RSS MiB':>8} | "
              f"{'safe_load rc':>12} {'wall s':>7} {'RSS MiB':>8} | {'wall x':>6} {'RSS x':>6}")
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in files(Path(tmp)).items():
            rc_r, wall_r, rss_r = series([*RUNNER, "validate", str(path)], env, args.runs)
            rc_y, wall_y, rss_y = series([*SAFE_LOAD, str(path)], env, args.runs)
            print(f"{name:<14} {path.stat().st_size:>9} | {rc_r:>9} {wall_r:>7.3f} {rss_r / 1024:>8.1f} | "
                  f"{rc_y:>12} {wall_y:>7.3f} {rss_y / 1024:>8.1f} | {wall_r / wall_y:>6.2f} {rss_r / rss_y:>6.2f}")


if __name__ == "__main__":
    main()
