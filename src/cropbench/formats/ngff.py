"""OME-NGFF metadata: read plate → well → field structure from zarr v3 (0.5) or v2 (0.4) stores.

Plain JSON reads, no zarr import: listing a plate must be cheap in every worker.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cropbench.errors import StoreError
from cropbench.formats.base import FieldInfo, PlateMetadata
from cropbench.formats.metadata import ArrayMetadata, parse_array_metadata

NGFF_VERSION = "0.5"


def read_attributes(node: Path) -> dict[str, Any] | None:
    """The NGFF attributes of a zarr group (v3 ``zarr.json`` or v2 ``.zattrs``), or None."""
    v3 = node / "zarr.json"
    if v3.is_file():
        document = _load_json(v3)
        attributes = document.get("attributes", {})
        if not isinstance(attributes, dict) or not isinstance(attributes.get("ome", {}), dict):
            raise StoreError(f"metadata {v3}: 'attributes' (and its 'ome') must be JSON objects")
        if "ome" not in attributes:
            return attributes
        # NGFF 0.5 keeps its metadata under "ome"; cropbench's own block sits beside it.
        return {**attributes["ome"], **({"cropbench": attributes["cropbench"]} if "cropbench" in attributes else {})}
    v2 = node / ".zattrs"
    if v2.is_file():
        return _load_json(v2)
    if (node / ".zgroup").is_file():
        return {}
    return None


def read_array_document(array_dir: Path) -> dict[str, Any]:
    """The array metadata (``zarr.json`` or ``.zarray``) of one zarr array."""
    return _array_document(array_dir)[0]


def read_array_metadata(array_dir: Path) -> ArrayMetadata:
    """The array metadata of one zarr array, every value checked (see :mod:`.metadata`)."""
    return parse_array_metadata(*_array_document(array_dir))


def _array_document(array_dir: Path) -> tuple[dict[str, Any], Path]:
    for name in ("zarr.json", ".zarray"):
        candidate = array_dir / name
        if candidate.is_file():
            document = _load_json(candidate)
            if name == "zarr.json" and document.get("node_type") != "array":
                break
            return document, candidate
    raise StoreError(f"{array_dir} is not a zarr array (no array zarr.json or .zarray)")


def _load_json(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise StoreError(f"cannot read metadata {path}: {error}") from error
    if not isinstance(document, dict):
        raise StoreError(f"metadata {path} holds a JSON {type(document).__name__}, not an object")
    return document


def _image_array(image_dir: Path) -> tuple[str, list[str] | None, dict[str, Any], list[str] | None]:
    """Full-resolution array path (relative to the image), channel labels, omero block and axis names."""
    attributes = read_attributes(image_dir)
    if not attributes or "multiscales" not in attributes:
        raise StoreError(f"{image_dir} is not an OME-NGFF image (no 'multiscales' metadata)")
    datasets = attributes["multiscales"][0].get("datasets", [])
    if not datasets:
        raise StoreError(f"{image_dir} has 'multiscales' without datasets")
    omero = attributes.get("omero", {})
    labels = [channel.get("label", f"c{i}") for i, channel in enumerate(omero.get("channels", []))] or None
    axes = attributes["multiscales"][0].get("axes")
    names = [str(a.get("name") if isinstance(a, dict) else a) for a in axes] if axes else None
    return str(datasets[0]["path"]), labels, omero, names


def read_plate_metadata(path: str | Path, format: str = "ome-zarr") -> PlateMetadata:
    """Parse an NGFF HCS plate, or a single NGFF image treated as a one-field plate."""
    root = Path(path)
    if not root.exists():
        raise StoreError(f"plate store {root} does not exist")
    attributes = read_attributes(root)
    if attributes is None:
        raise StoreError(f"{root} is not a zarr group (no zarr.json, .zattrs or .zgroup)")
    try:
        if "plate" in attributes:
            return _plate_from_hcs(root, attributes, format)
        if "multiscales" in attributes:
            return _plate_from_image(root, format)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as error:
        raise StoreError(f"plate metadata of {root} is malformed: {type(error).__name__} {error}") from error
    raise StoreError(f"{root} is neither an OME-NGFF plate nor an image (no 'plate' or 'multiscales' metadata)")


def _plate_from_hcs(root: Path, attributes: dict[str, Any], format: str) -> PlateMetadata:
    plate = attributes["plate"]
    name = str(plate.get("name", root.stem))
    fields: list[FieldInfo] = []
    first: tuple[list[str] | None, dict[str, Any], ArrayMetadata, list[str] | None] | None = None
    arrays: list[ArrayMetadata] = []
    for well in plate.get("wells", []):
        well_path = str(well["path"])
        row, column = well_path.split("/")[:2]
        well_attributes = read_attributes(root / well_path)
        if not well_attributes or "well" not in well_attributes:
            raise StoreError(f"well {root / well_path} has no 'well' metadata")
        for site, image in enumerate(well_attributes["well"].get("images", [])):
            image_path = f"{well_path}/{image['path']}"
            array_path, labels, omero, axes = _image_array(root / image_path)
            array = read_array_metadata(root / image_path / array_path)
            if first is None:
                first = (labels, omero, array, axes)
            elif _shape_and_type(array) != _shape_and_type(first[2]):
                raise StoreError(
                    f"field {image_path} of {root} has shape and type {_shape_and_type(array)}, but the first "
                    f"field has {_shape_and_type(first[2])}; cropbench reads plates whose fields all match"
                )
            arrays.append(array)
            fields.append(
                FieldInfo(
                    index=len(fields),
                    plate=name,
                    well=f"{row}{column}",
                    row=row,
                    column=column,
                    field=site,
                    path=f"{image_path}/{array_path}",
                )
            )
    if first is None:
        raise StoreError(f"plate {root} lists no wells with fields")
    labels, omero, _, axes = first
    return _metadata(root, name, fields, labels, omero, arrays, format, attributes, axes)


def _shape_and_type(array: ArrayMetadata) -> tuple[list[int], str]:
    return list(array.shape), array.dtype.name


def _plate_from_image(root: Path, format: str) -> PlateMetadata:
    array_path, labels, omero, axes = _image_array(root)
    array = read_array_metadata(root / array_path)
    info = FieldInfo(index=0, plate=root.stem, well="A1", row="A", column="1", field=0, path=array_path)
    return _metadata(root, root.stem, [info], labels, omero, [array], format, {}, axes)


def _metadata(
    root: Path,
    name: str,
    fields: list[FieldInfo],
    labels: list[str] | None,
    omero: dict[str, Any],
    arrays: list[ArrayMetadata],
    format: str,
    attributes: dict[str, Any],
    axes: list[str] | None = None,
) -> PlateMetadata:
    full_shape = arrays[0].shape
    if len(full_shape) == 2:
        raise StoreError(f"field arrays of {root} are 2-D {full_shape}; cropbench needs (c, y, x)")
    # NGFF orders axes t, c, z, y, x: the channel axis is named "c" (else the one before y, x).
    channel_axis = axes.index("c") if axes and len(axes) == len(full_shape) and "c" in axes else len(full_shape) - 3
    others = [s for i, s in enumerate(full_shape[:-2]) if i != channel_axis]
    if any(s != 1 for s in others):
        raise StoreError(
            f"field arrays of {root} have shape {full_shape} (axes {axes}); only singleton t/z axes are supported"
        )
    shape = (full_shape[channel_axis], full_shape[-2], full_shape[-1])
    dtype = arrays[0].dtype.name
    channel_names = tuple(labels) if labels and len(labels) == shape[0] else tuple(f"c{i}" for i in range(shape[0]))
    windows = [channel.get("window") or {} for channel in omero.get("channels", [])]
    display_ranges = tuple((float(w.get("start", 0.0)), float(w.get("end", 65535.0))) for w in windows)
    return PlateMetadata(
        path=root,
        name=name,
        fields=tuple(fields),
        channel_names=channel_names,
        field_shape=(shape[0], shape[1], shape[2]),
        dtype=dtype,
        format=format,
        display_ranges=display_ranges,
        attributes=dict(attributes.get("cropbench") or {}),
        channel_axis=channel_axis,
        arrays=tuple(arrays),
    )


def array_chunk_shape(document: dict[str, Any]) -> tuple[int, ...]:
    """The decoded unit of an array: the inner chunk when sharded, else the chunk."""
    if document.get("zarr_format") == 2:
        return tuple(int(c) for c in document["chunks"])
    codecs = document.get("codecs", [])
    if codecs and codecs[0]["name"] == "sharding_indexed":
        return tuple(int(c) for c in codecs[0]["configuration"]["chunk_shape"])
    return tuple(int(c) for c in document["chunk_grid"]["configuration"]["chunk_shape"])
