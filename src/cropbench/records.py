"""THE result record: one row per measured configuration, JSON Lines on disk, CSV on request.

Each row is written with a single ``write`` of one complete line, then flushed and fsynced, so an
interrupted run keeps every finished row and never leaves a half row that parses. A torn last
line (a kill during the write itself) is skipped on reading, with a warning.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as _dt
import json
import os
import uuid
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cropbench.errors import OutputError

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Record:
    """One measured configuration: which track, every knob, the metrics, and where it ran."""

    track: str
    case: str
    config: dict[str, Any]
    metrics: dict[str, Any]
    environment: dict[str, Any]
    seed: int = 0
    repeat: int = 0
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    timestamp: str = field(default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, default=_jsonable, allow_nan=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Record:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def key(self) -> tuple[str, str, int]:
        """Identity of the configuration, used by ``--resume`` to skip finished rows."""
        return (self.track, self.case, self.repeat)

    def flat(self) -> dict[str, Any]:
        """Flat columns (``config.crop_size``, ``metrics.p95_ms``, …) for CSV and pandas."""
        row: dict[str, Any] = {
            "schema_version": self.schema_version, "run_id": self.run_id, "timestamp": self.timestamp,
            "track": self.track, "case": self.case, "seed": self.seed, "repeat": self.repeat,
        }
        for section in ("config", "metrics", "environment"):
            for key, value in _flatten(getattr(self, section), section).items():
                row[key] = json.dumps(value, default=_jsonable) if isinstance(value, (list, dict)) else value
        return row


def _flatten(data: dict[str, Any], prefix: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}.{key}"
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, name))
        else:
            flat[name] = value
    return flat


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"cannot store {type(value).__name__} in a record")


class RecordWriter:
    """Appends records to a JSON Lines file, one durable line per record."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        except OSError as error:
            raise OutputError(f"cannot write results to {self.path}: {error.strerror or error}") from error

    def write(self, record: Record) -> None:
        self._handle.write(record.to_json() + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_records(path: str | Path) -> Iterator[Record]:
    """Records of a JSON Lines file; a torn final line is skipped with a warning."""
    source = Path(path)
    if not source.is_file():
        raise OutputError(f"results file {source} does not exist")
    lines = source.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):
                warnings.warn(f"{source}:{number}: skipping a torn last line", RuntimeWarning, stacklevel=2)
                return
            raise OutputError(f"{source}:{number} is not a valid record: {error}") from error
        yield Record.from_dict(data)


def read_records(path: str | Path) -> list[Record]:
    return list(iter_records(path))


def write_csv(records: Iterable[Record], path: str | Path) -> Path:
    """Export records as CSV with the union of their flat columns (stable order)."""
    rows = [record.flat() for record in records]
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    destination = Path(path)
    try:
        with open(destination, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(columns))
            writer.writeheader()
            writer.writerows(rows)
    except OSError as error:
        raise OutputError(f"cannot write CSV {destination}: {error.strerror or error}") from error
    return destination
