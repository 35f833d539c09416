"""Fixtures of the asv suites: the plates ``setup_cache`` writes once, and the ``Benchmark`` base.

asv imports the suites under every commit it measures, so a suite module imports what it calls from
cropbench at its top inside ``try``: where the measured commit lacks it, :func:`older_commit` says
what, and each ``setup`` of the module skips with that reason (:func:`skip`). On the current checkout
every benchmark must run (tests/test_benchmarks.py), which is what catches a rename. Nothing a class
statement needs (``params``, ``unit``) comes from cropbench. The full grid's classes (``FullFetch``,
``Latency``, ...) have fixed parameters and skip unless ``CROPBENCH_ASV_FULL=1`` is set when they run
(:func:`full_grid_off`), so names and parameters never depend on the environment asv started in.
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

#: Opt-in switch of the full-grid classes, read when a benchmark runs (not at import).
FULL_GRID_SWITCH = "CROPBENCH_ASV_FULL"
#: Where ``setup_cache`` writes plates (relative to asv's per-run cache directory).
PLATE_DIR = "plates"
#: What an installed ome-arrow must offer for cropbench to write its layouts: keyword -> first release.
OME_ARROW_WRITER_KEYWORDS = {"chunk_shape": "0.0.6", "chunk_encoding": "0.0.10", "chunk_compression": "0.0.10"}
#: Prefix of a ``setup_cache`` plate value that is a reason, not a path.
UNAVAILABLE = "unavailable: "
#: The memory limit of the out-of-memory plate's reader (page cache included) and the plate's size over it.
#: The child is forked from asv's benchmark process (torch imported), whose pages it copies as it writes
#: them: 96 MiB ran out of memory there, 160 MiB did not (the same pass in a plain process fits 96).
LIMIT_BYTES = 160 * 2**20
PLATE_MULTIPLE = 4.0
#: The out-of-memory plate's fields: 540 px and 5 channels (2.9 MB decoded each), four rendered and written in turn.
FIELD_SIZE, CHANNELS, DISTINCT_FIELDS = 540, 5, 4


def older_commit(error: ImportError) -> str:
    """Why a suite module's benchmarks skip: the measured commit's cropbench lacks a module or name it
    imports (given the ``ImportError``); an import error outside cropbench is a broken environment and raised."""
    if not (error.name or "").startswith("cropbench"):
        raise error
    return f"this commit of cropbench lacks what the benchmark uses: {error}"


def skip(reason: str | None) -> None:
    """asv's skip (``NotImplementedError``) where there is a reason not to run the case."""
    if reason:
        raise NotImplementedError(reason)


def full_grid_off(what: str) -> str | None:
    """Why a full-grid class skips: ``CROPBENCH_ASV_FULL=1`` was not set (see the module docstring), or None."""
    if os.environ.get(FULL_GRID_SWITCH, "") == "1":
        return None
    return f"{what}: full grid, runs with {FULL_GRID_SWITCH}=1"


def full_layouts() -> list[str]:
    """Every named layout of this commit (the full grid's ``layout`` values)."""
    try:
        from cropbench.config import LAYOUTS
    except ImportError as error:
        older_commit(error)
        return ["default"]
    return sorted(LAYOUTS)


def missing_writer_feature(layout: Any) -> str | None:
    """Why the installed format library cannot write ``layout`` (a feature its release lacks), or None."""
    if getattr(layout, "format", "") != "ome-arrow":
        return None
    try:
        import ome_arrow
    except ImportError:
        return "ome-arrow is not installed"
    keywords = inspect.signature(ome_arrow.from_numpy).parameters
    for keyword, since in OME_ARROW_WRITER_KEYWORDS.items():
        if keyword not in keywords:
            return f"ome-arrow {version('ome-arrow')}: from_numpy has no {keyword}= (added in {since})"
    return None


