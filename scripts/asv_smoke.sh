#!/usr/bin/env bash
# CI's asv check: the suites import and are well formed (`asv check`), and every benchmark of the
# default grid runs once in the current environment (`asv run --python=same --quick`, which exits
# 2 if any benchmark fails). Nothing is timed for a verdict and no result is saved. A private HOME
# holds the machine entry, so ~/.asv-machine.json is neither needed nor touched; the machine.json
# asv writes under results/ for it is removed again.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
asv_home=$(mktemp -d)
trap 'rm -rf "$asv_home" results/asv-smoke' EXIT
asv() { env -u CROPBENCH_ASV_FULL HOME="$asv_home" .venv/bin/asv "$@"; }
asv machine --yes --machine asv-smoke >/dev/null
asv check --python=same
asv run --python=same --quick --dry-run --machine asv-smoke --show-stderr
echo "asv smoke: every benchmark of the default grid ran"
