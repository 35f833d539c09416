#!/usr/bin/env bash
# Set up, check lint and types, then run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== ruff format --check, ruff check and mypy"
.venv/bin/ruff format --check src tests benchmarks scripts
.venv/bin/ruff check src tests benchmarks scripts
.venv/bin/mypy src
exec .venv/bin/python -m pytest "$@"
