"""THE result record: one row per measured configuration, JSON Lines on disk, CSV on request.

Each row is written with a single ``write`` of one complete line, then fsynced, so an interrupted
run keeps every finished row and never leaves a half row that parses. A torn last line (a kill or a
full disk during the write itself) is skipped on reading, with a warning; the next writer moves it
aside to ``<file>.torn-N`` before appending, so no later row is glued onto it. A writer validates
every existing line before anything is measured, holds an exclusive lock on the file (one writer at
a time), and stamps its own ``run_id`` on every row it writes: one id per invocation.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import datetime as _dt
import errno
import fcntl
import json
import math
import os
import re
import tempfile
import uuid
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from cropbench import metrics as m
from cropbench.errors import OutputError

SCHEMA_VERSION = 1
#: File names of a results directory: the records, and their CSV export.
RESULTS_NAME = "results.jsonl"
CSV_NAME = "results.csv"

#: The value ``Record.track`` takes for the three tracks every run can measure: each track's one name,
#: the same word as its module, its class and ``cropbench run --track`` (see :data:`cropbench.tracks.TRACKS`,
#: which lists every track). They live here, below every layer that reads rows, so the harness's
#: validity rules and the reports compare against one spelling.
DATASET_TRACK = "dataset"
LOADER_TRACK = "loader"
TRAINING_TRACK = "training"
#: What rows written before the tracks were named carry in ``track``, by the name it now is. Reading
#: a row gives it the name (:func:`track_name`); committed results keep the value they were written with.
FORMER_TRACK_VALUES: dict[str, str] = {"1": DATASET_TRACK, "2": LOADER_TRACK, "3": TRAINING_TRACK}
#: Each renamed track's former value, by its name: what its case identities still hash (so ``--resume``
#: matches its older rows) and what ``--track`` still takes.
FORMER_VALUES: dict[str, str] = {name: value for value, name in FORMER_TRACK_VALUES.items()}


def track_name(value: str) -> str:
    """The track a row's ``track`` value names: a former value (``"1"``) as its name (``"dataset"``),
    any other value as it is."""
    return FORMER_TRACK_VALUES.get(value, value)


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
    #: Stable hash of the track, the case's canonical config, the plate's fingerprint and its layout
    #: (see cropbench.harness.runner.case_identity); "" in rows written before it existed.
    case_id: str = ""
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    timestamp: str = field(default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, default=jsonable, allow_nan=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Record:
        """A record from its JSON object; a row of a former track value reads with the track's name."""
        known = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in known}
        if isinstance(fields.get("track"), str):
            fields["track"] = track_name(fields["track"])
        return cls(**fields)

    @property
    def key(self) -> tuple[str, str, int]:
        """(track, case_id, repeat): what ``--resume`` skips. Rows without a ``case_id`` match nothing."""
        return (self.track, self.case_id, self.repeat)

    def flat(self) -> dict[str, Any]:
        """Flat columns (``config.crop_size``, ``metrics.p95_ms``, …) for CSV and pandas."""
        row: dict[str, Any] = {
            "schema_version": self.schema_version,
            "run_id": self.run_id,
            "timestamp": self.timestamp,
            "track": self.track,
            "case": self.case,
            "case_id": self.case_id,
            "seed": self.seed,
            "repeat": self.repeat,
        }
        for section in ("config", "metrics", "environment"):
            for key, value in _flatten(getattr(self, section), section).items():
                row[key] = json.dumps(value, default=jsonable) if isinstance(value, (list, dict)) else value
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


