#!/usr/bin/env bash
# The tests in two tiers. Extra arguments go to pytest.
#   bash scripts/test.sh          # set up, ruff format --check, ruff check, mypy, then the fast tier:
#                                 #   pytest -m "not slow" (minutes; every test in it well under 30 s)
#   bash scripts/test.sh --slow   # set up, then the slow tier only: pytest -m slow (multi-process runs,
#                                 #   the CLI as a subprocess, asv regression runs; no lint)
# Everything: run both. .ci/run does, then scripts/asv_smoke.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
tier=fast
args=()
for arg in "$@"; do
  if [ "$arg" = --slow ]; then tier=slow; else args+=("$arg"); fi
done
bash scripts/setup.sh
if [ "$tier" = slow ]; then
  echo "== slow tier: pytest -m slow"
  exec .venv/bin/python -m pytest -m slow ${args[@]+"${args[@]}"}
fi
echo "== ruff format --check, ruff check and mypy"
.venv/bin/ruff format --check src tests benchmarks scripts
.venv/bin/ruff check src tests benchmarks scripts
.venv/bin/mypy src
# apart from src: checked in one call with src, mypy reports cropbench.api attributes as missing in scripts
.venv/bin/mypy scripts benchmarks
echo "== fast tier: pytest -m 'not slow' (the slow tier: bash scripts/test.sh --slow)"
exec .venv/bin/python -m pytest -m "not slow" ${args[@]+"${args[@]}"}
