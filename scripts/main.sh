#!/usr/bin/env bash
# The main job: set up, generate the full synthetic plate (16 fields, larger than the reader's cache) into
# out/main/ unless it is there, then ask `cropbench advise` what to do with it for a small CNN: read path,
# workers, batch, prefetch, pinning, convert or read in place, each from whole epochs, then the recommendation
# run once more as a training loop. About 5 minutes on 2 cores after setup. Extra arguments go to
# `cropbench advise` (say --model resnet18, or --budget-min 10 for more rounds).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=out/main
plate=$out/plate.zarr
[ -d "$plate" ] || .venv/bin/python -m cropbench generate --preset full --out "$plate"
exec .venv/bin/python -m cropbench advise --plate "$plate" --model smallcnn --budget-min 4 --out "$out" "$@"
