#!/usr/bin/env bash
# Build the documentation site (README.md as its home page, then docs/) into site/, offline:
# mkdocs with the Material theme, the API reference generated from the docstrings by mkdocstrings,
# every link and anchor checked (--strict). Extra arguments go to
# `mkdocs build` (for example --site-dir html/docs).
set -euo pipefail
cd "$(dirname "$0")/.."
python=.venv/bin/python
[ -x "$python" ] || python=python3
if ! "$python" -c "import mkdocs, material, mkdocstrings_handlers.python" 2>/dev/null; then
  echo "docs_build: mkdocs, its theme or mkdocstrings are not installed; run: $python -m pip install -e '.[docs]'" >&2
  exit 2
fi
NO_MKDOCS_2_WARNING=1 "$python" -m mkdocs build --strict --quiet "$@"
