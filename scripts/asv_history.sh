#!/usr/bin/env bash
# cropbench's committed asv history, regenerated on this machine: every benchmark of the default grid
# over the last N commits of main (one result file per commit under results/<machine>/), which is
# what the published site draws. Commits this machine has measured already are skipped.
#   bash scripts/asv_history.sh                   # the last 20 commits of main
#   bash scripts/asv_history.sh --commits 5       # the last 5
#   bash scripts/asv_history.sh --range A..B      # any range asv accepts (git rev-list A..B)
#   bash scripts/asv_history.sh --machine NAME    # results under results/NAME/ (default: this host's name)
#   bash scripts/asv_history.sh --bench '^instructions\.'   # only the benchmarks this regex selects
#                                                 # (asv's -b; default: the default grid, DEFAULT_GRID)
# asv builds its environment in .asv/env on first use (torch, torchvision and zarr pinned in
# asv.conf.json, ~6 GB, a few minutes), then installs each commit's cropbench into it. One round per
# benchmark: a track_* value is one call whatever the rounds (docs/how-to/gate-a-change.md, "The gate"). About 7 minutes
# per commit on 2 cores. Commit results/<machine>/ afterwards and publish with scripts/asv_publish.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/asv_grid.sh
source scripts/asv_grid.sh
commits=20
range=""
machine=""
bench=""
usage="usage: bash scripts/asv_history.sh [--commits N | --range A..B] [--machine NAME] [--bench REGEX]"
while [ $# -gt 0 ]; do
  case "$1" in
    --commits) commits=${2:?$usage}; shift 2 ;;
    --range) range=${2:?$usage}; shift 2 ;;
    --machine) machine=${2:?$usage}; shift 2 ;;
    --bench) bench=${2:?$usage}; shift 2 ;;
    *) echo "asv_history: error: unknown argument '$1'; $usage" >&2; exit 2 ;;
  esac
done
fail() {
  echo "asv_history: error: $*" >&2
  exit 2
}
[[ "$commits" =~ ^[1-9][0-9]*$ ]] || fail "--commits must be a positive whole number, got '$commits'"
# The machine name is a folder under results/: letters, digits, '.', '-' and '_', no '..'.
if [ -n "$machine" ] && { [[ ! "$machine" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || [[ "$machine" == *..* ]]; }; then
  fail "--machine '$machine' is not a machine name; expected letters, digits, '.', '-' and '_' (no '..'), such as gpu-node-1"
fi
if [ -z "$range" ]; then
  git rev-parse --verify -q main >/dev/null || fail "this repository has no branch main; pass --range A..B"
  available=$(git rev-list --count main)
  if [ "$commits" -ge "$available" ]; then
    range=$(git rev-list --max-parents=0 main | tail -n 1)..main
  else
    range="main~$commits..main"
  fi
fi
# asv hands the range to git rev-list: checked here, so a bad one is one line, not asv's traceback.
if [[ "$range" == -* ]] || ! count=$(git rev-list --count "$range" -- 2>/dev/null); then
  fail "--range '$range' is not a commit range of this repository; expected A..B, such as main~5..main"
fi
[ "$count" -gt 0 ] || fail "--range '$range' holds no commits; expected A..B with B ahead of A"
if [ -n "$bench" ]; then
  # asv takes -b as a Python regex: checked here, so a bad one is one line, not asv's traceback.
  .venv/bin/python -c 'import re, sys; re.compile(sys.argv[1])' "$bench" 2>/dev/null ||
    fail "--bench '$bench' is not a regular expression; expected one such as '^instructions\.'"
fi
bash scripts/setup.sh
asv() { env -u CROPBENCH_ASV_FULL .venv/bin/asv "$@"; }
if [ -n "$machine" ]; then
  # The machine's full description, as asv detects it or as its committed machine.json has it (a
  # kernel update would otherwise start a second series on every graph). `asv machine --yes --machine
  # NAME` would record only the fields that differ from what it detects, and results measured with
  # such an entry lack the rest, so they do not join the committed ones on the site.
  .venv/bin/python - "$machine" <<'EOF'
import json
import sys
from pathlib import Path

from asv.machine import Machine, MachineCollection

info = Machine.get_defaults()
committed = Path("results", sys.argv[1], "machine.json")
if committed.exists():
    info.update({key: value for key, value in json.loads(committed.read_text()).items() if key in info})
info["machine"] = sys.argv[1]
MachineCollection.save(sys.argv[1], info)
EOF
elif [ ! -f "$HOME/.asv-machine.json" ]; then
  asv machine --yes >/dev/null
fi
echo "asv_history: ${bench:-the default grid} over $range ($count commits), one round each ..."
asv run --skip-existing-successful -a rounds=1 --show-stderr --bench "${bench:-$DEFAULT_GRID}" \
  ${machine:+--machine "$machine"} "$range"
echo "asv_history: done; commit results/ and publish with: bash scripts/asv_publish.sh"
