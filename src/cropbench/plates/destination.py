"""Where a plate is written: into a temporary sibling, swapped into place only when finished.

cropbench never deletes what it did not create. A new plate is written beside its destination and
renamed into place when complete, so a failure leaves nothing behind and an interrupted write
never looks like a plate. An existing destination is replaced only when it is cropbench's own
plate (its NGFF attributes or layout marker carry cropbench's ``layout_label``), and, for a
converted copy, only when it was converted from the same source into the same layout.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from cropbench.errors import OutputError
from cropbench.formats.base import cropbench_attributes


@dataclass(frozen=True)
class Origin:
    """What an existing plate must have been converted from to be replaced: a source and a layout label."""

    source: Path
    layout_label: str


#: Why an existing folder may not be replaced (None: it may be): for outputs that are not plates.
Refusal = Callable[[Path], str | None]


def check_replaceable(path: Path, overwrite: bool, origin: Origin | None = None, refuse: Refusal | None = None) -> None:
    """Raise OutputError unless ``path`` is free, or ``overwrite`` and it is cropbench's own plate
    (converted from ``origin`` when given; or, with ``refuse``, whatever ``refuse`` does not object
    to); an empty folder counts as free."""
    if not os.path.lexists(path) or (path.is_dir() and not path.is_symlink() and not any(path.iterdir())):
        return
    if not overwrite:
        raise OutputError(f"{path} already exists; pass --force (overwrite=True) to replace it")
    reason = refuse(path) if refuse is not None else _not_ours(path, origin)
    if reason:
        raise OutputError(f"refusing to replace {path}: {reason}; remove it yourself or choose another path")


def _not_ours(path: Path, origin: Origin | None) -> str | None:
    if path.is_symlink() or not path.is_dir():
        return "it is not a folder cropbench wrote"
    attributes = cropbench_attributes(path)
    if attributes is None:
        return "it is not a plate cropbench wrote"
    if origin is None:
        return None
    converted = attributes.get("converted_from") or {}
    if (
        attributes["layout_label"] != origin.layout_label
        or not isinstance(converted, dict)
        or converted.get("path") != str(origin.source.resolve())
    ):
        return f"it is not cropbench's {origin.layout_label} copy of {origin.source}"
    return None


@contextlib.contextmanager
def staged(path: Path, overwrite: bool, origin: Origin | None = None, refuse: Refusal | None = None) -> Iterator[Path]:
    """Yield a fresh path beside ``path`` to write into; on success swap it into place.

    The destination is checked before and again right before the swap; on any failure the
    temporary copy is removed and the destination is left as it was.
    """
    check_replaceable(path, overwrite, origin, refuse)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputError(f"cannot write beside {path}: {error.strerror or error}") from error
    # The scratch folder's name is known before it exists and made inside the ``try``, so a stop signal
    # landing just after it is made (where ``tempfile.mkdtemp`` would not yet have returned it) still
    # finds the ``finally`` that removes it. A name already taken is someone else's: never removed.
    scratch = path.parent / f".{path.name}.{secrets.token_hex(6)}.partial"
    ours = True
    try:
        try:
            os.mkdir(scratch, 0o700)
        except FileExistsError:
            ours = False
            raise
        yield scratch / path.name
        check_replaceable(path, overwrite, origin, refuse)
        if os.path.lexists(path):
            os.rename(path, scratch / "replaced")
        os.rename(scratch / path.name, path)
    except OSError as error:
        where = f" ({error.filename})" if error.filename else ""
        raise OutputError(f"cannot write {path}: {error.strerror or error}{where}") from error
    finally:
        if ours:
            shutil.rmtree(scratch, ignore_errors=True)


__all__ = ["Origin", "Refusal", "check_replaceable", "staged"]
