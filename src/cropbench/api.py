"""``cropbench.run``: what the command line, notebooks and asv call to measure a plate.

It checks the request, rewrites the plate into a named layout when asked, pins threads, runs the
tracks through the one runner, appends each record durably to ``OUT/results.jsonl`` as it finishes
(with ``out_dir``), and returns this run's records. :func:`compare_layouts` and :func:`smoke` are
the two fixed runs the command line offers besides it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cropbench.config import CropOverrides, LayoutSpec, StoreConfig, plate_preset
from cropbench.distributed import DEFAULT_TIMEOUT_S, Cluster, distribute, launched
from cropbench.errors import ConfigError
from cropbench.formats.sources import is_url
from cropbench.harness.context import RunContext
from cropbench.harness.runner import CaseCounter, Track, run_tracks
from cropbench.harness.work import WorkFolder, WorkSite, work_folder
from cropbench.measure import environment
from cropbench.measure.endpoints import remote_plate, server_ceiling
from cropbench.measure.protocol import configure_threads
from cropbench.plates.convert import materialize_layout
from cropbench.plates.generate import GeneratedPlate, generate_plate
from cropbench.records import CSV_NAME, RESULTS_NAME, Record, RecordWriter, read_records, write_csv
from cropbench.tracks import track_named
from cropbench.tracks.layouts import LayoutComparison, Layouts
from cropbench.tracks.out_of_memory import OutOfMemory, OutOfMemoryTrack
from cropbench.tracks.scale import ScaleSweep, ScaleTrack
from cropbench.tracks.store_layouts import StoreLayouts, StoreLayoutsTrack

#: Called with a status message, and with the record when one has just been measured.
Progress = Callable[[str, Record | None], None]


def run(
    plate: str | Path,
    tracks: Sequence[str | Track] = ("1",),
    preset: str = "smoke",
    out_dir: str | Path | None = None,
    *,
    samples: int | None = None,
    repeats: int = 1,
    resume: bool = False,
    torch_threads: int = 1,
    layout: str | None = None,
    layout_dir: str | Path | None = None,
    store: StoreConfig | None = None,
    objects: str | Path | None = None,
    progress: Progress | None = None,
    rank_timeout_s: float = DEFAULT_TIMEOUT_S,
    local_plate: str | Path | None = None,
    overrides: CropOverrides | None = None,
) -> list[Record]:
    """Measure ``tracks`` (names or aliases in :data:`cropbench.tracks.TRACKS`, or track objects) on
    ``plate``; returns this run's records.

    ``layout`` runs them on the plate rewritten in that named layout (converted once, under
    ``layout_dir`` or ``<plate>.layouts/``); ``objects`` is an object table for plates without one
    (every track uses it). With ``out_dir``, each record is appended to ``out_dir/results.jsonl``
    as it finishes and ``results.csv`` is rewritten at the end; ``resume`` skips cases already there
    (same case identity: same config, plate and layout).

    ``plate`` may be a URL (``s3://bucket/prefix/plate.zarr``, ``https://host/path/plate.zarr``): its
    metadata is mirrored locally and its pixels are read from the store as ``store`` says (in-flight
    requests, timeouts, retries, injected latency; see :class:`~cropbench.config.StoreConfig`).
    ``local_plate`` is the same plate on local disk: each Track 1 case is then measured on it too,
    just before the store, and the store's rows carry ``ratio_to_local``. ``overrides`` fixes crop
    knobs (decode threads, chunk cache, crop size...) for every case, over what the preset sets.

    Started by ``torchrun``, each rank calls this: tracks 2 and 3 run across the ranks (see
    :mod:`cropbench.distributed`), rank 0 alone writes and returns the records, and a rank that
    dies or hangs fails the others within ``rank_timeout_s``.
    """
    named = {t: track_named(t) for t in tracks if isinstance(t, str)}  # an unknown name fails here, first
    if repeats < 1:
        raise ConfigError(f"repeats must be >= 1, got {repeats}")
    if samples is not None and samples < 1:
        raise ConfigError(f"samples must be >= 1, got {samples}")
    if local_plate is not None and not is_url(plate):
        raise ConfigError(f"--local-plate is the local copy of a plate in a store; {plate} is already local")
    remote = contextlib.ExitStack()  # a remote plate's delay proxy, stopped when the run ends
    if is_url(plate):
        if layout is not None:
            raise ConfigError(f"--layout rewrites a local plate; {plate} is in a store (convert locally, then upload)")
        if any(info.name == "peers" for info in named.values()):
            raise ConfigError(f"peers read local plates only; {plate} is in a store (drop --peers)")
        source = remote.enter_context(remote_plate(str(plate), store or StoreConfig()))
    else:
        source = Path(plate)
    cluster = Cluster(rank_timeout_s) if launched() else None
    writes = cluster is None or cluster.rank == 0
    if layout is not None:
        name = layout

        def convert() -> Path:
            return materialize_layout(
                source, name, Path(layout_dir) if layout_dir else None, progress=progress is not None
            )

        source = cluster.first(convert, "layout conversion") if cluster is not None else convert()
    context = RunContext(
        plate=source,
        environment=environment.collect(source),
        thread_settings=configure_threads(torch_threads),
        objects=Path(objects) if objects is not None else None,
        samples=samples,
        report=(lambda message: progress(message, None)) if progress else None,
        local=_local_context(local_plate, objects, samples) if local_plate is not None else None,
        server_requests_per_s=server_ceiling(str(plate), store or StoreConfig()) if is_url(plate) else None,
        overrides=overrides,
    )
    if context.local is not None and context.local.metadata.fields != context.metadata.fields:
        raise ConfigError(f"--local-plate {local_plate} is not the plate at {plate} (their fields differ)")
    chosen = [named[t].build() if isinstance(t, str) else t for t in tracks]
    chosen = distribute(chosen, cluster) if cluster is not None else chosen
    results = Results(out_dir, progress, writes=writes)
    earlier = results.earlier() if resume else []
    done = frozenset(record.key for record in earlier)
    done = cluster.broadcast(done, "resume") if cluster is not None else done
    try:
        counter = progress if isinstance(progress, CaseCounter) else None
        run_tracks(
            chosen,
            preset,
            context,
            results.emit,
            repeats=repeats,
            done=done,
            counter=counter,
            earlier=earlier,
            amend=results.amend,
        )
    finally:
        results.close()
        remote.close()
        if cluster is not None:
            cluster.close()
    results.write_csv()
    return results.measured


class Results:
    """Where a run's records go: each appended to ``out_dir/results.jsonl`` as it is measured (by the
    writing rank only) and handed to ``progress``; ``results.csv`` rewritten at the end."""

    def __init__(self, out_dir: str | Path | None, progress: Progress | None, writes: bool = True) -> None:
        self.path = Path(out_dir) / RESULTS_NAME if out_dir is not None else None
        self.writer = RecordWriter(self.path) if self.path is not None and writes else None
        self.progress = progress
        self.measured: list[Record] = []

    def earlier(self) -> list[Record]:
        """The rows already written: what ``--resume`` skips, and judges the new rows beside."""
        if self.path is None or not self.path.exists():
            return []
        return read_records(self.path)

    def emit(self, record: Record) -> None:
        stored = self.writer.write(record) if self.writer is not None else None
        self.measured.append(stored if isinstance(stored, Record) else record)
        if self.progress is not None:
            self.progress(f"track {record.track} {record.case}", self.measured[-1])

    def amend(self, records: list[Record]) -> None:
        """The run's rows with their flags decided once more (:func:`~cropbench.harness.runner.run_tracks`),
        in the order emitted: written over those in ``results.jsonl`` and kept in their place."""
        if self.writer is not None:
            records = self.writer.amend(records)
        self.measured = list(records)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    def write_csv(self) -> None:
        if self.path is not None and self.writer is not None:
            write_csv(read_records(self.path), self.path.with_name(CSV_NAME))


def compare_layouts(
    plate: str | Path,
    comparison: LayoutComparison,
    out_dir: str | Path,
    *,
    work_dir: str | Path | None = None,
    keep: bool = False,
    objects: str | Path | None = None,
    progress: Progress | None = None,
) -> list[Record]:
    """Rewrite ``plate`` in each layout of ``comparison`` (under ``work_dir``, default ``OUT/plates``;
    removed after measuring unless ``keep``) and measure each: one record per layout (track ``layouts``)."""
    track = Layouts(comparison, Path(work_dir) if work_dir else Path(out_dir) / "plates", keep=keep)
    return run(plate, [track], out_dir=out_dir, objects=objects, progress=progress)


def compare_layouts_in_store(
    url: str,
    layouts: Sequence[str],
    settings: StoreLayouts,
    out_dir: str | Path,
    *,
    work_dir: str | Path | None = None,
    keep: bool = False,
    store: StoreConfig | None = None,
    progress: Progress | None = None,
) -> list[Record]:
    """Which layout to publish: the plate at ``url`` rewritten in each layout (under ``work_dir``, default
    ``OUT/plates``; only what this call wrote is removed unless ``keep``), each served on loopback behind
    ``settings.latency_ms`` and measured (track ``store-layouts``, one record per layout in
    ``OUT/results.jsonl``). The source is read with ``store`` without injected latency."""
    work = WorkFolder(Path(work_dir) if work_dir else Path(out_dir) / "plates", keep)
    track = StoreLayoutsTrack(layouts, settings, work)
    source = dataclasses.replace(store or StoreConfig(), latency_ms=0.0)
    return run(url, [track], out_dir=out_dir, store=source, progress=progress)


def sweep_scale(
    sweep: ScaleSweep,
    out_dir: str | Path,
    work_dir: str | Path,
    *,
    keep: bool = False,
    bars: bool = True,
    resume: bool = False,
    progress: Progress | None = None,
) -> list[Record]:
    """The growth sweep (track ``scale``): per object count of ``sweep`` a scale plate under ``work_dir``
    (removed after measuring unless ``keep``; one kept earlier is reused) and its costs, one record each
    in ``out_dir/results.jsonl`` as it is measured. ``bars`` shows the plates' write progress; ``resume``
    skips counts already measured there (no plate is written for them)."""
    return _run_in_work_folder(ScaleTrack(sweep, bars), sweep.layout, out_dir, work_dir, keep, resume, progress)


def compare_out_of_memory(
    comparison: OutOfMemory,
    out_dir: str | Path,
    work_dir: str | Path,
    *,
    keep: bool = False,
    require_cgroup: bool = False,
    bars: bool = True,
    resume: bool = False,
    progress: Progress | None = None,
) -> list[Record]:
    """Layouts on plates larger than a memory limit (track ``out-of-memory``): per layout a plate under
    ``work_dir`` (removed after measuring unless ``keep``) read inside the limit and in the page cache,
    one record each in ``out_dir/results.jsonl`` as it is measured; ``resume`` skips layouts already measured there."""
    track = OutOfMemoryTrack(comparison, bars, require_cgroup)
    return _run_in_work_folder(track, "", out_dir, work_dir, keep, resume, progress)


def _run_in_work_folder(
    track: Track[WorkSite],
    layout: str,
    out_dir: str | Path,
    work_dir: str | Path,
    keep: bool,
    resume: bool,
    progress: Progress | None,
) -> list[Record]:
    """A track that writes its own plates, through the runner, in a work folder left as it found it."""
    results = Results(out_dir, progress)
    earlier = results.earlier() if resume else []
    report = (lambda message: progress(message, None)) if progress else None
    try:
        with work_folder(work_dir, keep) as work:
            site = WorkSite(work, layout, environment=environment.collect(work_dir), report=report)
            # These tracks have no presets: their comparison is the whole measurement.
            done = frozenset(record.key for record in earlier)
            run_tracks([track], "full", site, results.emit, done=done, earlier=earlier, amend=results.amend)
    finally:
        results.close()
    return results.measured


def _local_context(plate: str | Path, objects: str | Path | None, samples: int | None) -> RunContext:
    """The run's plate on local disk, the reference of a plate in a store (same object table and samples)."""
    return RunContext(plate=Path(plate), objects=Path(objects) if objects is not None else None, samples=samples)


