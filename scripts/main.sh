#!/usr/bin/env bash
# The main job: set up, generate the smoke plate, run every track's smoke preset, print the summary,
# write out/smoke/results.{jsonl,csv} and plots. Extra arguments go to `cropbench smoke`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m cropbench smoke "$@"