def jsonable(value: Any) -> Any:
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
    """Appends records to a JSON Lines file, one durable line per record, holding the file's lock.

    Opening repairs a torn tail and validates every existing line, so a bad file fails before any
    measuring. Every row written gets this writer's ``run_id``.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.run_id = uuid.uuid4().hex[:12]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as error:
            raise OutputError(f"cannot write results to {self.path}: {error.strerror or error}") from error
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(self._fd)
            if error.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise OutputError(f"cannot lock results file {self.path}: {error.strerror or error}") from error
            raise OutputError(
                f"{self.path} is being written by another cropbench run; wait for it to finish or choose another --out"
            ) from error
        try:
            # Every whole line first: a file that is not ours is refused before its tail is touched.
            for _ in _iter_records(self.path, with_tail=False):
                pass
            self._repair_tail()
        except BaseException:
            os.close(self._fd)
            raise
        #: Where this writer's rows start, and how many it wrote (what :meth:`amend` may write over).
        self._start = os.fstat(self._fd).st_size
        self._written = 0

    def _repair_tail(self) -> None:
        """Move a last line without its newline to ``<file>.torn-N``, so the next row starts clean."""
        size = os.fstat(self._fd).st_size
        if size == 0 or os.pread(self._fd, 1, size - 1) == b"\n":
            return
        cut = _last_newline_end(self._fd, size)
        fragment = os.pread(self._fd, size - cut, cut)
        with contextlib.suppress(OutputError, UnicodeDecodeError):
            _parse_line(fragment.decode("utf-8"), f"{self.path}:end")
            os.write(self._fd, b"\n")  # a whole row that only lacks its newline: keep it
            return
        number = 1
        while self.path.with_name(f"{self.path.name}.torn-{number}").exists():
            number += 1
        aside = self.path.with_name(f"{self.path.name}.torn-{number}")
        try:
            aside.write_bytes(fragment)
            os.fsync(self._fd)
            os.ftruncate(self._fd, cut)
            os.fsync(self._fd)
        except OSError as error:
            raise OutputError(
                f"cannot move the torn last line of {self.path} aside: {error.strerror or error}"
            ) from error
        warnings.warn(
            f"{self.path}: moved a torn last line ({len(fragment)} bytes) to {aside.name}", RuntimeWarning, stacklevel=3
        )

    def write(self, record: Record) -> Record:
        """Append ``record`` stamped with this writer's ``run_id``; returns the row as written.

        Its plate is named as :func:`portable_plate_paths` says. A failed write (disk full) is cut back
        off the file, so the file never ends in half a row.
        """
        record = dataclasses.replace(portable_plate_paths(record, self.path.parent), run_id=self.run_id)
        line = (record.to_json() + "\n").encode("utf-8")
        before = os.fstat(self._fd).st_size
        try:
            written = 0
            while written < len(line):
                written += os.write(self._fd, line[written:])
            os.fsync(self._fd)
        except OSError as error:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, before)
            raise OutputError(f"cannot write results to {self.path}: {error.strerror or error}") from error
        self._written += 1
        return record

    def amend(self, records: Sequence[Record]) -> list[Record]:
        """Write ``records`` (stamped with this writer's ``run_id``) over the rows this writer wrote, as
        many and in the same order; returns them as written. The rows before are kept byte for byte and
        the file is replaced whole (a sibling renamed over it), so a failure leaves it as it was."""
        if len(records) != self._written:
            raise ValueError(f"amend takes the {self._written} rows this writer wrote, got {len(records)}")
        stamped = [dataclasses.replace(record, run_id=self.run_id) for record in records]
        rows = b"".join((record.to_json() + "\n").encode("utf-8") for record in stamped)
        temporary: Path | None = None
        try:
            before = os.pread(self._fd, self._start, 0)
            with tempfile.NamedTemporaryFile(
                "wb", dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp", delete=False
            ) as handle:
                temporary = Path(handle.name)
                os.fchmod(handle.fileno(), os.fstat(self._fd).st_mode & 0o777)
                handle.write(before + rows)
                handle.flush()
                os.fsync(handle.fileno())
            replacement = os.open(temporary, os.O_RDWR | os.O_APPEND)
            try:
                fcntl.flock(replacement, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody else knows the file yet
                os.replace(temporary, self.path)
            except OSError:
                os.close(replacement)
                raise
        except OSError as error:
            if temporary is not None:
                with contextlib.suppress(OSError):
                    temporary.unlink()
            raise OutputError(f"cannot write results to {self.path}: {error.strerror or error}") from error
        os.close(self._fd)
        self._fd = replacement
        return stamped

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing releases the lock
            self._fd = -1

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: Where a row names its plate on disk: the run's configuration, and the storage its environment found it on.
PLATE_PATHS = (("config", "plate"), ("environment", "storage", "path"))


def portable_path(value: str, folder: str | Path) -> str:
    """``value`` as a row records it: a relative path or a URL as given; an absolute path relative to
    ``folder`` (where the rows go) when it lies inside it, else by its last component (the plate's
    name), so rows shared or committed carry no machine's folders."""
    if not os.path.isabs(value):
        return value
    path, base = Path(os.path.normpath(value)), Path(os.path.abspath(folder))
    if path == base:
        return "."
    return str(path.relative_to(base)) if path.is_relative_to(base) else path.name or value


def portable_plate_paths(record: Record, folder: str | Path) -> Record:
    """``record`` with each of its :data:`PLATE_PATHS` made :func:`portable_path` (relative to ``folder``)."""
    config, environment = copy_nested(record.config), copy_nested(record.environment)
    sections = {"config": config, "environment": environment}
    changed = False
    for section, *keys in PLATE_PATHS:
        holder: Any = sections[section]
        for key in keys[:-1]:
            holder = holder.get(key) if isinstance(holder, dict) else None
        if isinstance(holder, dict) and isinstance(holder.get(keys[-1]), str):
            portable = portable_path(holder[keys[-1]], folder)
            changed = changed or portable != holder[keys[-1]]
            holder[keys[-1]] = portable
    return dataclasses.replace(record, config=config, environment=environment) if changed else record


def copy_nested(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``data`` whose nested objects are copies too (lists and values are shared)."""
    return {key: copy_nested(value) if isinstance(value, dict) else value for key, value in data.items()}


def _last_newline_end(fd: int, end: int) -> int:
    """Offset just past the last newline before ``end`` (0 when there is none), read backwards."""
    while end > 0:
        start = max(0, end - 2**20)
        block = os.pread(fd, end - start, start)
        if b"\n" in block:
            return start + block.rfind(b"\n") + 1
        end = start
    return 0


#: Sections of a record that must be JSON objects, and the scalar fields with their types.
_SECTIONS = ("config", "metrics", "environment")
_SCALARS: dict[str, type | tuple[type, ...]] = {
    "track": str,
    "case": str,
    "case_id": str,
    "seed": int,
    "repeat": int,
    "run_id": str,
    "timestamp": str,
}


#: Bounds of a row read back: a line longer than this is not decoded at all, a row nested deeper
#: (JSON objects and lists inside each other) is not decoded (a deep enough one would exhaust the
#: decoder's recursion), and no label or other text of a row is longer. Real rows are a few KiB,
#: nested four to six levels, with labels under a hundred characters.
MAX_LINE_BYTES = 16 * 2**20
MAX_DEPTH = 32
MAX_LABEL_CHARS = 1_000
MAX_TEXT_CHARS = 65_536
#: Parts of a row's config that are objects wherever they appear (reports read fields inside them).
#: ``reader`` is not one of them: an object in track targets' rows, the reader's name in track formats'.
CONFIG_SECTIONS = ("crop", "loader", "case", "store")
#: Fields of a row that name it (what tables, figures and the verdict print).
_LABELS = ("track", "case", "case_id", "run_id", "timestamp")
#: A JSON string, escapes and all (unrolled: no backtracking on long strings).
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


class SkippedRow(OutputError):
    """A line that is a record of ours whose content cannot be trusted: reading skips it with a warning."""


def nesting_depth(line: bytes) -> int:
    """How deeply the JSON objects and lists of ``line`` nest, counted without decoding it."""
    skeleton = np.frombuffer(_JSON_STRING.sub(b'""', line), dtype=np.uint8)
    opens = (skeleton == ord("{")) | (skeleton == ord("["))
    closes = (skeleton == ord("}")) | (skeleton == ord("]"))
    return int(np.cumsum(opens.astype(np.int64) - closes.astype(np.int64)).max(initial=0))


def _longest_text(value: Any) -> int:
    """The longest string (key or value) in ``value``; its depth is bounded before this is called."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return max((max(len(str(k)), _longest_text(v)) for k, v in value.items()), default=0)
    if isinstance(value, list):
        return max((_longest_text(item) for item in value), default=0)
    return 0


def _row_problem(data: dict[str, Any]) -> str | None:
    """Why a record-shaped row cannot be read as one (None when it can): text too long, flags not a list."""
    for name in _LABELS:
        value = data.get(name)
        if isinstance(value, str) and len(value) > MAX_LABEL_CHARS:
            return f"{name!r} is {len(value):,} characters long; at most {MAX_LABEL_CHARS:,}"
    longest = _longest_text(data)
    if longest > MAX_TEXT_CHARS:
        return f"it holds a text of {longest:,} characters; at most {MAX_TEXT_CHARS:,}"
    for name in CONFIG_SECTIONS:
        section = data["config"].get(name)
        if section is not None and not isinstance(section, dict):
            return f"its config {name!r} is {_short(section)}, not an object"
    flags = data["metrics"].get(m.VALIDITY_FLAGS)
    if flags is not None and not (isinstance(flags, list) and all(isinstance(flag, str) for flag in flags)):
        return f"its {m.VALIDITY_FLAGS} are {_short(flags)}, not a list of flag names"
    for name in ("seed", "repeat"):
        value = data.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**53:
            return f"{name!r} is {_short(value)}"
    return None


def _short(value: Any) -> str:
    """``value`` for a message: its repr, cut to a readable length."""
    text = repr(value) if not isinstance(value, float) or math.isfinite(value) else str(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _parse_line(line: str, where: str) -> Record:
    """A record from one line, or an OutputError naming ``file:line`` and what is wrong.

    A record of ours whose content cannot be trusted (nested too deep, text too long, flags that are
    not a list) raises :class:`SkippedRow`, which reading a file turns into a warning.
    """
    encoded = line.encode("utf-8", errors="surrogatepass")
    if len(encoded) > MAX_LINE_BYTES:
        raise SkippedRow(f"{where}: skipped: the line is {len(encoded):,} bytes long; at most {MAX_LINE_BYTES:,}")
    depth = nesting_depth(encoded)
    if depth > MAX_DEPTH:
        raise SkippedRow(f"{where}: skipped: it nests {depth:,} levels deep; at most {MAX_DEPTH}")
    try:
        data = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as error:
        raise OutputError(f"{where} is not a valid record: {_short(str(error))}") from None
    if not isinstance(data, dict):
        raise OutputError(f"{where} is not a valid record: expected a JSON object, got {type(data).__name__}")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise OutputError(
            f"{where} has schema_version {_short(version)}; this cropbench reads {SCHEMA_VERSION} (use another --out)"
        )
    for name in ("track", "case", *_SECTIONS):
        if name not in data:
            raise OutputError(f"{where} is not a valid record: no {name!r}")
    for name in _SECTIONS:
        if not isinstance(data[name], dict):
            raise OutputError(f"{where} is not a valid record: {name!r} is {type(data[name]).__name__}, not an object")
    for name, kind in _SCALARS.items():
        if name in data and (not isinstance(data[name], kind) or isinstance(data[name], bool)):
            raise OutputError(f"{where} is not a valid record: {name!r} is {_short(data[name])}")
    problem = _row_problem(data)
    if problem is not None:
        raise SkippedRow(f"{where}: skipped: {problem}")
    return Record.from_dict(data)


def parse_record(line: str, where: str = "record") -> Record:
    """A record from one JSON line, validated as every line of a results file is (OutputError if it is not one)."""
    return _parse_line(line, where)


def iter_records(path: str | Path) -> Iterator[Record]:
    """Records of a JSON Lines file; a torn final line (no newline after it) is skipped with a warning."""
    return _iter_records(Path(path), with_tail=True)


def _iter_records(source: Path, with_tail: bool) -> Iterator[Record]:
    """Records of the whole lines, each decoded on its own (a write cut inside a UTF-8 character
    tears only the last line), then, ``with_tail``, the last line if it parses."""
    if not source.is_file():
        raise OutputError(f"results file {source} does not exist")
    try:
        data = source.read_bytes()
    except OSError as error:
        raise OutputError(f"cannot read results file {source}: {error.strerror or error}") from error
    lines = data.split(b"\n")
    torn = lines.pop()  # b"" when the file ends with a newline
    for number, line in enumerate(lines, start=1):
        if line.strip():
            where = f"{source}:{number}"
            try:
                record = _parse_line(_decoded(line, where), where)
            except SkippedRow as skipped:
                warnings.warn(str(skipped), RuntimeWarning, stacklevel=3)
                continue
            yield record
    if with_tail and torn.strip():
        where = f"{source}:{len(lines) + 1}"
        try:
            record = _parse_line(_decoded(torn, where), where)
        except OutputError:
            warnings.warn(f"{where}: skipping a torn last line", RuntimeWarning, stacklevel=3)
            return
        yield record


def _decoded(line: bytes, where: str) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as error:
        raise OutputError(
            f"{where} is not a valid record: not UTF-8 text ({error.reason} at byte {error.start})"
        ) from None


def read_records(path: str | Path) -> list[Record]:
    return list(iter_records(path))


#: A cell starting with one of these is read as a formula by spreadsheets (CSV injection).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value: Any) -> Any:
    """``value`` for a CSV cell: text a spreadsheet would run as a formula gets a leading ``'`` (as
    OWASP advises); numbers, negative ones included, stay numbers."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        try:
            float(value)
        except ValueError:
            return "'" + value
    return value


@contextlib.contextmanager
def replacing(destination: Path, binary: bool = False) -> Iterator[IO[Any]]:
    """A file (text, or ``binary``) written in full, then renamed over ``destination``: a full disk or an
    interrupt leaves the old file whole, never half of the new one (OSError as raised)."""
    temporary: Path | None = None
    text: dict[str, Any] = {} if binary else {"newline": "", "encoding": "utf-8"}
    try:
        with tempfile.NamedTemporaryFile(
            "wb" if binary else "w",
            dir=destination.parent,
            prefix=f".{destination.name}.",
            suffix=".tmp",
            delete=False,
            **text,
        ) as handle:
            temporary = Path(handle.name)
            # The mode an ordinary open would give (a temporary file is private to its owner).
            os.fchmod(handle.fileno(), destination.stat().st_mode & 0o777 if destination.is_file() else 0o644)
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, destination)
    except BaseException:
        if temporary is not None:
            with contextlib.suppress(OSError):
                temporary.unlink()
        raise


def write_csv(records: Iterable[Record], path: str | Path) -> Path:
    """Export records as CSV with the union of their flat columns (stable order); formula-like text
    is neutralised (:func:`spreadsheet_safe`)."""
    rows = [
        {spreadsheet_safe(key): spreadsheet_safe(value) for key, value in record.flat().items()} for record in records
    ]
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    destination = Path(path)
    try:
        with replacing(destination) as handle:
            writer = csv.DictWriter(handle, fieldnames=list(columns))
            writer.writeheader()
            writer.writerows(rows)
    except OSError as error:
        raise OutputError(f"cannot write CSV {destination}: {error.strerror or error}") from error
    return destination
