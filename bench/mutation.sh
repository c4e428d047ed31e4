#!/usr/bin/env bash
# The mutation score of the pure modules (issue 39, point 8; docs/testing.md "Mutation score"). Slow (about an hour on
# one core): never in CI. mutmut runs in a venv of its own and in a scratch copy of the working tree, with its config
# bench/mutation/pyproject.toml copied in as pyproject.toml, so the project's pins and pyproject.toml stay untouched.
#
#   bench/mutation.sh [WORKDIR]          # default /tmp/runner-mutation; prints the score per module at the end
#   MUT_VENV=/tmp/mut-venv CHILDREN=1    # where mutmut lives (made if missing), how many mutants run at once
#   OVER=/tmp/runner-mutation            # re-run only that full run's survivors (and changed modules), score over it
#   ONLY='runner.hangs.*'                # only the mutants of these names (mutmut's patterns; one module's: its rows)
#
# Run it niced on a shared machine: `nice -n 19 bench/mutation.sh`. Re-running in the same WORKDIR after adding tests
# re-checks every mutant (the copy is made anew). `cd WORKDIR && $MUT_VENV/bin/mutmut show NAME` shows one mutant.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${1:-/tmp/runner-mutation}
VENV=${MUT_VENV:-/tmp/mut-venv}
MUTMUT_VERSION=3.8.1

if [ ! -x "$VENV/bin/mutmut" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "mutmut==$MUTMUT_VERSION"
fi
# runner's own dependencies (pytest, hypothesis, transitions, structlog...) come from the project's venv, after
# mutmut's: a plain path line, so that venv's .pth files (runner's editable install among them) are not run and
# `runner` is imported from mutmut's mutants/ copy only.
deps=$("$ROOT/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
echo "$deps" > "$site/zz_runner_deps.pth"

rm -rf "$WORK"
mkdir -p "$WORK"
(cd "$ROOT" && git ls-files -co --exclude-standard -z -- runner tests examples schemas docs \
    | tar --null -T - -cf -) | tar -C "$WORK" -xf -
sed "s|@BASETEMP@|$WORK/pytest-tmp|" "$ROOT/bench/mutation/pyproject.toml" > "$WORK/pyproject.toml"

cd "$WORK"
"$VENV/bin/mutmut" --version || true
if [ -n "${ONLY:-}" ]; then
    read -r -a only <<< "$ONLY"
    "$VENV/bin/mutmut" run --max-children "${CHILDREN:-1}" "${only[@]}"
    "$VENV/bin/python" "$ROOT/bench/mutation/score.py" "$WORK"
    exit 0
fi
if [ -z "${OVER:-}" ]; then
    "$VENV/bin/mutmut" run --max-children "${CHILDREN:-1}"
    "$VENV/bin/python" "$ROOT/bench/mutation/score.py" "$WORK"
    exit 0
fi
# OVER=OLDWORK: re-run only what an earlier full run in OLDWORK left (its survivors), and every mutant of a module
# whose source changed since (its mutants' names may have moved); the others keep OLDWORK's verdicts.
mapfile -t names < <("$VENV/bin/python" "$ROOT/bench/mutation/score.py" "$OVER" --survivors | sed -n 's/^[a-z ]*: //p')
mapfile -t changed < <("$VENV/bin/python" - "$ROOT/bench/mutation/pyproject.toml" "$OVER" <<'PY'
import sys, tomllib, filecmp
from pathlib import Path
for module in tomllib.loads(Path(sys.argv[1]).read_text())["tool"]["mutmut"]["only_mutate"]:
    old = Path(sys.argv[2], module)
    if not old.exists() or not filecmp.cmp(module, old, shallow=False):
        print(module.removesuffix(".py").replace("/", ".") + ".*")
PY
)
echo "re-running ${#names[@]} survivors of $OVER and every mutant of: ${changed[*]:-(no module changed)}"
"$VENV/bin/mutmut" run --max-children "${CHILDREN:-1}" "${names[@]}" "${changed[@]}"
"$VENV/bin/python" "$ROOT/bench/mutation/score.py" "$WORK" --over "$OVER"
