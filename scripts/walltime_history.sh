#!/usr/bin/env bash
# A format library's wall-time history, measured twice: the library's read-path wall-time benchmarks
# over every release, in two separate passes (run 1 over every release, then run 2), each into its own
# results folder, so that each release has two values and the run-to-run spread shows beside any step
# between releases. Each pass runs from a private copy of asv.<library>.conf.json whose results go to
# its own folder (cropbench.history.library_gate.private_config; the environment, the suites and the
# harness stay this repository's), one `asv run "v<release>^!"` per release, one round.
#   bash scripts/walltime_history.sh zarr               # results-zarr-walltime/run-1, run-2
#   bash scripts/walltime_history.sh ome-arrow          # results-ome-arrow-walltime/run-1, run-2
#   bash scripts/walltime_history.sh zarr 3.1.5 3.1.6   # these releases only (default: every recorded one)
#   --machine NAME   asv's machine name (default: the one asv knows; its entry is written where missing)
#   --out DIR        the runs' parent folder (default results-<library>-walltime)
#   --runs N         how many passes (default 2: run-1, run-2); --runs 1 times one pass
#   --bench REGEX    asv's -b (default: the library's read path, below)
#   --dry-run        print the asv commands, run and write nothing
# Benchmarks: zarr, zarr_stages.ZarrStages (store, codec pipeline, indexing and assembly) and
# track1.Fetch.track_relative_cost (the whole crop through zarr-python, and the direct reader over the
# same plates); ome-arrow, track1.ArrowFetch (zero-copy and the reference script's path).
# A release already measured in a run's folder is skipped (asv's --skip-existing-successful), so an
# interrupted run resumes where it stopped; remove the folder to measure again. cropbench is installed
# from branch main when asv installs each release: leave main where it is while this runs (a line
# says so if it moves). Then: cropbench history-spread <out>/run-1 <out>/run-2 --config <asv config>.
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: bash scripts/walltime_history.sh zarr|ome-arrow [--machine NAME] [--out DIR] [--runs N] [--bench REGEX]"
usage+=" [--dry-run] [RELEASE ...]"
fail() {
  echo "walltime_history: error: $*" >&2
  exit 2
}
[ $# -gt 0 ] || fail "$usage"
library=$1
shift
case "$library" in
  zarr) bench='^(zarr_stages\.ZarrStages|track1\.Fetch\.track_relative_cost)' ;;
  ome-arrow) bench='^track1\.ArrowFetch' ;;
  *) fail "unknown library '$library'; $usage" ;;
esac
machine=""
out="results-$library-walltime"
runs=2
dry_run=""
releases=()
while [ $# -gt 0 ]; do
  case "$1" in
    --machine) machine=${2:?$usage}; shift 2 ;;
    --out) out=${2:?$usage}; shift 2 ;;
    --runs) runs=${2:?$usage}; shift 2 ;;
    --bench) bench=${2:?$usage}; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -*) fail "unknown option '$1'; $usage" ;;
    *) releases+=("$1"); shift ;;
  esac
