"""``cropbench.run``: what the command line, notebooks and asv call to measure a plate.

It checks the request, rewrites the plate into a named layout when asked, pins threads, runs the
tracks through the one runner, appends each record durably to ``OUT/results.jsonl`` as it finishes
(with ``out_dir``), and returns this run's records. :func:`compare_layouts` and :func:`smoke` are
the two fixed runs the command line offers besides it; :func:`advise` measures what a lab's decision
needs and answers it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cropbench import metrics as m
from cropbench.config import DEFAULT_CROP_SIZE, CropConfig, CropOverrides, LayoutSpec, StoreConfig, plate_preset
from cropbench.data.loader import LoaderSpec
from cropbench.errors import ConfigError
from cropbench.formats.sources import is_url
from cropbench.harness.context import RunContext, worker_counts
from cropbench.harness.ranks import DEFAULT_TIMEOUT_S, Cluster, distribute, launched
from cropbench.harness.runner import CaseCounter, Track, run_tracks
from cropbench.harness.work import WorkFolder, WorkSite, work_folder
from cropbench.measure import environment
from cropbench.measure.endpoints import remote_plate, server_ceiling
from cropbench.measure.protocol import configure_threads
from cropbench.plates.convert import materialize_layout
from cropbench.plates.generate import GeneratedPlate, generate_plate
from cropbench.records import (
    CSV_NAME,
    DATASET_TRACK,
    LOADER_TRACK,
    RESULTS_NAME,
    TRAINING_TRACK,
    Record,
    RecordWriter,
    read_records,
    write_csv,
)
from cropbench.report import advice
from cropbench.tracks import track_named
from cropbench.tracks.layouts import LayoutComparison, Layouts
from cropbench.tracks.out_of_memory import OutOfMemory, OutOfMemoryComparison
from cropbench.tracks.scale import Scale, ScaleSweep
from cropbench.tracks.store_layouts import StoreLayoutComparison, StoreLayouts
from cropbench.tracks.training.advise import (
    MAX_ROUNDS,
    Advise,
    Demand,
    Item,
    Option,
    Question,
    Verification,
    advise_crop,
    at_batch,
    check_model,
    model_case,
)
from cropbench.tracks.training.cases import TrainingCase

if TYPE_CHECKING:
    from cropbench.tracks.formats import FormatComparison

#: Called with a status message, and with the record when one has just been measured.
Progress = Callable[[str, Record | None], None]


def run(
    plate: str | Path,
    tracks: Sequence[str | Track] = (DATASET_TRACK,),
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
    """Measure ``tracks`` on ``plate``: the cases of ``preset``, one record per case and repeat.

    What ``cropbench run`` calls. Each track's cases run through the one runner and the one
    measurement protocol; with ``out_dir``, each record is appended to ``out_dir/results.jsonl`` as
    it finishes (so a run stopped halfway keeps its rows) and ``results.csv`` is rewritten at the end.

    Started by ``torchrun``, each rank calls this: tracks 2 and 3 run across the ranks (see
    :mod:`cropbench.harness.ranks`), rank 0 alone writes and returns the records, and a rank that
    dies or hangs fails the others within ``rank_timeout_s``.

    Args:
        plate: The plate: a local folder, or a URL (``s3://bucket/prefix/plate.zarr``,
            ``https://host/path/plate.zarr``) whose metadata is mirrored locally and whose pixels
            are read from the store as ``store`` says.
        tracks: Track names or aliases (``"dataset"``, ``"1"``, ``"peers"``...; see
            :data:`cropbench.tracks.TRACKS`), or track objects built by the caller.
        preset: The grid of cases each track runs: ``smoke`` (seconds to minutes) or ``full``;
            some tracks have more (``grid`` for Track 1, ``overhead`` and ``gpu`` for Track 2,
            ``gpu`` and ``gpu-demand`` for Track 3).
        out_dir: Where ``results.jsonl`` and ``results.csv`` go; None keeps the records in memory.
        samples: Items each case reads in steady state, over what the preset sets.
        repeats: How many times each case is measured; repeats differ only in their seed.
        resume: Skip cases whose rows ``out_dir/results.jsonl`` already holds (same case
            identity: same config, plate and layout).
        torch_threads: Threads torch may use in this process (``torch.set_num_threads``).
        layout: Run on the plate rewritten in this named layout (converted once, then reused).
        layout_dir: Where the rewritten plate goes; default ``<plate>.layouts/``.
        store: How a plate at a URL is read: in-flight requests, timeouts, retries, injected
            latency (:class:`~cropbench.config.StoreConfig`). Defaults to ``StoreConfig()``.
        objects: An object table for a plate without one; every track uses it.
        progress: Called with a status message, and with each record as it is measured.
        rank_timeout_s: Under ``torchrun``, how long a rank waits for the others.
        local_plate: The same plate on local disk, for a plate at a URL: each Track 1 case is
            then measured on it too, just before the store, and the store's rows carry
            ``ratio_to_local``.
        overrides: Crop knobs (decode threads, chunk cache, crop size...) fixed for every case,
            over what the preset sets.

    Returns:
        This run's records (:class:`~cropbench.records.Record`), in the order measured, with
        their flags as finally decided; not the rows a resumed run skipped.

    Raises:
        ConfigError: An unknown track or preset, ``repeats`` or ``samples`` below 1,
            ``layout`` or the ``peers`` track with a plate at a URL, or a ``local_plate`` that is
            not the plate at the URL.
        StoreError: The plate (or its layout) cannot be opened or read.
        ObjectTableError: The object table is missing, empty, or does not match the plate.
        DistributedError: Under ``torchrun``, another rank failed or did not answer in time.

    Example:
        ```python
        import cropbench

        records = cropbench.run("plate.zarr", tracks=["dataset", "loader"], preset="smoke", out_dir="out")
        for record in records:
            print(record.track, record.case, record.metrics["samples_per_s"])
        ```
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
    """Rewrite ``plate`` in each layout of ``comparison`` and measure each (track ``layouts``).

    What ``cropbench compare-layouts`` calls.

    Args:
        plate: The local plate to rewrite.
        comparison: The layouts to compare and how each is read (crop size, samples, workers).
        out_dir: Where ``results.jsonl`` and ``results.csv`` go.
        work_dir: Where the rewritten plates go; default ``OUT/plates``.
        keep: Keep the rewritten plates; by default each is removed once measured.
        objects: An object table for a plate without one.
        progress: Called with a status message, and with each record as it is measured.

    Returns:
        One record per layout, in the order measured.

    Raises:
        ConfigError: An unknown layout name, or a comparison the plate cannot run.
        StoreError: The plate cannot be opened.
        OutputError: A rewritten plate cannot be written under ``work_dir``.
    """
    track = Layouts(comparison, Path(work_dir) if work_dir else Path(out_dir) / "plates", keep=keep)
    return run(plate, [track], out_dir=out_dir, objects=objects, progress=progress)


def compare_layouts_in_store(
    url: str,
    layouts: Sequence[str],
    settings: StoreLayoutComparison,
    out_dir: str | Path,
    *,
    work_dir: str | Path | None = None,
    keep: bool = False,
    store: StoreConfig | None = None,
    progress: Progress | None = None,
) -> list[Record]:
    """Which layout to publish: the plate at ``url`` rewritten in each layout, each served on loopback
    behind ``settings.latency_ms`` and measured (track ``store-layouts``).

    What ``cropbench compare-layouts --plate URL`` calls.

    Args:
        url: The plate in an object store (``s3://...`` or ``https://...``).
        layouts: The named layouts to compare.
        settings: How each rewritten plate is served and read: the injected latency, crops, workers.
        out_dir: Where ``results.jsonl`` and ``results.csv`` go.
        work_dir: Where the rewritten plates go; default ``OUT/plates``.
        keep: Keep the rewritten plates; by default only what this call wrote is removed.
        store: How the source is read (its injected latency is set to 0). Defaults to
            ``StoreConfig()``.
        progress: Called with a status message, and with each record as it is measured.

    Returns:
        One record per layout, in the order measured.

    Raises:
        ConfigError: An unknown layout name, or settings out of range.
        StoreError: The source cannot be read from the store.
        OutputError: A rewritten plate cannot be written under ``work_dir``.
    """
    work = WorkFolder(Path(work_dir) if work_dir else Path(out_dir) / "plates", keep)
    track = StoreLayouts(layouts, settings, work)
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
    """The growth sweep (track ``scale``): how each cost grows with the number of objects.

    What ``cropbench scale sweep`` calls. Per object count of ``sweep``, a plate of that many objects
    is written under ``work_dir`` and measured.

    Args:
        sweep: The object counts, the layout of the plates and how each is read.
        out_dir: Where ``results.jsonl`` and ``results.csv`` go.
        work_dir: Where the plates are written.
        keep: Keep the plates (one kept earlier is reused); by default each is removed once measured.
        bars: Show the plates' write progress.
        resume: Skip counts already measured in ``out_dir/results.jsonl`` (no plate is written for them).
        progress: Called with a status message, and with each record as it is measured.

    Returns:
        One record per object count measured by this call.

    Raises:
        ConfigError: A sweep out of range.
        OutputError: ``work_dir`` cannot be written, or lacks the space for a plate.
    """
    return _run_in_work_folder(Scale(sweep, bars), sweep.layout, out_dir, work_dir, keep, resume, progress)


def compare_out_of_memory(
    comparison: OutOfMemoryComparison,
    out_dir: str | Path,
    work_dir: str | Path,
    *,
    keep: bool = False,
    require_cgroup: bool = False,
    bars: bool = True,
    resume: bool = False,
    progress: Progress | None = None,
) -> list[Record]:
    """Layouts on plates larger than a memory limit (track ``out-of-memory``).

    What ``cropbench scale out-of-memory`` calls. Per layout, a plate is written under ``work_dir``
    and read both inside the memory limit and from the page cache.

    Args:
        comparison: The layouts, the plate size and the memory limit.
        out_dir: Where ``results.jsonl`` and ``results.csv`` go.
        work_dir: Where the plates are written.
        keep: Keep the plates; by default each is removed once measured.
        require_cgroup: Fail rather than measure without a cgroup to enforce the memory limit.
        bars: Show the plates' write progress.
        resume: Skip layouts already measured in ``out_dir/results.jsonl``.
        progress: Called with a status message, and with each record as it is measured.

    Returns:
        One record per layout measured by this call.

    Raises:
        ConfigError: A comparison out of range.
        MemoryLimitError: No cgroup could enforce the limit where ``require_cgroup`` asks for one,
            or the limited process died.
        OutputError: ``work_dir`` cannot be written, or lacks the space for a plate.
    """
    track = OutOfMemory(comparison, bars, require_cgroup)
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
SMOKE_TRACKS = (DATASET_TRACK, LOADER_TRACK, TRAINING_TRACK)


@dataclass(frozen=True)
class SmokeRun:
    """What :func:`smoke` did.

    Attributes:
        plate: The smoke plate.
        generated: The plate as generated, or None when the output directory had one.
        records: This run's records, in the order measured.
    """

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
    """The main job: the smoke plate, then the smoke preset of Tracks 1, 2 and 3 on it.

    What ``cropbench smoke`` (and so ``bash scripts/main.sh``) calls.

    Args:
        out_dir: Where the plate (``smoke-plate.zarr``), ``results.jsonl`` and ``results.csv`` go.
        force: Generate the plate again even where ``out_dir`` has one.
        generation_progress: Show the plate's write progress.
        progress: Called with a status message, and with each record as it is measured.

    Returns:
        The plate, the generated plate's description (None when ``out_dir`` had one) and the records.

    Raises:
        OutputError: ``out_dir`` cannot be written.
    """
    plate = Path(out_dir) / SMOKE_PLATE
    generated = None
    if force or not plate.exists():
        generated = generate_plate(
            plate, plate_preset("smoke"), LayoutSpec(), overwrite=True, progress=generation_progress
        )
    return SmokeRun(plate, generated, run(plate, SMOKE_TRACKS, "smoke", out_dir, progress=progress))


#: The read paths ``advise`` compares, the default first.
ADVISE_READ_PATHS = ("direct", "zarr")
#: A larger prefetch factor ``advise`` sets against torch's default.
ADVISE_PREFETCH = 4
#: Share of ``advise``'s budget kept for the verification loop.
VERIFY_SHARE = 0.15


@dataclass(frozen=True)
class AdviseRun:
    """What :func:`advise` did: every decision, the verification, the advice file and this run's rows.

    Attributes:
        decisions: One decision per question asked (read path, workers, batch, prefetch, pinning,
            training format), each with the ratio that decided it and how sure it is.
        verification: The recommendation's predicted and achieved rates, or None.
        advice_path: The ``advice.json`` written.
        records: This run's records, in the order measured.
        text: The advice as ``cropbench advise`` prints it.
    """

    decisions: list[advice.Decision]
    verification: dict[str, Any] | None
    advice_path: Path
    records: list[Record]
    text: str


def advise(
    plate: str | Path,
    model: str,
    out_dir: str | Path,
    *,
    budget_min: int = 10,
    batch_size: int = 64,
    crop_size: int = DEFAULT_CROP_SIZE,
    max_workers: int | None = None,
    epoch_crops: int | None = None,
    rounds: int = 3,
    max_rounds: int = MAX_ROUNDS,
    steps: int = 16,
    objects: str | Path | None = None,
    store: StoreConfig | None = None,
    work_dir: str | Path | None = None,
    progress: Progress | None = None,
) -> AdviseRun:
    """What to do with ``plate`` and ``model``: which read path, how many workers, which batch, prefetch
    and pinning, and whether converting the crops into a training format pays off; then the
    recommendation run once more as a Track 3 loop, predicted against achieved.

    What ``cropbench advise`` calls. Each question's options read whole epochs in turns, at least
    ``rounds`` rounds, more (at most ``max_rounds``) while the ratio deciding it is open and its share
    of ``budget_min`` lasts. Training formats are compared where their libraries are installed and
    as far as the budget left allows; the convert decision says what was left out.

    Args:
        plate: The plate: a local folder or a URL in an object store.
        model: ``resnet18``, ``smallcnn``, ``emulated:MS`` (an accelerator whose step takes MS ms at
            ``batch_size``) or ``path/to/file.py:factory``.
        out_dir: Where the rows (``results.jsonl``, ``results.csv``) and the decisions
            (``advice.json``) go.
        budget_min: Minutes the whole run may take; 15 % of it is kept for the verification loop.
        batch_size: The batch the model trains at (the batch question also tries twice it).
        crop_size: The crop's side in pixels.
        max_workers: The most DataLoader workers tried; None: the cores.
        epoch_crops: Crops in each option's epoch; None: every object.
        rounds: The fewest rounds of turns per question.
        max_rounds: The most rounds of turns per question.
        steps: Steps the model's compute-only rate is measured over.
        objects: An object table for a plate without one.
        store: How a plate at a URL is read. Defaults to ``StoreConfig()``.
        work_dir: Where the training formats' stores are written (and removed); default ``OUT/crops``.
        progress: Called with a status message, and with each record as it is measured.

    Returns:
        The decisions, the verification (predicted against achieved), the path of ``advice.json``,
        this run's records and the advice as text.

    Raises:
        ConfigError: An argument below 1, ``rounds`` above ``max_rounds`` or ``max_rounds`` above
            its limit, or an unknown ``model``.
        StoreError: The plate cannot be opened or read, or ``work_dir`` lacks the space for the
            training formats' stores.

    Example:
        ```python
        import cropbench

        answer = cropbench.advise("plate.zarr", "resnet18", "out/advise", budget_min=10)
        print(answer.text)
        ```
    """
    if min(budget_min, batch_size, crop_size, rounds, steps) < 1 or not rounds <= max_rounds <= MAX_ROUNDS:
        raise ConfigError(
            f"budget_min, batch_size, crop_size, rounds and steps must be >= 1 and rounds <= max_rounds <= "
            f"{MAX_ROUNDS}, got {budget_min}, {batch_size}, {crop_size}, {rounds}, {steps}, {max_rounds}"
        )
    started = time.monotonic()
    deadline = started + budget_min * 60.0
    reserve = budget_min * 60.0 * VERIFY_SHARE
    with contextlib.ExitStack() as stack:
        source = stack.enter_context(remote_plate(str(plate), store or StoreConfig())) if is_url(plate) else Path(plate)
        context = RunContext(
            plate=source,
            environment=environment.collect(source),
            thread_settings=configure_threads(1),
            objects=Path(objects) if objects is not None else None,
            report=(lambda message: progress(message, None)) if progress else None,
        )
        template = model_case(model, CropConfig(crop_size=crop_size, tier="light"), batch_size, steps)
        check_model(template, context)
        paths = [path for path in ADVISE_READ_PATHS if path in context.decodes] or list(context.decodes[:1])
        crops = {path: advise_crop(context, template.crop, path) for path in paths}
        counts = [w for w in worker_counts() if max_workers is None or w <= max_workers]
        formats = _formats_to_compare()
        results = Results(out_dir, progress)
        stack.callback(results.close)
        plan = [len(paths) > 1, True, True, True, _has_cuda(), bool(formats)]

        def measure(items: Sequence[Item]) -> list[Record]:
            left = max(deadline - time.monotonic() - reserve, 0.0) / max(sum(plan), 1)
            counter = progress if isinstance(progress, CaseCounter) else None
            return run_tracks([Advise(items, time.monotonic() + left)], "full", context, results.emit, counter=counter)

        def question(name: str, options: list[Option], **knobs: Any) -> Question:
            return Question(
                name, tuple(options), epoch_crops=epoch_crops, rounds=rounds, max_rounds=max_rounds, **knobs
            )

        demand_rows = measure([Demand(template), Demand(at_batch(template, 2 * batch_size))])
        demand = {
            int(r.config["loader"]["batch_size"]): float(r.metrics[m.COMPUTE_ONLY_IMAGES_PER_S]) for r in demand_rows
        }
        demand_flags = {int(r.config["loader"]["batch_size"]): tuple(advice.flags(r)) for r in demand_rows}
        base = LoaderSpec(batch_size=batch_size)
        if plan[0]:
            measure([question(advice.READ_PATH, [Option(path, crops[path], base) for path in paths])])
        plan[0] = False
        path = str(advice.decide_read_path(results.measured, budget_min).value)
        path = path if path in crops else paths[0]  # a layout without direct or zarr: its own path
        crop = crops[path]
        options = [Option(f"w{w}", crop, dataclasses.replace(base, num_workers=w)) for w in counts]
        measure(
            [
                question(
                    advice.WORKERS,
                    options,
                    compare="need",
                    demand=(demand[batch_size],) * len(options),
                    demand_flags=demand_flags[batch_size],
                )
            ]
        )
        plan[1] = False
        workers = int(advice.decide_workers(results.measured, budget_min).value)
        plan[3] = workers > 0  # prefetching applies only with workers
        loader = dataclasses.replace(base, num_workers=workers)
        batches = (batch_size, 2 * batch_size)
        options = [Option(f"b{b}", crop, dataclasses.replace(loader, batch_size=b)) for b in batches]
        flagged = tuple(dict.fromkeys(flag for b in batches for flag in demand_flags[b]))
        measure(
            [
                question(
                    advice.BATCH,
                    options,
                    compare="predicted",
                    demand=tuple(demand[b] for b in batches),
                    demand_flags=flagged,
                )
            ]
        )
        plan[2] = False
        batch = advice.decide_batch(results.measured, budget_min)
        loader = dataclasses.replace(loader, batch_size=int(batch.value) if batch is not None else batch_size)
        fed = (demand[loader.batch_size],)
        knobs: dict[str, Any] = {"demand": fed * 2, "demand_flags": demand_flags[loader.batch_size]}
        if workers:
            prefetch = [None, ADVISE_PREFETCH]
            options = [
                Option(f"prefetch{p or advice.DEFAULT_PREFETCH}", crop, dataclasses.replace(loader, prefetch_factor=p))
                for p in prefetch
            ]
            measure([question(advice.PREFETCH, options, **knobs)])
            chosen = int(advice.decide_prefetch(results.measured, budget_min).value)
            loader = dataclasses.replace(loader, prefetch_factor=None if chosen == advice.DEFAULT_PREFETCH else chosen)
        plan[3] = False
        if plan[4]:
            options = [
                Option(name, crop, dataclasses.replace(loader, pin_memory=pin))
                for name, pin in (("unpinned", False), ("pinned", True))
            ]
            measure([question(advice.PINNING, options, **knobs)])
            loader = dataclasses.replace(
                loader, pin_memory=bool(advice.decide_pinning(results.measured, budget_min).value)
            )
        plan[4] = False
        recommendation = advice.Recommendation(
            path, workers, loader.batch_size, loader.prefetch_factor or advice.DEFAULT_PREFETCH, loader.pin_memory
        )
        not_compared = None
        if formats:
            comparison = _formats_comparison(context, formats, loader, crop_size, rounds)
            epoch_s = context.object_count / (advice.supply(results.measured, recommendation) or math.inf)
            left = deadline - time.monotonic() - reserve
            fitted = comparison.within(left, epoch_s)
            if fitted is None:
                shortest = dataclasses.replace(comparison, formats=formats[:1], epochs=2)
                not_compared = (
                    f"{', '.join(formats)} not compared: {max(left, 0.0):.0f} s of the budget were left, and "
                    f"converting one format and reading two epochs each way takes about "
                    f"{shortest.estimated_seconds(epoch_s):.0f} s"
                )
            else:
                _compare_formats(context, fitted, objects, out_dir, work_dir, results)
        plan[5] = False
        decisions = advice.decide(results.measured, budget_min, not_compared)
        predicted = advice.prediction(results.measured, recommendation)
        case = verification_case(template, crop, loader, epoch_crops or context.object_count, context.object_count)
        achieved = measure([Verification(case)])[-1]
        checked = advice.verification(predicted, achieved)
        document = advice.advice_document(
            decisions,
            checked,
            {
                "plate": context.location,
                "model": model,
                "budget_min": budget_min,
                "minutes_used": (time.monotonic() - started) / 60.0,
                "recommendation": dataclasses.asdict(recommendation),
                "results": results.path.name if results.path else None,  # beside advice.json, not a machine path
            },
        )
        path_written = advice.write_advice(document, out_dir)
    results.write_csv()
    text = advice.advice_text(decisions, checked)
    return AdviseRun(decisions, checked, path_written, results.measured, text)


def verification_case(
    template: TrainingCase, crop: CropConfig, loader: LoaderSpec, epoch_crops: int, objects: int
) -> TrainingCase:
    """The recommendation as a Track 3 loop of one whole epoch, as the decisions read it: no warm-up step
    (the first batch and the workers' start-up count), every crop read once."""
    steps = max(1, min(epoch_crops, objects) // loader.batch_size)
    case = dataclasses.replace(at_batch(template, loader.batch_size), crop=crop, steps=steps, warmup_steps=0)
    return dataclasses.replace(case, loader=loader)


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _formats_to_compare() -> tuple[str, ...]:
    """The training formats whose libraries are installed here."""
    from cropbench.data.training import TRAINING_FORMATS

    return tuple(name for name, fmt in TRAINING_FORMATS.items() if fmt.available() is None)


def _formats_comparison(
    context: RunContext, formats: tuple[str, ...], loader: LoaderSpec, crop_size: int, rounds: int
) -> FormatComparison:
    """``compare-formats`` at the recommended loader, beside the direct path (the reference) alone."""
    from cropbench.tracks.formats import FormatComparison

    return FormatComparison(
        formats=formats,
        crop_size=crop_size,
        workers=loader.num_workers,
        batch_size=loader.batch_size,
        epochs=max(rounds, 2),
        samples=min(context.object_count, FormatComparison().samples),
        warmup=min(context.object_count // 4, FormatComparison().warmup),
        in_place=(m.REFERENCE,),
    )


def _compare_formats(
    context: RunContext,
    comparison: FormatComparison,
    objects: str | Path | None,
    out_dir: str | Path,
    work_dir: str | Path | None,
    results: Results,
) -> None:
    """Each format converted, then read in whole epochs in turns with the plate in place (break-even from
    those, conversion included)."""
    from cropbench.data.training import check_free_space
    from cropbench.tracks.formats import Formats, check_plate

    store_bytes = check_plate(context.plate, comparison, objects)
    work = Path(work_dir) if work_dir else Path(out_dir) / "crops"
    check_free_space(work, store_bytes, f"cannot write crop stores under {work}")
    run_tracks([Formats(comparison, work)], "full", context, results.emit)


__all__ = [
    "AdviseRun",
    "Progress",
    "SmokeRun",
    "advise",
    "compare_layouts",
    "compare_layouts_in_store",
    "compare_out_of_memory",
    "run",
    "smoke",
    "sweep_scale",
]
