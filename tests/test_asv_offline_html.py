"""``cropbench asv-offline-html``: asv's published page loads nothing from the network."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import asv
import pytest

from cropbench.history import offline_html as offline

REPO = Path(__file__).resolve().parents[1]

ASV_WWW = Path(asv.__file__).parent / "www"


def _published(tmp_path: Path) -> Path:
    """A stand-in for `asv publish` output: asv's own page templates plus an index.json."""
    html = tmp_path / "html"
    shutil.copytree(ASV_WWW, html)
    (html / "index.json").write_text("{}")
    return html


def test_every_remote_tag_of_asvs_page_points_at_a_vendored_file(tmp_path: Path) -> None:
    html = _published(tmp_path)
    changed = offline.make_offline(html)
    assert html / "index.html" in changed
    page = (html / "index.html").read_text()
    assert not re.search(r"<(script|link)[^>]+(src|href)=\"https?://", page)
    assert "integrity=" not in page
    for local in re.findall(r"(?:src|href)=\"(vendor/[^\"]+)\"", page):
        assert (html / local).is_file(), local
    assert len(re.findall(r"src=\"vendor/js/", page)) == 9
    assert (html / "vendor" / "fonts" / "glyphicons-halflings-regular.woff").is_file()


def test_rewriting_twice_changes_nothing(tmp_path: Path) -> None:
    html = _published(tmp_path)
    offline.make_offline(html)
    assert offline.make_offline(html) == []


def test_an_unknown_cdn_file_is_an_error() -> None:
    page = '<script src="https://cdn.example.org/lib/new-plugin.min.js"></script>'
    with pytest.raises(offline.OfflineError, match="no vendored copy"):
        offline.localise(page)


def test_a_directory_that_was_not_published_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(offline.OfflineError, match="asv publish"):
        offline.make_offline(tmp_path)
