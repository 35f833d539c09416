"""The user guide and the documentation site: README stays a short guide, every link lands, the site builds."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import Any

import pytest

import cropbench

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MKDOCS_YML = ROOT / "mkdocs.yml"
#: The README is a guide a newcomer reads in ten minutes; the details live in docs/.
README_MAX_WORDS = 2500
#: The two commands a fresh machine needs.
TWO_COMMANDS = ("bash scripts/main.sh", "bash scripts/test.sh")

# [text](target) and ![alt](target); a target with a scheme (https:, mailto:) is not a file.
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


#: The sections of the site's navigation, in order: what a reader needs, then the measured results apart.
NAV_SECTIONS = ("Tutorial", "How-to guides", "Reference", "Explanation", "Results")
#: The public names a reader starts from; the API reference must document them.
API_NAMES = ("run", "CropDataset")
API_PAGE = DOCS / "reference" / "api.md"


def doc_pages() -> list[Path]:
    """Every page of docs/, in its section's folder (docs/_hooks/ holds the site's code, not pages)."""
    return sorted(page for page in DOCS.rglob("*.md") if "_hooks" not in page.relative_to(DOCS).parts)


def site_path(page: Path) -> str:
    """A page's path inside docs/, as mkdocs.yml names it."""
    return page.relative_to(DOCS).as_posix()


def markdown_files() -> list[Path]:
    return [README, ROOT / "CONTRIBUTING.md", *doc_pages()]


def without_code(text: str) -> str:
    """The Markdown outside fenced code blocks and inline code, where links are links."""
    text = _FENCE.sub("", text)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension (mkdocs) gives a heading."""
    text = re.sub(r"`|\*", "", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    return {slug(heading) for heading in _HEADING.findall(_FENCE.sub("", page.read_text(encoding="utf-8")))}


def relative_links(page: Path) -> list[str]:
    links = _LINK.findall(without_code(page.read_text(encoding="utf-8")))
    return [link for link in links if not _SCHEME.match(link)]


def test_readme_is_a_short_guide() -> None:
    words = len(README.read_text(encoding="utf-8").split())
    assert words <= README_MAX_WORDS, f"README.md has {words} words; move details to docs/ (at most {README_MAX_WORDS})"


@pytest.mark.parametrize("command", TWO_COMMANDS)
def test_readme_names_the_two_commands(command: str) -> None:
    assert command in README.read_text(encoding="utf-8")


def test_the_slug_matches_mkdocs_anchors() -> None:
    assert slug("Real data used in the docs and tests") == "real-data-used-in-the-docs-and-tests"
    assert slug("Track 1 — `Dataset.__getitem__`") == "track-1-dataset__getitem__"
    assert slug("zarr-python 3.0.8–3.1.6") == "zarr-python-308316"


@pytest.mark.parametrize("page", markdown_files(), ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for link in relative_links(page):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{link}: no heading with anchor #{anchor} in {target.name}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[gone](missing.md) [here](#title) [web](https://example.org) `[code](x.md)`\n")
    assert relative_links(page) == ["missing.md", "#title"]
    assert anchors(page) == {"title"}


def mkdocs_yml() -> str:
    return MKDOCS_YML.read_text(encoding="utf-8")


def nav_pages(config: str) -> set[str]:
    return set(re.findall(r"^\s*-\s*[^:\n]+:\s*(\S+\.md)\s*$", config, re.MULTILINE))


def nav_sections(config: str) -> dict[str, list[str]]:
    """The navigation's top-level sections (an entry without a page of its own) and the pages under each."""
    sections: dict[str, list[str]] = {}
    nav = config.split("\nnav:\n", 1)[1]
    current = None
    for line in nav.splitlines():
        section = re.match(r"^  - ([^:]+):\s*$", line)
        entry = re.match(r"^\s+- [^:]+:\s*(\S+\.md)\s*$", line)
        if section:
            current = section.group(1)
            sections[current] = []
        elif entry and current is not None and line.startswith("      "):
            sections[current].append(entry.group(1))
    return sections


def test_the_site_nav_lists_every_page() -> None:
    nav = nav_pages(mkdocs_yml())
    missing = [site_path(page) for page in doc_pages() if site_path(page) not in nav]
    assert not missing, f"mkdocs.yml nav lacks {missing}"
    # README.md and CONTRIBUTING.md become index.md and contributing.md (docs/_hooks/repository_files.py).
    unknown = nav - {site_path(page) for page in doc_pages()} - {"index.md", "contributing.md"}
    assert not unknown, f"mkdocs.yml nav names pages that do not exist: {sorted(unknown)}"


