#!/usr/bin/env bash
# The pull-request gate (docs/how-to/gate-a-change.md, "The gate"): `asv continuous` of a base commit against the
# commit under test, twice: the direct reader's instructions per crop (factor 1.03, cropbench.history.library_gate
# INSTRUCTIONS_FACTOR), then Track 1's decode path on the direct reader, factor 1.2, one round (the
# settings cropbench.history.regression measures, GATE_*). Exit code: 1 when a gated benchmark got worse
# by more than its factor (asv's table above ends in "PERFORMANCE DECREASED"), asv's own when it
# failed otherwise, 0 when neither call flagged anything; 2 for bad arguments, before anything runs.
#   bash scripts/gate.sh                   # origin/main against HEAD (HEAD~1 where origin/main is HEAD or absent)
#   bash scripts/gate.sh BASE [HEAD]       # any two commits, base first
#   bash scripts/gate.sh --dry-run [...]   # check, write the configuration, print the asv command; run nothing
# It runs .venv/bin/asv (scripts/setup.sh makes it) and asks nothing: the machine is recorded as "gate"
# in ~/.asv-machine.json when that entry is missing (what `asv machine --yes` would detect), so it
# runs without a terminal. asv's environment is the repository's (.asv/env, built on first use: about
# 6 GB and some minutes, reused by every later run and by scripts/asv_history.sh); each run's results,
# configuration and asv output go to a new folder .asv/gate/<time>-<base>-<head>/ (git-ignored, never
# under the committed results/), so results saved earlier are never compared as if measured now.
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: bash scripts/gate.sh [--dry-run] [BASE [HEAD]]"
fail() {
  echo "gate: error: $*" >&2
  exit 2
}
dry_run=0
positional=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    -h | --help)
      echo "$usage"
      exit 0
      ;;
    -*) fail "unknown option '$1'; $usage" ;;
    *) positional+=("$1") ;;
  esac
  shift
done
[ ${#positional[@]} -le 2 ] || fail "too many arguments (${positional[*]}); $usage"
[ -x .venv/bin/asv ] || fail ".venv/bin/asv not found; set up first: bash scripts/setup.sh"
commit_of() { git rev-parse --verify -q "$1^{commit}" 2>/dev/null; }
head=${positional[1]:-HEAD}
head_commit=$(commit_of "$head") || fail "HEAD '$head' is not a commit of this repository"
if [ ${#positional[@]} -ge 1 ]; then
  base=${positional[0]}
elif origin=$(commit_of origin/main) && [ "$origin" != "$head_commit" ]; then
  base=origin/main
else
  base=HEAD~1
fi
base_commit=$(commit_of "$base") || fail "BASE '$base' is not a commit of this repository; name one: $usage"
[ "$base_commit" != "$head_commit" ] ||
  fail "BASE '$base' and HEAD '$head' are the same commit (${head_commit:0:10}); the gate compares two different commits"

run_dir=.asv/gate/$(date -u +%Y%m%dT%H%M%SZ)-${base_commit:0:10}-${head_commit:0:10}
mkdir -p "$run_dir"
# The machine entry (asked for interactively by asv otherwise), the private configurations and the
# asv commands (one per step, written to <step>.args, one argument a line; the step names printed),
# from the gate's settings in cropbench.history.regression and cropbench.history.library_gate.
steps=$(.venv/bin/python - "$run_dir" "$base_commit" "$head_commit" <<'EOF'
import json
import sys
from pathlib import Path

from cropbench.history import library_gate
from cropbench.history.regression import GATE_ATTRIBUTES, GATE_BENCH, GATE_FACTOR, GATE_INSTRUCTIONS_BENCH

run_dir, base, head = Path(sys.argv[1]).resolve(), sys.argv[2], sys.argv[3]
try:
    machine = library_gate.prepare_machine("gate", library_gate.machine_file())
except library_gate.GateError as error:
    sys.exit(f"gate: error: {error}")
gate = library_gate.LibraryGate(
    "cropbench", "asv.conf.json", GATE_BENCH, GATE_FACTOR, GATE_ATTRIBUTES, instructions_bench=GATE_INSTRUCTIONS_BENCH
)
for name, bench, factor in gate.steps():
    results = run_dir / ("results" if name == "wall-time" else f"results-{name}")
    config_path = run_dir / f"asv.gate.{name}.conf.json"
    config_path.write_text(json.dumps(library_gate.private_config(gate, results), indent=4) + "\n")
    command = library_gate.asv_command(gate, config_path, base, head, factor, machine, bench)
    (run_dir / f"{name}.args").write_text("\n".join(command[1:]) + "\n")
    print(name)
EOF
) || exit 2
echo "gate: $base (${base_commit:0:10}) -> $head (${head_commit:0:10}); asv's output also in $run_dir/continuous.txt"
rc=0
for step in $steps; do
  mapfile -t command <"$run_dir/$step.args"
  if [ "$dry_run" = 1 ]; then
    printf '%q ' .venv/bin/asv "${command[@]}"
    echo
    continue
  fi
  step_rc=0
  env -u CROPBENCH_ASV_FULL .venv/bin/asv "${command[@]}" </dev/null 2>&1 | tee -a "$run_dir/continuous.txt" ||
    step_rc=${PIPESTATUS[0]}
  # asv's first failure (not 0, not 1) is the exit code; otherwise 1 when any step flagged
  if [ "$rc" = 0 ] || { [ "$rc" = 1 ] && [ "$step_rc" != 0 ]; }; then
    rc=$step_rc
  fi
done
[ "$dry_run" = 0 ] || exit 0
if [ "$rc" = 1 ] && grep -q "PERFORMANCE DECREASED" "$run_dir/continuous.txt"; then
  echo "gate: FAILED: a gated benchmark got worse by more than its factor (rows marked + above)"
elif [ "$rc" != 0 ]; then
  echo "gate: FAILED: asv continuous exited $rc (see $run_dir/continuous.txt)"
else
  echo "gate: passed: no gated benchmark got worse by more than its factor"
fi
exit "$rc"