def write_plates(preset: str, names: Sequence[str]) -> dict[str, str]:
    """Each named layout's plate path, or why it could not be written (a setup_cache may not skip: asv fails it)."""
    try:
        from cropbench.config import layout_by_name, plate_preset
        from cropbench.plates.generate import generate_plate
    except ImportError as error:
        return dict.fromkeys(names, UNAVAILABLE + older_commit(error))
    plates = {}
    for name in names:
        try:
            layout = layout_by_name(name)
        except ValueError as error:  # an older commit without this layout
            plates[name] = UNAVAILABLE + str(error)
            continue
        missing = missing_writer_feature(layout)
        if missing is not None:
            plates[name] = UNAVAILABLE + missing
            continue
        path = Path(PLATE_DIR, preset, f"{name}.zarr").absolute()
        generate_plate(path, plate_preset(preset), layout, overwrite=True, progress=False)
        plates[name] = str(path)
    return plates


def make_plates() -> dict[str, str]:
    """``setup_cache`` of the default grid: the smoke plate in the default layout."""
    return write_plates("smoke", ["default"])


def make_arrow_plates() -> dict[str, str]:
    """``setup_cache`` of the OME-Arrow cases: the smoke plate in the ``ome-arrow`` layout, or why not."""
    return write_plates("smoke", ["ome-arrow"])


def make_full_plates() -> dict[str, str]:
    """``setup_cache`` of the full grid: the full plate in every layout, or nothing unless asked for."""
    return write_plates("full", full_layouts()) if full_grid_off("") is None else {}


def make_out_of_memory_plate() -> dict[str, Any]:
    """``setup_cache`` of ``scale.OutOfMemoryComparison``: a scale plate in the default layout, ``PLATE_MULTIPLE`` ×
    ``LIMIT_BYTES`` on disk, or why it could not be written (a setup_cache may not skip: asv fails it)."""
    try:
        from cropbench.config import layout_by_name
        from cropbench.harness.work import WorkFolder
        from cropbench.plates.scale import ScaleSpec, generate_scale_plate
        from cropbench.tracks.out_of_memory import OutOfMemoryComparison, plate_spec_for
    except ImportError as error:
        return {"plate": UNAVAILABLE + older_commit(error)}
    comparison = OutOfMemoryComparison(
        layouts=("default",),
        limit_bytes=LIMIT_BYTES,
        plate_multiple=PLATE_MULTIPLE,
        plate=ScaleSpec(field_size=FIELD_SIZE, channels=CHANNELS, distinct_fields=DISTINCT_FIELDS),
    )
    root = Path(PLATE_DIR, "scale").absolute()
    spec = plate_spec_for(comparison, "default", WorkFolder(root, keep=True))
    path = root / "out-of-memory-default.zarr"
    written = generate_scale_plate(path, spec, layout_by_name("default"), overwrite=True, progress=False)
    return {"plate": str(path), "stored_bytes": written.stored_bytes}


def plate_for(plates: dict[str, str], layout: str) -> str:
    """The path of ``layout``'s plate from a ``setup_cache`` value; asv's skip where it was not written."""
    if layout not in plates:
        raise NotImplementedError(f"layout {layout!r} was not generated (layouts: {', '.join(plates) or 'none'})")
    skip(plates[layout] if plates[layout].startswith(UNAVAILABLE) else None)
    return plates[layout]


class Benchmark:
    """asv attributes every suite shares: wall clock, one call per sample, up to 20 samples in ~2 s per
    round, two rounds that ``asv continuous`` interleaves across the two commits. asv keeps only the last
    round of a ``track_*`` benchmark, so a gated value is a statistic over many blocks in one call or a
    count. A suite bumps ``version`` when what it measures is redefined."""

    timer = staticmethod(time.perf_counter)
    number = 1
    repeat = (10, 20, 2.0)
    warmup_time = 0.2
    rounds = 2
    version = "1"
    setup_cache = staticmethod(make_plates)
