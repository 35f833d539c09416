#!/usr/bin/env bash
# asv publish, then make html/ self-contained (no CDN), so it can be browsed offline or pushed to
# GitHub Pages as is. Extra arguments go to `asv publish`.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/asv publish "$@"
.venv/bin/python scripts/asv_offline_html.py html
