"""``cropbench import``: a CellProfiler / CytoTable single-cell table plus its TIFF fields → a plate.

The table (Parquet or CSV, one row per cell) says where each cell is (plate, well, site), where
its centroid and bounding box are (in a chosen compartment), and which file holds each channel of
its field. The naming variants these tools produce are resolved here:

- plate / well / site as ``Metadata_*`` or ``Image_Metadata_*``, each optionally with a merge
  suffix (``_x``, ``_y``) left by joining image and object tables; a well as ``B7``/``B07`` or as
  row + column columns;
- files as ``Image_FileName_<Channel>`` or ``Image_FileName_Orig<Channel>`` (also without the
  ``Image_`` prefix), with optional ``Image_PathName_*`` folders, resolved against the image
  folder when the recorded folder does not exist here;
- without file name columns, Phenix-style names in the image folder
  (``r01c01f01p01-ch2sk1fk1fl1.tiff``: row, column, field, plane, channel; channels ``ch1``…);
- centroids ``<Compartment>_Location_Center_X/Y`` and boxes
  ``<Compartment>_AreaShape_BoundingBoxMinimum/Maximum_X/Y`` (CellProfiler maxima are exclusive).

The object table keeps each cell's identity in the source: ``object_id`` and ``source_row`` (its
row number in the source table), ``source_site`` (the site number the source gives, while ``field``
is the plate's 0-based field index within the well) and CellProfiler's ``ImageNumber`` /
``ObjectNumber`` where the table has them; ``--label COLUMN`` carries further columns (perturbation,
control type, dose) for training, string ones with their class list beside the plate.

The physical pixel size comes from ``Image_Metadata_ImageResolutionX/Y`` when the table records it
(else ``--pixel-size``) and is written into the NGFF ``coordinateTransformations``.

Everything is checked before anything is written, the headers of every TIFF included (a file cut
short, not a TIFF, of another shape or dtype); bad input raises :class:`ImportInputError` naming the
file. A file that only fails while its pixels are decoded stops the import with nothing left behind.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import tifffile
from tqdm import tqdm

from cropbench.config import LayoutSpec
from cropbench.errors import ImportInputError
from cropbench.formats import PlateGeometry, create_plate_writer
from cropbench.objects import OBJECT_TABLE_NAME, ObjectTable, column_values, label_classes, write_label_classes
from cropbench.plates.destination import check_replaceable, staged
from cropbench.plates.generate import GeneratedPlate, display_ranges, stored_size

MERGE_SUFFIXES = ("", "_x", "_y")
PLATE_COLUMNS = ("Metadata_Plate", "Image_Metadata_Plate")
WELL_COLUMNS = ("Metadata_Well", "Image_Metadata_Well")
ROW_COLUMNS = ("Metadata_Row", "Image_Metadata_Row")
COLUMN_COLUMNS = ("Metadata_Col", "Metadata_Column", "Image_Metadata_Col", "Image_Metadata_Column")
SITE_COLUMNS = (
    "Metadata_Site",
    "Image_Metadata_Site",
    "Metadata_Field",
    "Image_Metadata_Field",
    "Metadata_FieldID",
    "Image_Metadata_FieldID",
)
IMAGE_NUMBER_COLUMNS = ("ImageNumber", "Metadata_ImageNumber", "Image_ImageNumber")
OBJECT_NUMBER_COLUMNS = ("ObjectNumber", "Metadata_ObjectNumber")
RESOLUTION_COLUMNS = {
    axis: (f"Image_Metadata_ImageResolution{axis}", f"Metadata_ImageResolution{axis}") for axis in "XY"
}
#: Identity columns the importer adds to the object table (labels may not take these names).
IDENTITY_COLUMNS = ("source_row", "source_site", "ImageNumber", "ObjectNumber")
#: Compartments tried, in order, when none is chosen.
COMPARTMENTS = ("Nuclei", "Cells", "Cytoplasm")
IMAGE_SUFFIXES = (".tif", ".tiff")
#: Pixel types a plate stores.
DTYPES = ("uint8", "uint16", "int16", "float32")
_FILE_COLUMN = re.compile(r"^(?:Image_)?(?P<kind>FileName|PathName)_(?P<orig>Orig)?(?P<channel>.+?)(?P<suffix>_x|_y)?$")
_PHENIX = re.compile(
    r"^r(?P<row>\d+)c(?P<column>\d+)f(?P<field>\d+)p(?P<plane>\d+)-ch(?P<channel>\d+)"
    r"sk\d+fk\d+fl\d+\.tiff?$",
    re.IGNORECASE,
)
_WELL = re.compile(r"^(?P<row>[A-Za-z]+)0*(?P<column>\d+)$")
_PHENIX_WELL = re.compile(r"^r0*(?P<row>\d+)c0*(?P<column>\d+)$", re.IGNORECASE)
_CENTROID_X = re.compile(r"^(?:Metadata_)?(?P<compartment>[A-Za-z0-9]+)_Location_Center_X(?:_x|_y)?$")
_MISSING_SHOWN = 3


@dataclass(frozen=True)
class ImportOptions:
    """What to take from the table: channels (source → plate name), compartment, plate, name."""

    channels: tuple[tuple[str, str], ...] | None = None
    compartment: str | None = None
    plate: str | None = None
    name: str | None = None
    plane: int = 1
    labels: tuple[str, ...] = ()
    pixel_size_um: float | None = None

    def __post_init__(self) -> None:
        if self.pixel_size_um is not None and not self.pixel_size_um > 0:
            raise ImportInputError(f"pixel size must be > 0 micrometres, got {self.pixel_size_um}")
        clashing = sorted(set(self.labels) & {*IDENTITY_COLUMNS, "object_id", "plate", "well", "field"})
        if clashing:
            raise ImportInputError(f"--label {clashing[0]} names a column the object table makes itself")

    @staticmethod
    def parse_channels(specs: Sequence[str] | None) -> tuple[tuple[str, str], ...] | None:
        """``["DAPI=DNA", "GFP"]`` → ``(("DAPI", "DNA"), ("GFP", "GFP"))``; None keeps all channels."""
        if not specs:
            return None
        pairs = []
        for spec in specs:
            source, _, target = spec.partition("=")
            if not source.strip() or (_ and not target.strip()):
                raise ImportInputError(f"channel {spec!r} is not SOURCE or SOURCE=NAME")
            pairs.append((source.strip(), (target or source).strip()))
        targets = [target for _, target in pairs]
        if len(set(targets)) != len(targets):
            raise ImportInputError(f"channel names {targets} repeat a name")
        return tuple(pairs)


@dataclass(frozen=True)
class FieldSource:
    """One field of the imported plate: its well, site, and one file per channel."""

    row: str
    column: str
    site: str
    files: tuple[Path, ...]

    @property
    def well(self) -> str:
        return f"{self.row}{self.column}"


@dataclass(frozen=True)
class ImportPlan:
    """Everything resolved from the table and folder, checked, before any pixel is written."""

    name: str
    channel_names: tuple[str, ...]
    fields: tuple[FieldSource, ...]
    field_shape: tuple[int, int, int]
    dtype: str
    objects: ObjectTable
    columns: dict[str, Any]
    label_classes: dict[str, tuple[str, ...]]
    pixel_size_um: tuple[float, float] | None

    def wells(self) -> list[tuple[str, str]]:
        return list(dict.fromkeys((f.row, f.column) for f in self.fields))


def read_table(path: str | Path, labels: Sequence[str] = ()) -> pa.Table:
    """The columns cropbench can use from a Parquet or CSV single-cell table (thousands are skipped),
    and the ``labels`` columns (matched like every column: any case, with or without merge suffix)."""
    source = Path(path)
    wanted_labels = {label.lower() for label in labels}

    def useful(name: str) -> bool:
        return _useful(name) or _without_suffix(name).lower() in wanted_labels

    if not source.is_file():
        if source.exists():
            raise ImportInputError(f"single-cell table {source} is not a regular file (a FIFO, device or folder)")
        raise ImportInputError(f"single-cell table {source} does not exist")
    try:
        if source.suffix.lower() in (".csv", ".gz") or source.name.lower().endswith(".csv.gz"):
            import pyarrow.csv as pacsv

            names = pacsv.open_csv(str(source)).schema.names
            wanted = [n for n in names if useful(n)]
            return pacsv.read_csv(str(source), convert_options=pacsv.ConvertOptions(include_columns=wanted))
        import pyarrow.parquet as pq

        names = pq.read_schema(str(source)).names
        return pq.read_table(str(source), columns=[n for n in names if useful(n)])
    except (pa.ArrowInvalid, OSError) as error:
        raise ImportInputError(f"cannot read single-cell table {source}: {error}") from error


def _useful(name: str) -> bool:
    """Whether a column may be one cropbench looks up; in any case, as :func:`_find` matches them."""
    folded = name.casefold()
    return (
        any(part in folded for part in ("metadata", "location_center", "boundingbox", "imagenumber", "object_number"))
        or folded == "objectnumber"
        or _FILE_COLUMN.match(name) is not None
    )


def _without_suffix(name: str) -> str:
    return name[:-2] if name.endswith(("_x", "_y")) else name


def _find(names: Sequence[str], bases: Sequence[str]) -> str | None:
    """The first column named like one of ``bases``, with or without merge suffix: the exact name
    first, else the one column equal but for case; two such columns are an :class:`ImportInputError`
    naming both (the table says two things, and guessing would store the wrong one)."""
    exact = set(names)
    for base in bases:
        for suffix in MERGE_SUFFIXES:
            wanted = base + suffix
            if wanted in exact:
                return wanted
            folded = [name for name in names if name.casefold() == wanted.casefold()]
            if len(folded) > 1:
                raise ImportInputError(
                    f"{wanted} matches both {folded[0]!r} and {folded[1]!r}"
                    f"{f' (and {len(folded) - 2} more)' if len(folded) > 2 else ''}, columns that differ only in "
                    "case: rename one, or name the one you mean exactly"
                )
            if folded:
                return folded[0]
    return None


def _looked_for(bases: Sequence[str]) -> str:
    return ", ".join(bases) + " (each optionally with _x/_y)"


def _strings(table: pa.Table, column: str) -> list[str]:
    values = table[column].to_pylist()
    return ["" if v is None else (str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)) for v in values]


def _well_of(value: str) -> tuple[str, str] | None:
    for pattern, letters in ((_WELL, True), (_PHENIX_WELL, False)):
        match = pattern.match(value.strip())
        if match:
            row = match["row"].upper() if letters else _row_letters(int(match["row"]))
            return row, str(int(match["column"]))
    return None


def _row_letters(number: int) -> str:
    letters = ""
    while number > 0:
        number, remainder = divmod(number - 1, 26)
        letters = chr(ord("A") + remainder) + letters
    return letters


def _row_number(row: str) -> int:
    number = 0
    for letter in row:
        number = number * 26 + ord(letter) - ord("A") + 1
    return number


def _wells(table: pa.Table) -> tuple[list[tuple[str, str]], dict[str, str]]:
    names = table.column_names
    well_column = _find(names, WELL_COLUMNS)
    if well_column is not None:
        wells = []
        for value in _strings(table, well_column):
            well = _well_of(value)
            if well is None:
                raise ImportInputError(f"well {value!r} in column {well_column} is not like B7, B07 or r02c07")
            wells.append(well)
        return wells, {"well": well_column}
    row_column, column_column = _find(names, ROW_COLUMNS), _find(names, COLUMN_COLUMNS)
    if row_column is None or column_column is None:
        raise ImportInputError(
            f"the table names no well: looked for {_looked_for(WELL_COLUMNS)}, or a row column "
            f"({_looked_for(ROW_COLUMNS)}) with a column column ({_looked_for(COLUMN_COLUMNS)})"
        )
    wells = []
    for row, column in zip(_strings(table, row_column), _strings(table, column_column), strict=True):
        row_name = _row_letters(int(row)) if row.isdigit() else row.strip().upper()
        if not row_name.isalpha() or not column.strip().isdigit():
            raise ImportInputError(f"row {row!r} / column {column!r} ({row_column}, {column_column}) are not a well")
        wells.append((row_name, str(int(column))))
    return wells, {"row": row_column, "column": column_column}


def _centroids(table: pa.Table, compartment: str | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """(y, x, bbox) from the chosen compartment, or the first of Nuclei, Cells, Cytoplasm present."""
    names = table.column_names
    compartments = (compartment,) if compartment else COMPARTMENTS
    looked: list[str] = []
    for name in compartments:
        bases_x = (f"{name}_Location_Center_X", f"Metadata_{name}_Location_Center_X")
        bases_y = (f"{name}_Location_Center_Y", f"Metadata_{name}_Location_Center_Y")
        looked += [*bases_x, *bases_y]
        x_column, y_column = _find(names, bases_x), _find(names, bases_y)
        if x_column and y_column:
            y, x, bbox = _coordinates(table, name, y_column, x_column)
            return y, x, bbox, {"compartment": name}
    if compartment is None:
        x_column, y_column = _find(names, ("Location_Center_X",)), _find(names, ("Location_Center_Y",))
        looked += ["Location_Center_X", "Location_Center_Y"]
        if x_column and y_column:
            y, x, bbox = _coordinates(table, "", y_column, x_column)
            return y, x, bbox, {"compartment": None}
    present = sorted({m["compartment"] for m in map(_CENTROID_X.match, names) if m})
    has = (
        f"; the table has centroids of {', '.join(present)} (choose one with --compartment)"
        if present
        else "; the table has no <Compartment>_Location_Center_X column at all"
    )
    raise ImportInputError(f"the table has no object centroids: looked for {_looked_for(looked)}{has}")


def _coordinates(
    table: pa.Table,
    compartment: str,
    y_column: str,
    x_column: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    y = np.asarray(table[y_column].to_numpy(zero_copy_only=False), dtype=np.float64)
    x = np.asarray(table[x_column].to_numpy(zero_copy_only=False), dtype=np.float64)
    bad = ~(np.isfinite(y) & np.isfinite(x))
    if bad.any():
        raise ImportInputError(
            f"{int(bad.sum())} rows have no centroid in {x_column}/{y_column}, first row {int(np.flatnonzero(bad)[0])}"
        )
    prefix = f"{compartment}_" if compartment else ""
    box_bases = [
        f"{prefix}AreaShape_BoundingBox{edge}_{axis}"
        for edge, axis in (("Minimum", "Y"), ("Minimum", "X"), ("Maximum", "Y"), ("Maximum", "X"))
    ]
    box_columns = [_find(table.column_names, (base,)) for base in box_bases]
    if all(box_columns):
        boxes = np.stack([np.asarray(table[c].to_numpy(zero_copy_only=False), np.float64) for c in box_columns], 1)
        boxes = np.where(np.isfinite(boxes), boxes, -1)
        bbox = np.concatenate([np.floor(boxes[:, :2]), np.ceil(boxes[:, 2:])], axis=1).astype(np.int64)
    else:
        bbox = np.full((len(y), 4), -1, dtype=np.int64)
    return y, x, bbox


def _file_columns(names: Sequence[str]) -> dict[str, dict[str, str]]:
    """channel → {"FileName": column, "PathName": column}; ``Orig`` and merge suffixes dropped.

    When both ``FileName_X`` and ``FileName_OrigX`` exist, the ``Orig`` column (the raw image the
    pipeline started from) wins; a column without merge suffix wins over ``_x``, ``_x`` over ``_y``.
    """
    found: dict[str, dict[str, tuple[tuple[int, int], str]]] = {}
    for name in names:
        match = _FILE_COLUMN.match(name)
        if match is None:
            continue
        rank = (0 if match["orig"] else 1, MERGE_SUFFIXES.index(match["suffix"] or ""))
        slot = found.setdefault(match["channel"], {})
        if match["kind"] not in slot or rank < slot[match["kind"]][0]:
            slot[match["kind"]] = (rank, name)
    return {
        channel: {kind: column for kind, (_, column) in kinds.items()}
        for channel, kinds in found.items()
        if "FileName" in kinds
    }


def _choose_channels(
    available: Sequence[str], options: ImportOptions, skipped: dict[str, str]
) -> list[tuple[str, str]]:
    if options.channels is None:
        if not available:
            raise ImportInputError(f"no image channel to import ({'; '.join(f'{k}: {v}' for k, v in skipped.items())})")
        return [(channel, channel) for channel in available]
    for source, _ in options.channels:
        if source not in available:
            why = f" ({skipped[source]})" if source in skipped else ""
            raise ImportInputError(f"channel {source!r}{why} is not in the input; channels: {', '.join(available)}")
    return list(options.channels)


def _resolve_file(images: Path, name: str, folder: str | None) -> Path:
    if folder:
        recorded = Path(folder) / name
        if recorded.is_file():
            return recorded
    return images / name


def _files_from_columns(
    table: pa.Table,
    images: Path,
    columns: dict[str, dict[str, str]],
    chosen: list[tuple[str, str]],
) -> list[tuple[Path, ...]]:
    per_channel = []
    for source, _ in chosen:
        names = _strings(table, columns[source]["FileName"])
        folders = _strings(table, columns[source]["PathName"]) if "PathName" in columns[source] else [""] * len(names)
        per_channel.append([_resolve_file(images, n, f) for n, f in zip(names, folders, strict=True)])
    return [tuple(files) for files in zip(*per_channel, strict=True)]


def _phenix_files(images: Path) -> dict[tuple[int, int, int, int, int], Path]:
    found = {}
    for path in sorted(images.iterdir()) if images.is_dir() else []:
        match = _PHENIX.match(path.name)
        if match:
            key = tuple(int(match[k]) for k in ("row", "column", "field", "plane", "channel"))
            found[key] = path
    return found  # type: ignore[return-value]


def plan_import(table_path: str | Path, images: str | Path, options: ImportOptions | None = None) -> ImportPlan:
    """Resolve and check everything an import needs; raises :class:`ImportInputError` on bad input."""
    options = options or ImportOptions()
    table = read_table(table_path, options.labels)
    images_dir = Path(images)
    if not images_dir.is_dir():
        raise ImportInputError(f"image folder {images_dir} does not exist")
    names = table.column_names
    row_numbers = np.arange(table.num_rows, dtype=np.int64)
    used: dict[str, Any] = {}
    plate_column = _find(names, PLATE_COLUMNS)
    if plate_column is not None:
        plates = _strings(table, plate_column)
        distinct = sorted(set(plates))
        if options.plate is not None:
            keep = np.array([p == options.plate for p in plates])
            if not keep.any():
                raise ImportInputError(
                    f"plate {options.plate!r} is not in {plate_column}; it has {', '.join(distinct)}"
                )
            table, row_numbers = table.filter(pa.array(keep)), row_numbers[keep]
        elif len(distinct) > 1:
            raise ImportInputError(
                f"the table holds {len(distinct)} plates ({', '.join(distinct[:5])}); choose one with --plate"
            )
        used["plate"] = plate_column
    elif options.plate is not None:
        raise ImportInputError(f"--plate {options.plate!r} given, but the table has no {_looked_for(PLATE_COLUMNS)}")
    if table.num_rows == 0:
        raise ImportInputError(f"the single-cell table {table_path} has no rows")
    plate_name = (
        options.name or options.plate or (_strings(table, plate_column)[0] if plate_column else Path(table_path).stem)
    )
    wells, well_columns = _wells(table)
    used.update(well_columns)
    site_column = _find(names, SITE_COLUMNS)
    sites = _strings(table, site_column) if site_column else None
    used["site"] = site_column
    centroid_y, centroid_x, bbox, compartment = _centroids(table, options.compartment)
    used.update(compartment)

    file_columns = _file_columns(names)
    skipped: dict[str, str] = {}
    if file_columns:
        available = []
        for channel, kinds in file_columns.items():
            first = _strings(table, kinds["FileName"])[0]
            if first.lower().endswith(IMAGE_SUFFIXES):
                available.append(channel)
            else:
                skipped[channel] = f"{kinds['FileName']} holds {first!r}, not a TIFF"
        chosen = _choose_channels(available, options, skipped)
        row_files = _files_from_columns(table, images_dir, file_columns, chosen)
        used["files"] = {source: file_columns[source] for source, _ in chosen}
    else:
        phenix = _phenix_files(images_dir)
        if not phenix:
            raise ImportInputError(
                "the table has no file name columns (looked for Image_FileName_<Channel>, "
                f"Image_FileName_Orig<Channel>, FileName_<Channel>) and {images_dir} holds no Phenix-style files "
                "like r01c01f01p01-ch1sk1fk1fl1.tiff"
            )
        if sites is None:
            raise ImportInputError(f"Phenix-style files need a site per row: looked for {_looked_for(SITE_COLUMNS)}")
        available = [f"ch{c}" for c in sorted({key[4] for key in phenix})]
        chosen = _choose_channels(available, options, skipped)
        row_files = []
        for (row, column), site in zip(wells, sites, strict=True):
            if not site.isdigit():
                raise ImportInputError(f"site {site!r} in {site_column} is not a Phenix field number")
            key = (_row_number(row), int(column), int(site), options.plane)
            row_files.append(
                tuple(
                    phenix.get((*key, int(source[2:])), images_dir / _phenix_name(*key, int(source[2:])))
                    for source, _ in chosen
                )
            )
        used["files"] = "phenix"

    fields, field_of_row = _group_fields(wells, sites, row_files)
    _check_files_exist(fields, [source for source, _ in chosen], source_names=available)
    channel_names = tuple(target for _, target in chosen)
    field_shape, dtype = _check_shapes(fields, channel_names)
    _check_inside(centroid_y, centroid_x, field_shape, fields, field_of_row, row_numbers)
    ordered = _sites_in_order(fields)
    site_index = {id(field): number for number, field in _field_numbers(ordered)}
    identity, identity_columns = _identity(
        table, [fields[f].site for f in field_of_row], row_numbers, compartment["compartment"]
    )
    labels, label_columns = _labels(table, options.labels)
    used.update(identity_columns)
    pixel_size, pixel_size_column = _pixel_size(table, options.pixel_size_um)
    used["pixel_size"] = pixel_size_column
    objects = ObjectTable.from_columns(
        well=np.array([fields[f].well for f in field_of_row], dtype=object),
        field=np.array([site_index[id(fields[f])] for f in field_of_row], dtype=np.int64),
        centroid_y=centroid_y,
        centroid_x=centroid_x,
        plate=plate_name,
        bbox=bbox,
        object_id=row_numbers,
        extra={**identity, **labels},
    )
    classes = {name: label_classes(values) for name, values in labels.items() if values.dtype == object}
    return ImportPlan(
        name=plate_name,
        channel_names=channel_names,
        fields=tuple(ordered),
        field_shape=field_shape,
        dtype=dtype,
        objects=objects,
        columns={**used, "channels": dict(chosen), "labels": label_columns},
        label_classes=classes,
        pixel_size_um=pixel_size,
    )


def _check_files_exist(fields: list[FieldSource], sources: list[str], source_names: list[str]) -> None:
    """Every file must exist; the error says which channel each missing file is and which channels are whole."""
    missing: dict[str, list[Path]] = {}
    for field in fields:
        for source, path in zip(sources, field.files, strict=True):
            if not path.is_file():
                if path.exists():  # a FIFO would block the header read forever, a device never ends
                    raise ImportInputError(
                        f"image file {path} (channel {source}) is not a regular file (a FIFO, device or folder)"
                    )
                missing.setdefault(source, []).append(path)
    if not missing:
        return
    paths = sorted({(str(path), source) for source, files in missing.items() for path in files})
    shown = ", ".join(f"{path} (channel {source})" for path, source in paths[:_MISSING_SHOWN])
    more = f" and {len(paths) - _MISSING_SHOWN} more" if len(paths) > _MISSING_SHOWN else ""
    per_channel = ", ".join(
        f"{source} ({len(set(files))} of {len(fields)} fields)" for source, files in missing.items()
    )
    whole = [source for source in sources if source not in missing]
    hint = (
        f"to import only the channels whose files are all there: {' '.join(f'--channel {s}' for s in whole)}"
        if whole
        else f"no channel has all its files: is --images the right folder? (channels: {', '.join(source_names)})"
    )
    # One line (the CLI prints one): counts per channel, the first files, then what to do.
    raise ImportInputError(f"{len(paths)} image files are missing, of channels {per_channel}: {shown}{more}; {hint}")


def _identity(
    table: pa.Table,
    sites: list[str],
    row_numbers: np.ndarray,
    compartment: str | None,
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Where each cell came from: source row and site, and CellProfiler's ImageNumber / ObjectNumber if present."""
    identity: dict[str, np.ndarray] = {
        "source_row": row_numbers.copy(),
        "source_site": (
            np.array([int(site) for site in sites], dtype=np.int64)
            if all(s.isdigit() for s in sites)
            else np.array(sites, dtype=object)
        ),
    }
    used: dict[str, str] = {}
    object_bases = (
        (f"{compartment}_Number_Object_Number", f"Metadata_{compartment}_Number_Object_Number") if compartment else ()
    )
    numbers = (("ImageNumber", IMAGE_NUMBER_COLUMNS), ("ObjectNumber", (*object_bases, *OBJECT_NUMBER_COLUMNS)))
    for name, bases in numbers:
        column = _find(table.column_names, bases)
        if column is not None:
            values = _within_int64(column, column_values(table[column]))
            integral = values.dtype.kind in "iu" or (
                values.dtype.kind == "f" and np.all(np.isfinite(values)) and np.all(values == np.round(values))
            )
            if integral and values.dtype.kind == "f" and values.size and np.abs(values).max() >= 2.0**63:
                raise ImportInputError(f"{column} holds {np.abs(values).max():.0f}, outside int64")
            identity[name] = values.astype(np.int64) if integral else values
            used[name] = column
    return identity, used


