"""The plate a run measures: its metadata, object table and identity, and the datasets built on it;
and the worker counts the machine can run.

Every track gets its datasets from here, so an object table given with ``--objects`` reaches every
track (none can forget it), and every record names the same plate fingerprint and layout.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from cropbench.config import CropConfig, CropOverrides
from cropbench.data.dataset import CropDataset
from cropbench.formats import PlateReader, open_plate, plate_objects, read_plate_metadata, supported_decodes
from cropbench.formats.base import PlateMetadata
from cropbench.formats.sources import redact
from cropbench.objects import ObjectTable


@dataclass(eq=False)
class RunContext:
    """Shared by all tracks of one run.

    ``objects`` is an object table file to use instead of the plate's bundled one; ``samples``
    overrides each preset's sample count; ``report`` receives progress messages. ``local`` is the
    same plate on local disk beside a plate in a store: Track 1 measures each case on it too, so a
    row over the store carries its ratio to the local read of the same run. ``server_requests_per_s``
    is the store's own ceiling (a trivial client), measured once where the server is on loopback.
    ``overrides`` are crop knobs fixed for every case (``--decode-threads``...), applied by the runner.
    """

    plate: Path
    environment: dict[str, Any] = field(default_factory=dict)
    thread_settings: dict[str, Any] = field(default_factory=dict)
    objects: Path | None = None
    samples: int | None = None
    report: Callable[[str], None] | None = None
    local: RunContext | None = None
    server_requests_per_s: float | None = None
    overrides: CropOverrides | None = None

    def __post_init__(self) -> None:
        self.plate = Path(self.plate)
        self.metadata: PlateMetadata = read_plate_metadata(self.plate)
        self.object_table: ObjectTable | None = None
        if self.objects is not None:
            only = self.metadata.fields[0] if len(self.metadata.fields) == 1 else None
            self.object_table = plate_objects(self.objects, (only.well, only.field) if only else None)

    def on(self, plate: Path) -> RunContext:
        """The run's settings (object table, samples, overrides, progress) over another copy of its plate:
        a rewrite in another layout, or a mirror of it served from a store."""
        return dataclasses.replace(self, plate=plate, local=None, server_requests_per_s=None)

    @property
    def layout(self) -> str:
        """The layout the plate was written in (its writer's label), or its format."""
        return self.metadata.layout_label

    @property
    def remote(self) -> dict[str, Any] | None:
        """Where a plate in an object store lives (``url``) and how it is read (``store``); None if local."""
        return self.metadata.remote

    @property
    def location(self) -> str:
        """The plate as the user named it: its URL (credentials masked) when in a store, else its path."""
        return redact(str(self.remote["url"])) if self.remote is not None else str(self.plate)

    @property
    def decodes(self) -> tuple[str, ...]:
        return supported_decodes(self.metadata)

    def dataset(
        self,
        crop: CropConfig,
        plate: str | Path | None = None,
        reader: PlateReader | None = None,
        labels: Sequence[str] = (),
    ) -> CropDataset:
        """A dataset over the run's plate (or ``plate``, a rewrite of it) with the run's object table.

        Over the run's plate each dataset gets a reader of its own (no cache carries over from another
        case), opened on the metadata the run read once rather than reading it again.
        """
        if plate is None and reader is None:
            reader = open_plate(
                self.plate,
                crop.decode,
                crop.chunk_cache_bytes,
                crop.field_cache_fields,
                metadata=self.metadata,
                decode_threads=crop.decode_threads,
            )
        return CropDataset(plate or self.plate, crop, objects=self.object_table, reader=reader, labels=labels)

    @cached_property
    def object_count(self) -> int:
        """Objects a dataset over the run's plate serves (its object table's rows in the plate's fields)."""
        return len(self.dataset(CropConfig()))

    @cached_property
    def fingerprint(self) -> str:
        """What identifies the plate's content: name, fields, shapes, layout, stored bytes, object table.

        Paths and modification times are left out, so a copied plate is the same plate; a
        regenerated or re-imported one differs in its bytes on disk or its table.
        """
        metadata = self.metadata
        if self.remote is not None:  # a mirror of metadata: the store's listing counted the plate's bytes
            stored = int(self.remote["stored_bytes"])
        elif self.plate.is_dir():
            stored = sum(os.path.getsize(Path(root) / name) for root, _, names in os.walk(self.plate) for name in names)
        else:
            stored = self.plate.stat().st_size
        document = {
            "name": metadata.name,
            "format": metadata.format,
            "layout": self.layout,
            "dtype": metadata.dtype,
            "field_shape": list(metadata.field_shape),
            "channels": list(metadata.channel_names),
            "fields": [[info.well, info.field] for info in metadata.fields],
            "stored_bytes": stored,
        }
        hasher = hashlib.sha256(json.dumps(document, sort_keys=True).encode())
        if self.objects is not None:
            hasher.update(self.objects.read_bytes())
        return hasher.hexdigest()[:16]

    def progress(self, message: str) -> None:
        if self.report is not None:
            self.report(message)


def usable_cores() -> int:
    """Cores this process may run on (its affinity), which is what workers compete for."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def worker_counts(cores: int | None = None) -> list[int]:
    """DataLoader worker counts a sweep or search tries: 0, 1, 2, then 4, 8, 12, 16 while the machine
    has that many cores."""
    available = cores or usable_cores()
    return [0, 1, 2, *(w for w in (4, 8, 12, 16) if w <= available)]
