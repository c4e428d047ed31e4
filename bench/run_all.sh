#!/usr/bin/env bash
# Runs the single-node benchmarks of docs/benchmarks.md, one after the other (never in parallel:
# they would disturb each other). Each prints a Markdown section on stdout and its progress on stderr.
#   bench/run_all.sh [RUNS]            RUNS: interleaved runs per launcher for overhead and restart (default 10)
# Environment: RUNNER_RUNS / TORCHRUN_RUNS / RUN_TIMEOUT for the crash-after-init benchmark (20 / 8 / 90).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${VIRTUAL_ENV:-}" && -f .venv/bin/activate ]]; then
    . .venv/bin/activate
fi
RUNS="${1:-10}"
python bench/agent_overhead.py --runs "$RUNS"
echo
python bench/restart_latency.py --runs "$RUNS"
echo
python bench/recovery.py --runs 5 --how raise
echo
python bench/recovery.py --runs 5 --how exit
echo
python bench/crash_after_init.py --runner-runs "${RUNNER_RUNS:-20}" --torchrun-runs "${TORCHRUN_RUNS:-8}" \
    --timeout "${RUN_TIMEOUT:-90}"
echo
python bench/timer_latency.py
echo
python bench/fifo_flood.py
echo
python bench/validate_cost.py
