#!/usr/bin/env bash
# asv publish, then make the site self-contained (no CDN), so it can be browsed offline or pushed to
# GitHub Pages as is; for cropbench's own site (asv.conf.json) the documentation site goes beside it,
# in html/docs/. Extra arguments go to `asv publish`:
#   bash scripts/asv_publish.sh                                # html/ and html/docs/
#   bash scripts/asv_publish.sh --config asv.zarr.conf.json    # html-zarr/ (zarr-python's releases)
# A format library's history needs its release-history repository (scripts/release_history.py);
# without it this says in one line how to build it.
set -euo pipefail
cd "$(dirname "$0")/.."
config=asv.conf.json
previous=""
for argument in "$@"; do
  case "$argument" in
    --config=*) config=${argument#--config=} ;;
    *) [ "$previous" = "--config" ] && config=$argument ;;
  esac
  previous=$argument
done
[ -f "$config" ] || { echo "asv_publish: error: no asv configuration $config" >&2; exit 2; }
# repo and html_dir of the configuration (asv's JSON allows // comments).
read -r repo html_dir < <(.venv/bin/python - "$config" <<'EOF'
import sys
from asv import util
conf = util.load_json(sys.argv[1], js_comments=True)
print(conf.get("repo", "."), conf.get("html_dir", "html"))
EOF
)
if [[ "$repo" != *://* && ! -d "$repo" ]]; then
  library=$(basename "$repo")
  echo "asv_publish: error: $config measures the release history in $repo, which does not exist;" \
    "build it with: .venv/bin/python scripts/release_history.py $library" >&2
  exit 2
fi
.venv/bin/asv publish "$@"
.venv/bin/python scripts/asv_offline_html.py "$html_dir"
.venv/bin/python scripts/asv_site_tidy.py "$html_dir"
if [ "$config" = asv.conf.json ]; then
  if .venv/bin/python -c "import mkdocs, material" 2>/dev/null; then
    bash scripts/docs_build.sh --site-dir "$html_dir/docs"
    echo "asv_publish: documentation in $html_dir/docs/"
  else
    echo "asv_publish: documentation not built (no mkdocs); to add it: .venv/bin/pip install -e '.[docs]'" >&2
  fi
fi
