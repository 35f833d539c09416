"""Make asv's published site work without a network: local copies instead of CDN links.

``asv publish`` writes html/index.html with <script>/<link> tags that load jQuery, flot,
bootstrap, stupidtable and blueimp-md5 from CDNs; on an air-gapped cluster the page then shows
nothing. This copies vendor/asv-www/ (filled from the npm registry by scripts/asv_vendor.sh) to
html/vendor/ and points every such tag at the copy. A CDN link it has no copy for is an error,
so an asv upgrade that needs another library fails loudly instead of publishing a blank page.
It also leaves ``SITE_MARKER`` in the site: ``asv publish`` empties its folder first, and
scripts/asv_publish.sh lets it do so only to a folder that holds the marker (or nothing).

    .venv/bin/python scripts/asv_offline_html.py html      (scripts/asv_publish.sh runs it)
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

from cropbench.history import REPO

VENDOR = REPO / "vendor" / "asv-www"
#: Last path component of each CDN URL asv 0.6 uses -> the vendored copy (relative to html/).
LOCAL_COPIES = {
    "jquery-3.3.1.min.js": "vendor/js/jquery-3.3.1.min.js",
    "jquery.flot.min.js": "vendor/js/jquery.flot.js",
    "jquery.flot.time.min.js": "vendor/js/jquery.flot.time.js",
    "jquery.flot.selection.min.js": "vendor/js/jquery.flot.selection.js",
    "jquery.flot.categories.min.js": "vendor/js/jquery.flot.categories.js",
    "jquery.flot.orderBars.js": "vendor/js/jquery.flot.orderBars.js",
    "stupidtable.min.js": "vendor/js/stupidtable.min.js",
    "md5.min.js": "vendor/js/md5.min.js",
    "bootstrap.min.js": "vendor/js/bootstrap.min.js",
    "bootstrap.min.css": "vendor/css/bootstrap.min.css",
}
#: The file that makes a folder a site scripts/asv_publish.sh published, and so one it may replace.
SITE_MARKER = ".cropbench-asv-site.json"
_REMOTE_TAG = re.compile(r"<(script|link)\b[^>]*?(?:src|href)=\"(https?://[^\"]+)\"[^>]*>", re.IGNORECASE)
#: Subresource-integrity attributes name the CDN file's hash; the local copy need not match it.
_CDN_ATTRIBUTES = re.compile(r"\s+(?:integrity|crossorigin|referrerpolicy)=\"[^\"]*\"")


class OfflineError(RuntimeError):
    """The page asks for a remote file that has no vendored copy, or html/ is not a published site."""


def refusal(html_dir: Path) -> str | None:
    """Why ``asv publish`` may not write to ``html_dir`` (None: it may): it empties the folder first."""
    if html_dir.is_symlink():
        return "it is a symbolic link, not a site folder this script published"
    if not html_dir.exists():
        return None
    if not html_dir.is_dir():
        return "it is a file, not a folder"
    if not any(html_dir.iterdir()):
        return None
    try:
        marker = json.loads((html_dir / SITE_MARKER).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        marker = None
    if not isinstance(marker, dict) or marker.get("cropbench_site") != 1:
        return f"it holds files and no {SITE_MARKER}, so it is not a site scripts/asv_publish.sh published"
    return None


def localise(page: str) -> str:
    """``page`` with every remote script/stylesheet tag pointed at its vendored copy."""

    def replace(match: re.Match[str]) -> str:
        tag, url = match.group(0), match.group(2)
        if match.group(1).lower() == "link" and "stylesheet" not in tag:
            return tag
        name = url.rsplit("/", 1)[-1]
        if name not in LOCAL_COPIES:
            raise OfflineError(f"{url} has no vendored copy; add it to scripts/asv_vendor.sh and LOCAL_COPIES")
        return _CDN_ATTRIBUTES.sub("", tag.replace(url, LOCAL_COPIES[name]))

    return _REMOTE_TAG.sub(replace, page)


def make_offline(html_dir: Path) -> list[Path]:
    """Copy the vendored files into ``html_dir`` and rewrite its pages; return the pages changed."""
    if not (html_dir / "index.json").exists():
        raise OfflineError(f"{html_dir} holds no published asv site (no index.json); run `asv publish` first")
    (html_dir / SITE_MARKER).write_text(json.dumps({"cropbench_site": 1, "written_by": "scripts/asv_publish.sh"}))
    shutil.copytree(VENDOR, html_dir / "vendor", dirs_exist_ok=True)
    changed = []
    for page in sorted(html_dir.glob("*.html")):
        text = page.read_text(encoding="utf-8")
        local = localise(text)
        if local != text:
            page.write_text(local, encoding="utf-8")
            changed.append(page)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cropbench asv-offline-html", description=__doc__.split("\n\n")[0])
    parser.add_argument("html_dir", type=Path, nargs="?", default=REPO / "html")
    args = parser.parse_args(argv)
    changed = make_offline(args.html_dir)
    print(f"offline: {len(changed)} page(s) now load local copies from {args.html_dir / 'vendor'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
