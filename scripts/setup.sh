#!/usr/bin/env bash
# Create .venv (Python 3.11) with cropbench, its dev tools and the object-store extra; a no-op when up to date.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
stamp=.venv/.cropbench-setup
want=$(cat pyproject.toml setup.py src/cropbench/formats/_native.c | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
started=$SECONDS
echo "setup: building .venv from pyproject.toml (first run: torch, torchvision, zarr and the dev tools;" \
  "about 2 minutes, silent while pip works; later runs skip this)"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
echo "setup: upgrading pip"
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
echo "setup: installing cropbench with its dependencies (the longest step)"
# [remote]: the object-store clients and the loopback S3 server the remote tests start (tests/test_remote.py).
# torch/torchvision are pinned in pyproject.toml (2.14.1 / 0.29.1); pip takes them from its configured index.
.venv/bin/python -m pip install -q -e ".[dev,remote]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import cropbench, torch, zarr" || { echo "setup failed: cropbench did not import" >&2; exit 1; }
echo "$want" > "$stamp"
echo "setup: .venv ready in $((SECONDS - started)) s"
