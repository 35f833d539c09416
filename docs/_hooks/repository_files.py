"""mkdocs hook: the site's home page is README.md, and files of the repository that pages link to travel along.

README.md and CONTRIBUTING.md live at the repository's root, where GitHub shows them, and link to
``docs/SECTION/NAME.md``; the pages in docs/ (one folder per section) link back to
``../../CONTRIBUTING.md`` and to committed results (``../../results/...``). So that neither text is
kept twice, the site takes README.md as its home page (``index.md``) and CONTRIBUTING.md as
``contributing.md``, rewriting their links to the site's layout, and copies every other repository
file a page links to under ``repository/``. A link to a repository file that does not exist is left
alone, so ``mkdocs build --strict`` reports it.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files, InclusionLevel

#: Markdown files at the repository's root that become pages of the site, and their names there.
ROOT_PAGES = {"README.md": "index.md", "CONTRIBUTING.md": "contributing.md"}
#: Where the other repository files that pages link to go in the site.
REPOSITORY_FOLDER = "repository"

# A Markdown link target: ](target) or ](target#anchor), without a scheme.
_LINK = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:)([^)\s#]+)(#[^)\s]*)?\)")


def _repository_root(config: Any) -> Path:
    return Path(config["config_file_path"]).resolve().parent


def _root_page_target(target: str) -> str:
    """A link written at the repository's root, as seen from a page at the site's root."""
    if target in ROOT_PAGES:
        return ROOT_PAGES[target]
    if target.startswith("docs/"):
        return target[len("docs/") :]
    return f"{REPOSITORY_FOLDER}/{target}"


def _leaving_docs(page_folder: str, target: str) -> str | None:
    """The repository path (relative to its root) a link of a page in ``docs/page_folder`` points
    at, when it leaves docs/; None when it stays inside."""
    path = posixpath.normpath(posixpath.join("docs", page_folder, target))
    return None if path == "docs" or path.startswith("docs/") else path


def _docs_page_target(page_folder: str, target: str) -> str | None:
    """A link written in docs/ that leaves it, as seen from the page in the site; None to keep it."""
    path = _leaving_docs(page_folder, target)
    if path is None:
        return None
    site_path = ROOT_PAGES.get(path, f"{REPOSITORY_FOLDER}/{path}")
    return posixpath.relpath(site_path, page_folder or ".")


def _repository_links(text: str, page_folder: str | None) -> list[str]:
    """Repository paths (relative to its root) of the links in ``text`` that leave docs/;
    ``page_folder`` None for a page at the repository's root."""
    paths = []
    for match in _LINK.finditer(text):
        target = match.group(1)
        if page_folder is None:
            if not target.startswith("docs/") and target not in ROOT_PAGES:
                paths.append(target)
        else:
            path = _leaving_docs(page_folder, target)
            if path is not None and path not in ROOT_PAGES:
                paths.append(path)
    return paths


def on_files(files: Files, config: Any) -> Files:
    root = _repository_root(config)
    docs_dir = Path(config["docs_dir"])
    texts = {name: (root / name).read_text(encoding="utf-8") for name in ROOT_PAGES}
    for name, page_uri in ROOT_PAGES.items():
        files.append(File.generated(config, page_uri, abs_src_path=str(root / name)))
    linked: set[str] = set()
    for text in texts.values():
        linked.update(_repository_links(text, page_folder=None))
    for doc_page in docs_dir.rglob("*.md"):
        page_folder = doc_page.parent.relative_to(docs_dir).as_posix().strip(".")
        linked.update(_repository_links(doc_page.read_text(encoding="utf-8"), page_folder))
    for path in sorted(linked):
        target = root / path
        if target.is_file():
            uri = f"{REPOSITORY_FOLDER}/{path}"
            files.append(File.generated(config, uri, abs_src_path=str(target), inclusion=InclusionLevel.NOT_IN_NAV))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    src = page.file.src_uri
    if src in ROOT_PAGES.values():

        def rewrite(match: re.Match[str]) -> str:
            return f"]({_root_page_target(match.group(1))}{match.group(2) or ''})"

    else:
        page_folder = posixpath.dirname(src)

        def rewrite(match: re.Match[str]) -> str:
            target = _docs_page_target(page_folder, match.group(1))
            if target is None:
                return match.group(0)
            return f"]({target}{match.group(2) or ''})"

    return _LINK.sub(rewrite, markdown)
