#!/usr/bin/env bash
# cropbench's committed asv history, regenerated on this machine: every benchmark of the default grid
# over the last N commits of main (one result file per commit under results/<machine>/), which is
# what the published site draws. Commits this machine has measured already are skipped.
#   bash scripts/asv_history.sh                   # the last 20 commits of main
#   bash scripts/asv_history.sh --commits 5       # the last 5
#   bash scripts/asv_history.sh --range A..B      # any range asv accepts (git rev-list A..B)
#   bash scripts/asv_history.sh --machine NAME    # results under results/NAME/ (default: this host's name)
# asv builds its environment in .asv/env on first use (torch, torchvision and zarr pinned in
# asv.conf.json, ~6 GB, a few minutes), then installs each commit's cropbench into it. One round per
# benchmark: a track_* value is one call whatever the rounds (docs/asv.md, "The gate"). About 3 minutes
# per commit on 2 cores. Commit results/<machine>/ afterwards and publish with scripts/asv_publish.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/asv_grid.sh
source scripts/asv_grid.sh
commits=20
range=""
machine=""
usage="usage: bash scripts/asv_history.sh [--commits N | --range A..B] [--machine NAME]"
while [ $# -gt 0 ]; do
  case "$1" in
    --commits) commits=${2:?$usage}; shift 2 ;;
    --range) range=${2:?$usage}; shift 2 ;;
    --machine) machine=${2:?$usage}; shift 2 ;;
    *) echo "asv_history: error: unknown argument '$1'; $usage" >&2; exit 2 ;;
  esac
done
[[ "$commits" =~ ^[1-9][0-9]*$ ]] || { echo "asv_history: error: --commits must be a positive whole number, got '$commits'" >&2; exit 2; }
available=$(git rev-list --count main)
if [ -z "$range" ]; then
  if [ "$commits" -ge "$available" ]; then
    range=$(git rev-list --max-parents=0 main | tail -n 1)..main
  else
    range="main~$commits..main"
  fi
fi
bash scripts/setup.sh
asv() { env -u CROPBENCH_ASV_FULL .venv/bin/asv "$@"; }
if [ -n "$machine" ]; then
  asv machine --yes --machine "$machine" >/dev/null
elif [ ! -f "$HOME/.asv-machine.json" ]; then
  asv machine --yes >/dev/null
fi
echo "asv_history: the default grid over $range ($(git rev-list --count "$range") commits), one round each ..."
asv run --skip-existing-successful -a rounds=1 --show-stderr --bench "$DEFAULT_GRID" \
  ${machine:+--machine "$machine"} "$range"
echo "asv_history: done; commit results/ and publish with: bash scripts/asv_publish.sh"
