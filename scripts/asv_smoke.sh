#!/usr/bin/env bash
# CI's asv check: the suites import and are well formed (`asv check`, every class), and every
# benchmark of the default grid runs once in the current environment (`asv run --python=same
# --quick`, which exits 2 if any benchmark fails). The full-grid classes (`Full*`, `*Latency`) are
# left out of the run: without CROPBENCH_ASV_FULL=1 each of their thousands of parameter sets only
# skips, which took most of this script's time (tests/test_benchmarks.py checks that they skip and
# that one parameter set of each runs). Nothing is timed for a verdict and no result is saved. A private HOME
# holds the machine entry, so ~/.asv-machine.json is neither needed nor touched; the machine.json
# asv writes under results/ for it is removed again.
#
# asv's own output (tables, one "asv: skipped: ..." block per skipped parameter set, and a progress
# counter that ends at 50% in this mode) goes to out/asv-smoke.log; the terminal gets a summary:
# which benchmarks ran, which were skipped and why, which failed, and a last line
# "asv smoke: OK" or "asv smoke: FAILED".
#   bash scripts/asv_smoke.sh                  # check and run, then the summary
#   bash scripts/asv_smoke.sh --summarise LOG  # only the summary of an earlier run's log
set -euo pipefail
cd "$(dirname "$0")/.."
LOG=out/asv-smoke.log
# shellcheck source=scripts/asv_grid.sh
source scripts/asv_grid.sh

# summarise LOG RC: what ran, what was skipped (grouped by reason) and what failed, then the verdict.
summarise() {
  local python=.venv/bin/python
  [ -x "$python" ] || python=python3
  "$python" - "$1" "$2" <<'EOF'
import re
import sys

log, rc = sys.argv[1], int(sys.argv[2])
status: dict[str, str] = {}
skips: dict[str, list[str]] = {}
current = None
for line in open(log, encoding="utf-8", errors="replace"):
    started = re.match(r"\[\s*[\d.]+%\] ·+ (\S+)\s+(ok|failed)\s*$", line)
    if started:
        current = started.group(1)
        status[current] = started.group(2)
        continue
    skipped = re.search(r"asv: skipped: (\w+)\((['\"])(.*)\2\)", line)
    if skipped and current:
        skips.setdefault(current, []).append(skipped.group(3))
ran = [name for name, state in status.items() if state == "ok" and name not in skips]
failed = [name for name, state in status.items() if state == "failed"]
print(f"\nasv smoke summary ({len(status)} benchmarks, each run once; asv's full output: {log})")
print(f"  ran:     {len(ran)} benchmarks, every parameter set: {', '.join(ran) or 'none'}")
by_reason: dict[str, list[str]] = {}
for name, reasons in skips.items():
    for reason in dict.fromkeys(reasons):
        by_reason.setdefault(reason, []).append(name)
count = sum(len(reasons) for reasons in skips.values())
print(f"  skipped: {len(skips)} benchmarks ({count} parameter sets), on purpose, by the reason they give:")
for reason, names in by_reason.items():
    print(f"    - {reason}\n      {', '.join(names)}")
print(f"  failed:  {len(failed)} benchmarks{': ' + ', '.join(failed) if failed else ''}")
if rc == 0 and not failed and status:
    print("asv smoke: OK: every benchmark above ran once or skipped for the reason shown")
else:
    print(f"asv smoke: FAILED (asv run exit code {rc}; see {log})")
    sys.exit(rc or 1)
EOF
}

if [ "${1:-}" = "--summarise" ]; then
  summarise "$2" 0
  exit
fi

bash scripts/setup.sh
asv_home=$(mktemp -d)
trap 'rm -rf "$asv_home" results/asv-smoke' EXIT
asv() { env -u CROPBENCH_ASV_FULL HOME="$asv_home" .venv/bin/asv "$@"; }
asv machine --yes --machine asv-smoke >/dev/null
asv check --python=same
mkdir -p out
echo "asv smoke: running every benchmark of the default grid once (output in $LOG) ..."
echo "  (full-grid classes Full*/*Latency: checked by asv check above, not run; they need CROPBENCH_ASV_FULL=1)"
rc=0
asv run --python=same --quick --dry-run --machine asv-smoke --show-stderr --bench "$DEFAULT_GRID" >"$LOG" 2>&1 || rc=$?
[ "$rc" = 0 ] || tail -n 40 "$LOG"
summarise "$LOG" "$rc"