done
[[ "$runs" =~ ^[1-9]$ ]] || fail "--runs must be a whole number from 1 to 9, got '$runs'"
# The machine name is a folder under each run's results: letters, digits, '.', '-' and '_', no '..'.
if [ -n "$machine" ] && { [[ ! "$machine" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || [[ "$machine" == *..* ]]; }; then
  fail "--machine '$machine' is not a machine name; expected letters, digits, '.', '-' and '_' (no '..')"
fi
[ -x .venv/bin/asv ] || fail ".venv has no asv; run bash scripts/setup.sh first"
py() { PYTHONPATH=src .venv/bin/python "$@"; }
py -c 'import re, sys; re.compile(sys.argv[1])' "$bench" 2>/dev/null ||
  fail "--bench '$bench' is not a regular expression"
[ "${#releases[@]}" -gt 0 ] || mapfile -t releases < <(py -c '
import sys
from cropbench.history.releases import recorded_releases
print("\n".join(recorded_releases(sys.argv[1])))' "$library")
[ "${#releases[@]}" -gt 0 ] || fail "no recorded releases of $library in scripts/release_histories.json"
# The release history asv reads: it must exist, hold each release's tag, and have the recorded commits
# (results of other commits would not be drawn with the committed ones).
history=$(py -c '
import sys
from cropbench.history.library_gate import LIBRARY_GATES, library_repository
print(library_repository(LIBRARY_GATES[sys.argv[1]]))' "$library")
[ -d "$history" ] || fail "no release history in $history; build it with: .venv/bin/python scripts/release_history.py $library"
for release in "${releases[@]}"; do
  git -C "$history" rev-parse -q --verify "v$release^{commit}" >/dev/null ||
    fail "$history has no release $release (tag v$release); expected one of the recorded releases"
done
differing=$(py -c '
import sys
from pathlib import Path
from cropbench.history.releases import differing_commits
print("; ".join(differing_commits(sys.argv[1], Path(sys.argv[2]))))' "$library" "$history")
[ -z "$differing" ] || fail "$history differs from the recorded commits ($differing); rebuild it with:" \
  ".venv/bin/python scripts/release_history.py $library --force"
if [ -z "$dry_run" ]; then
  machine=$(py -c '
import sys
from cropbench.history.library_gate import machine_file, prepare_machine
print(prepare_machine(sys.argv[1] or None, machine_file()))' "$machine")
fi
[[ "$out" = /* ]] || out="$PWD/$out"
configs=$(mktemp -d)
trap 'rm -rf "$configs"' EXIT
harness=$(git rev-parse --short main)
say() { echo "walltime_history: $*"; }
minutes() { awk -v s="$1" 'BEGIN { printf "%.1f min", s / 60 }'; }
say "$library: ${#releases[@]} releases (${releases[*]}), $runs runs into $out/run-1 .. run-$runs"
say "benchmarks '$bench', machine ${machine:-asv default}, one round; harness cropbench main at $harness"
if [ -n "$dry_run" ]; then
  for run in $(seq 1 "$runs"); do
    say "run $run: a copy of asv.$library.conf.json with results_dir $out/run-$run (library_gate.private_config), then"
    for release in "${releases[@]}"; do
      echo "  .venv/bin/asv run --config <that copy> --machine ${machine:-<asv default>} -a rounds=1 --show-stderr" \
        "--skip-existing-successful -b '$bench' 'v$release^!'"
    done
  done
  exit 0
fi
started=$SECONDS
failed=()
for run in $(seq 1 "$runs"); do
  results="$out/run-$run"
  config="$configs/asv.$library.run-$run.conf.json"
  py -c '
import json, sys
from pathlib import Path
from cropbench.history.library_gate import LIBRARY_GATES, private_config
config = private_config(LIBRARY_GATES[sys.argv[1]], Path(sys.argv[2]))
Path(sys.argv[3]).write_text(json.dumps(config, indent=2))' "$library" "$results" "$config"
  run_started=$SECONDS
  index=0
  for release in "${releases[@]}"; do
    index=$((index + 1))
    now=$(git rev-parse --short main)
    [ "$now" = "$harness" ] ||
      say "WARNING: branch main moved from $harness to $now: $release is measured by another cropbench"
    say "run $run/$runs, $library $release ($index/${#releases[@]}) ..."
    release_started=$SECONDS
    if ! env -u CROPBENCH_ASV_FULL .venv/bin/asv run --config "$config" --machine "$machine" -a rounds=1 \
      --show-stderr --skip-existing-successful -b "$bench" "v$release^!"; then
      failed+=("run $run $release")
      say "run $run/$runs, $library $release: asv failed (exit code above)"
    fi
    say "run $run/$runs, $library $release: $(minutes $((SECONDS - release_started)))" \
      "(run $run so far $(minutes $((SECONDS - run_started))), all $(minutes $((SECONDS - started))))"
  done
  say "run $run/$runs done in $(minutes $((SECONDS - run_started))): $results"
done
say "done in $(minutes $((SECONDS - started)))"
[ "$runs" -lt 2 ] ||
  say "compare the runs: .venv/bin/cropbench history-spread $out/run-1 $out/run-2 --config asv.$library.conf.json"
if [ "${#failed[@]}" -gt 0 ]; then
  say "asv failed for: ${failed[*]}; rerun the same command to measure what is missing"
  exit 1
fi