#: The smoke run's plate, inside its output directory, and the tracks it runs.
SMOKE_PLATE = "smoke-plate.zarr"
SMOKE_TRACKS = ("1", "2", "3")


@dataclass(frozen=True)
class SmokeRun:
    """What :func:`smoke` did: the plate (``generated`` is None when the output directory had one) and the records."""

    plate: Path
    generated: GeneratedPlate | None
    records: list[Record]


def smoke(
    out_dir: str | Path,
    *,
    force: bool = False,
    generation_progress: bool = False,
    progress: Progress | None = None,
) -> SmokeRun:
    """The main job: the smoke plate (generated unless ``out_dir`` has one, or with ``force``), then every
    track's smoke preset on it, recorded in ``out_dir``."""
    plate = Path(out_dir) / SMOKE_PLATE
    generated = None
    if force or not plate.exists():
        generated = generate_plate(
            plate, plate_preset("smoke"), LayoutSpec(), overwrite=True, progress=generation_progress
        )
    return SmokeRun(plate, generated, run(plate, SMOKE_TRACKS, "smoke", out_dir, progress=progress))


__all__ = [
    "Progress",
    "SmokeRun",
    "compare_layouts",
    "compare_layouts_in_store",
    "compare_out_of_memory",
    "run",
    "smoke",
    "sweep_scale",
]
