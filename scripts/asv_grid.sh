# The default grid, as asv's --bench regex (re.search on the benchmark's name): every class but the
# full grid's (`Full*`, `*Latency`, which run only with CROPBENCH_ASV_FULL=1). Sourced by
# scripts/asv_smoke.sh and scripts/asv_history.sh.
# shellcheck shell=bash disable=SC2034
DEFAULT_GRID='^(?!(track[0-9]+\.(Full[A-Za-z]*|[A-Za-z]*Latency))\.)'