def test_the_nav_is_sorted_by_what_a_reader_needs() -> None:
    sections = nav_sections(mkdocs_yml())
    assert tuple(sections) == NAV_SECTIONS, f"mkdocs.yml nav sections are {list(sections)}, expected {NAV_SECTIONS}"
    assert sections["Tutorial"][0] == "tutorial/first-verdict.md", "the tutorials start from a fresh clone"
    # Each section's pages live in that section's folder, so a page's path says what kind of page it is.
    folders = {"Tutorial": "tutorial/", "How-to guides": "how-to/", "Reference": "reference/",
               "Explanation": "explanation/", "Results": "results/"}  # fmt: skip
    misplaced = [
        f"{page} under {section}"
        for section, pages in sections.items()
        for page in pages
        if page != "contributing.md" and not page.startswith(folders[section])
    ]
    assert not misplaced, f"pages outside their section's folder: {misplaced}"


def test_the_nav_parser_reads_sections_and_pages() -> None:
    config = "site_name: x\nnav:\n  - Home: index.md\n  - Tutorial:\n      - One: tutorial/one.md\n  - Results:\n"
    assert nav_sections(config) == {"Tutorial": ["tutorial/one.md"], "Results": []}
    assert nav_pages(config) == {"index.md", "tutorial/one.md"}


def docs_hook(name: str) -> Any:
    """A module of docs/_hooks/, which mkdocs loads by path rather than as a package."""
    sys.path.insert(0, str(DOCS / "_hooks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(DOCS / "_hooks"))


def test_the_api_reference_documents_the_public_names() -> None:
    generated_reference = docs_hook("generated_reference")
    assert generated_reference.API_MARKER in API_PAGE.read_text(encoding="utf-8")
    blocks = generated_reference.api_blocks()
    for name in cropbench.__all__:
        if name != "__version__":
            assert f".{name}\n" in blocks + "\n", f"the API reference lacks cropbench.{name}"
    for name in API_NAMES:
        assert f"`cropbench.{name}`" in blocks


def test_the_site_builds_strict(tmp_path: Path) -> None:
    if any(importlib.util.find_spec(name) is None for name in ("mkdocs", "material", "mkdocstrings_handlers")):
        pytest.skip("mkdocs, its theme or mkdocstrings is not installed: pip install -e '.[docs]'")
    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        timeout=120,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert (site / "index.html").is_file()
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "reference/tracks.html" in home, "the home page (README.md) should link to the pages beside it"
    for page in doc_pages():
        assert (site / site_path(page.with_suffix(".html"))).is_file()
    api = (site / site_path(API_PAGE.with_suffix(".html"))).read_text(encoding="utf-8")
    for name in API_NAMES:
        assert re.search(rf'id="cropbench(\.\w+)+\.{name}"', api), f"the API page does not document {name}"
    assert "__getitems__" in api and "preset" in api, "the API page shows no members or signatures"
    shutil.rmtree(site)


def test_publishing_a_missing_release_history_says_how_to_build_it(tmp_path: Path) -> None:
    if not (ROOT / ".venv" / "bin" / "asv").exists():
        pytest.skip("asv is not installed in .venv: bash scripts/setup.sh")
    config = tmp_path / "asv.zarr.conf.json"
    config.write_text(
        '{\n  // a comment, as asv allows\n  "version": 1, "repo": "' + str(tmp_path / "history" / "zarr") + '"\n}\n'
    )
    published = subprocess.run(
        ["bash", str(ROOT / "scripts" / "asv_publish.sh"), "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert published.returncode == 2
    assert published.stdout == ""
    lines = published.stderr.strip().splitlines()
    assert len(lines) == 1, published.stderr
    assert "does not exist" in lines[0]
    assert "scripts/release_history.py zarr" in lines[0]
    assert not (tmp_path / "history").exists()


def test_sphinx_roles_in_docstrings_read_as_sphinx_shows_them() -> None:
    rendered = "see :class:<code>~cropbench.config.StoreConfig</code> and :mod:<code>cropbench.tracks</code>"
    assert docs_hook("generated_reference").without_sphinx_roles(rendered) == (
        "see <code>StoreConfig</code> and <code>cropbench.tracks</code>"
    )
