"""What every track runner receives: where records go, what to skip, and shared settings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cropbench.records import Record


@dataclass(frozen=True)
class RunContext:
    """Shared by all tracks of one ``cropbench run``.

    ``emit`` receives each record as soon as it is measured (the CLI writes it durably);
    ``skip`` holds the (track, case, repeat) keys already recorded, for ``--resume``;
    ``objects`` is the object table to use instead of the plate's bundled one.
    """

    environment: dict[str, Any]
    thread_settings: dict[str, Any]
    emit: Callable[[Record], None]
    skip: frozenset[tuple[str, str, int]] = field(default_factory=frozenset)
    repeats: int = 1
    samples: int | None = None
    report: Callable[[str], None] | None = None
    objects: Path | None = None

    def should_skip(self, track: str, case: str, repeat: int) -> bool:
        return (track, case, repeat) in self.skip

    def decode_applies(self, plate: str | Path, decode: str) -> bool:
        """Whether the plate's layout offers the decode path; tracks skip the cases it lacks."""
        from cropbench.formats import read_plate_metadata, supported_decodes

        applies = decode in supported_decodes(read_plate_metadata(plate))
        if not applies:
            self.progress(f"decode {decode} does not apply to the layout of {plate}: skipped")
        return applies

    def progress(self, message: str) -> None:
        if self.report is not None:
            self.report(message)