def _labels(table: pa.Table, names: Sequence[str]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The ``--label`` columns, as they are in the table (strings as objects, numbers as numbers)."""
    values: dict[str, np.ndarray] = {}
    used: dict[str, str] = {}
    for name in names:
        column = _find(table.column_names, (name,))
        if column is None:
            metadata = [n for n in table.column_names if "Metadata" in n and "FileName" not in n]
            raise ImportInputError(
                f"--label {name}: the table has no column {name!r} (nor with _x/_y); "
                f"its metadata columns: {', '.join(metadata[:30]) or 'none'}"
            )
        values[name] = _within_int64(column, column_values(table[column]))
        used[name] = column
    return values, used


def _within_int64(column: str, values: np.ndarray) -> np.ndarray:
    """Unsigned integers as int64 (what a batch of labels becomes), or an :class:`ImportInputError`
    naming the column and the first value int64 cannot hold (it would fail every batch, or wrap)."""
    if values.dtype.kind != "u":
        return values
    limit = np.iinfo(np.int64).max
    beyond = np.flatnonzero(values > limit)
    if beyond.size:
        raise ImportInputError(
            f"{column} holds {int(values[beyond[0]])} (row {int(beyond[0])}, {beyond.size} such rows), outside "
            f"int64 (at most {limit}): labels and identity numbers are stored as int64"
        )
    return values.astype(np.int64)


def _pixel_size(table: pa.Table, given: float | None) -> tuple[tuple[float, float] | None, str | None]:
    """(y, x) micrometres per pixel: ``given`` (--pixel-size), else the table's ImageResolutionX/Y, else None."""
    if given is not None:
        return (float(given), float(given)), "--pixel-size"
    sizes: dict[str, float] = {}
    columns: dict[str, str] = {}
    for axis, bases in RESOLUTION_COLUMNS.items():
        column = _find(table.column_names, bases)
        if column is None:
            continue
        values = np.asarray(table[column].to_numpy(zero_copy_only=False), dtype=np.float64)
        distinct = np.unique(values[np.isfinite(values)])
        if len(distinct) > 1:
            raise ImportInputError(
                f"{column} holds {len(distinct)} pixel sizes ({', '.join(f'{v:g}' for v in distinct[:5])}); "
                "a plate has one: choose it with --pixel-size"
            )
        if len(distinct) == 1 and distinct[0] > 0:
            sizes[axis], columns[axis] = float(distinct[0]), column
    if "X" not in sizes:
        return None, None
    return (sizes.get("Y", sizes["X"]), sizes["X"]), ", ".join(columns.values())


def _phenix_name(row: int, column: int, field: int, plane: int, channel: int) -> str:
    return f"r{row:02d}c{column:02d}f{field:02d}p{plane:02d}-ch{channel}sk1fk1fl1.tiff"


def _site_key(site: str) -> tuple[int, int | str]:
    return (0, int(site)) if site.isdigit() else (1, site)


def _group_fields(
    wells: list[tuple[str, str]],
    sites: list[str] | None,
    row_files: list[tuple[Path, ...]],
) -> tuple[list[FieldSource], list[int]]:
    """One field per (well, site); without a site column, one per distinct file set in a well."""
    keys: dict[tuple[str, str, str], int] = {}
    fields: list[FieldSource] = []
    field_of_row = []
    derived: dict[tuple[str, str, tuple[Path, ...]], str] = {}
    for number, ((row, column), files) in enumerate(zip(wells, row_files, strict=True)):
        if sites is not None:
            site = sites[number]
        else:
            site = derived.setdefault((row, column, files), str(sum(k[:2] == (row, column) for k in derived) + 1))
        key = (row, column, site)
        index = keys.get(key)
        if index is None:
            index = keys[key] = len(fields)
            fields.append(FieldSource(row=row, column=column, site=site, files=files))
        elif fields[index].files != files:
            raise ImportInputError(
                f"well {row}{column} site {site} names different files in different rows "
                f"({fields[index].files[0].name} and {files[0].name}): the site column does not identify fields"
            )
        field_of_row.append(index)
    return fields, field_of_row


def _sites_in_order(fields: list[FieldSource]) -> list[FieldSource]:
    return sorted(fields, key=lambda f: (_row_number(f.row), int(f.column), _site_key(f.site)))


def _check_shapes(fields: list[FieldSource], channel_names: tuple[str, ...]) -> tuple[tuple[int, int, int], str]:
    """Every channel of every field must be one 2-D plane of the same shape and dtype (read from headers)."""
    expected: tuple[tuple[int, int], str, Path] | None = None
    for field in fields:
        shapes = []
        for channel, path in zip(channel_names, field.files, strict=True):
            shape, dtype = _tiff_plane(path, channel)
            shapes.append((channel, shape, dtype, path))
        first_channel, first_shape, first_dtype, first_path = shapes[0]
        for channel, shape, dtype, path in shapes[1:]:
            if shape != first_shape or dtype != first_dtype:
                raise ImportInputError(
                    f"channels of well {field.well} site {field.site} differ: {first_channel} is {first_shape} "
                    f"{first_dtype} ({first_path}), {channel} is {shape} {dtype} ({path})"
                )
        if expected is None:
            expected = (first_shape, first_dtype, first_path)
        elif (first_shape, first_dtype) != expected[:2]:
            raise ImportInputError(
                f"fields differ in shape or dtype: {expected[2].name} is {expected[0]} {expected[1]}, "
                f"{first_path.name} is {first_shape} {first_dtype}; a plate needs one field shape"
            )
    assert expected is not None
    (height, width), dtype, _ = expected
    return (len(channel_names), height, width), dtype


def _tiff_plane(path: Path, channel: str) -> tuple[tuple[int, int], str]:
    """(height, width) and dtype of one channel file, from its header; its pixel data must all be there."""
    try:
        size = path.stat().st_size
        with tifffile.TiffFile(path) as tiff:
            series = tiff.series[0] if tiff.series else None
            page = tiff.pages.first if series is not None else None
            shape = tuple(int(s) for s in series.shape) if series is not None else ()
            dtype = np.dtype(series.dtype).name if series is not None else ""
            end = (
                max((int(o) + int(b) for o, b in zip(page.dataoffsets, page.databytecounts, strict=True)), default=0)
                if page is not None
                else 0
            )
    except Exception as error:  # tifffile raises many unrelated types (IndexError, struct.error, ...) on bad bytes
        raise ImportInputError(f"cannot read TIFF {path} ({channel}), damaged or cut short: {error}") from error
    if series is None:
        raise ImportInputError(f"TIFF {path} ({channel}) holds no image: its header is cut short or damaged")
    plane = tuple(s for s in shape if s != 1)
    if len(plane) != 2:
        raise ImportInputError(f"TIFF {path} ({channel}) holds shape {shape}, not one 2-D plane")
    if end > size:
        raise ImportInputError(
            f"TIFF {path} ({channel}) is truncated: its pixel data ends at byte {end:,}, the file has {size:,} bytes"
        )
    if dtype not in DTYPES:
        raise ImportInputError(f"TIFF {path} ({channel}) holds {dtype} pixels; a plate stores {', '.join(DTYPES)}")
    return (plane[0], plane[1]), dtype


def _check_inside(
    y: np.ndarray,
    x: np.ndarray,
    shape: tuple[int, int, int],
    fields: list[FieldSource],
    field_of_row: list[int],
    row_numbers: np.ndarray,
) -> None:
    _, height, width = shape
    outside = (y < 0) | (y >= height) | (x < 0) | (x >= width)
    if outside.any():
        shown = [
            f"row {int(row_numbers[i])} (well {fields[field_of_row[i]].well} site {fields[field_of_row[i]].site}: "
            f"x={x[i]:.1f}, y={y[i]:.1f})"
            for i in np.flatnonzero(outside)[:5]
        ]
        raise ImportInputError(
            f"{int(outside.sum())} centroids lie outside the {height}x{width} field: {'; '.join(shown)}"
        )


def import_plate(
    table: str | Path,
    images: str | Path,
    out: str | Path,
    layout: LayoutSpec,
    options: ImportOptions | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> GeneratedPlate:
    """Write the plate (pixels in ``layout``) and its object table; returns what was written."""
    options = options or ImportOptions()
    destination = Path(out)
    check_replaceable(destination, overwrite)  # before reading any input
    plan = plan_import(table, images, options)
    wells = plan.wells()
    counts = [sum((f.row, f.column) == well for f in plan.fields) for well in wells]
    first = _read_field(plan.fields[0], plan.channel_names, plan.field_shape)
    provenance = {
        "table": str(Path(table).resolve()),
        "images": str(Path(images).resolve()),
        "columns": plan.columns,
        "sites": {f"{f.well}/{i}": f.site for i, f in _field_numbers(plan.fields)},
    }
    pixel_size = {"pixel_size_um": list(plan.pixel_size_um) if plan.pixel_size_um else None}
    started = time.perf_counter()
    with staged(destination, overwrite) as scratch:  # a failed import leaves no partial plate
        geometry = PlateGeometry(
            plan.name,
            tuple(plan.channel_names),
            plan.field_shape,
            tuple(wells),
            tuple(counts),
            display_ranges=tuple(display_ranges(first)),
        )
        writer = create_plate_writer(scratch, geometry, layout, {"import": provenance, **pixel_size})
        for number, field in tqdm(_field_numbers(plan.fields), desc="fields", unit="field", disable=not progress):
            pixels = first if field is plan.fields[0] else _read_field(field, plan.channel_names, plan.field_shape)
            writer.write_field(field.row, field.column, number, pixels)
        writer.close()
        plan.objects.write(scratch / OBJECT_TABLE_NAME)
        if plan.label_classes:
            write_label_classes(scratch, plan.label_classes)
    elapsed = time.perf_counter() - started
    raw = len(plan.fields) * int(np.prod(plan.field_shape)) * np.dtype(plan.dtype).itemsize
    return GeneratedPlate(
        path=destination,
        fields=len(plan.fields),
        objects=len(plan.objects),
        raw_bytes=raw,
        stored_bytes=stored_size(destination),
        write_seconds=elapsed,
    )


def _field_numbers(fields: Sequence[FieldSource]) -> list[tuple[int, FieldSource]]:
    """(site index inside its well, field), in plate order."""
    seen: dict[str, int] = {}
    numbered = []
    for field in fields:
        numbered.append((seen.get(field.well, 0), field))
        seen[field.well] = seen.get(field.well, 0) + 1
    return numbered


def _read_field(field: FieldSource, channel_names: Sequence[str], shape: tuple[int, int, int]) -> np.ndarray:
    planes = []
    for channel, path in zip(channel_names, field.files, strict=True):
        try:
            planes.append(tifffile.imread(path).reshape(shape[1:]))
        except Exception as error:  # tifffile and imagecodecs raise many unrelated types on corrupt data
            raise ImportInputError(
                f"cannot read TIFF {path} ({channel}) of well {field.well} site {field.site}: "
                f"{type(error).__name__}: {error}"
            ) from error
    return np.stack(planes)
