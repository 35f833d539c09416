#!/usr/bin/env bash
# asv publish, then make the site self-contained (no CDN), so it can be browsed offline or pushed to
# GitHub Pages as is; for cropbench's own site (asv.conf.json) the documentation site goes beside it,
# in html/docs/. Extra arguments go to `asv publish`:
#   bash scripts/asv_publish.sh                                # html/ and html/docs/
#   bash scripts/asv_publish.sh --config asv.zarr.conf.json    # html-zarr/ (zarr-python's releases)
#   bash scripts/asv_publish.sh --html-dir /tmp/site           # anywhere else
# asv publish empties the site folder first: an existing folder is replaced only when this script
# published it (its marker, cropbench.history.offline_html's SITE_MARKER); any other folder that holds
# something is refused in one line. A format library's history needs its release-history repository
# (scripts/release_history.py); without it this says in one line how to build it.
set -euo pipefail
cd "$(dirname "$0")/.."
config=asv.conf.json
html_override=""
previous=""
for argument in "$@"; do
  case "$previous" in
    --config) config=$argument ;;
    --html-dir | -o) html_override=$argument ;;
  esac
  case "$argument" in
    --config=*) config=${argument#--config=} ;;
    --html-dir=*) html_override=${argument#--html-dir=} ;;
  esac
  previous=$argument
done
[ -f "$config" ] || { echo "asv_publish: error: no asv configuration $config" >&2; exit 2; }
# The configuration's repo and site folder as asv resolves them (from the configuration's folder),
# checked before asv runs: an unreadable configuration or a folder this script did not publish ends
# here in one line.
site=$(.venv/bin/python - "$config" "$html_override" <<'EOF'
import sys
from pathlib import Path

from asv import util
from asv.config import Config

from cropbench.history.offline_html import refusal

config, override = Path(sys.argv[1]), sys.argv[2]
try:
    conf = Config.load(str(config))
except (ValueError, TypeError, OSError, util.UserError) as error:
    reason = " ".join(str(error).split())
    sys.exit(f"asv_publish: error: {config} is not an asv configuration ({reason}); expected asv's JSON with a repo")
base = config.resolve().parent
repo = str(conf.repo)
html_dir = base / (override or str(getattr(conf, "html_dir", "html")))
reason = refusal(html_dir)
if reason:
    sys.exit(f"asv_publish: error: refusing to replace {html_dir}: {reason}; remove it yourself or pass --html-dir")
print(repo if "://" in repo else base / repo)
print(html_dir)
EOF
) || exit 2
{
  read -r repo
  read -r html_dir
} <<<"$site"
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
