#!/usr/bin/env bash
# Create .venv-peers: cropbench with pytest and every peer loader (dask, spatialdata 0.7.3).
#
# Its own environment because spatialdata 0.7.3, the newest release for Python 3.11, pins
# dask<2026.1.2 and (through anndata) pandas<3, while the dev extra's ome-zarr>=0.16 excludes
# dask 2026.1.*: ".[dev,peers]" cannot be resolved, and installing spatialdata into .venv would
# downgrade dask, pandas and ome-zarr there. A no-op when up to date.
#   bash scripts/setup_peers.sh
#   .venv-peers/bin/python -m cropbench run --plate data/full.zarr --peers --out out/peers
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
stamp=.venv-peers/.cropbench-setup
want=$(cat pyproject.toml setup.py src/cropbench/formats/_native.c | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x .venv-peers/bin/python ] || "$PYTHON" -m venv .venv-peers
.venv-peers/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
.venv-peers/bin/python -m pip install -q -e ".[peers]" "pytest>=8" 2>&1 | grep -v "^WARNING: Location" || true
.venv-peers/bin/python -c "import cropbench, dask, spatialdata, torch" \
  || { echo "setup_peers failed: cropbench, dask or spatialdata did not import" >&2; exit 1; }
echo "$want" > "$stamp"
