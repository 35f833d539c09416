"""Track ``dataset`` (Track 1, ``--track 1``): the preset grids of ``Dataset.__getitem__`` cases, each
measured by :func:`cropbench.harness.dataset_case.run_case` (cold pass, warm-up, steady state).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence

from cropbench.config import DEFAULT_CROP_SIZE, CropConfig
from cropbench.errors import ConfigError
from cropbench.harness.context import RunContext
from cropbench.harness.dataset_case import DatasetCase, run_case
from cropbench.harness.runner import Row, seeded
from cropbench.records import DATASET_TRACK

SMOKE_CHUNK_CACHE_BYTES = 2 * 2**20
#: Indices per call of the batch access mode's cases in the presets.
SMOKE_BATCH, FULL_BATCH = 32, 64


def preset_cases(preset: str, samples: int | None = None) -> list[DatasetCase]:
    """The Track 1 grid of a preset; ``samples`` overrides the steady-state sample count."""
    if preset == "smoke":
        # Sized to the smoke plate (4 fields of 5 x 540 x 540, 11 MiB decoded, ~320 objects): 260
        # items drawn, so no crop is read twice, and a 2 MiB chunk cache, so steady state reads chunks.
        base = DatasetCase(samples=200 if samples is None else samples, warmup=20, cold_samples=40)
        crop = CropConfig(crop_size=DEFAULT_CROP_SIZE, chunk_cache_bytes=SMOKE_CHUNK_CACHE_BYTES)
        grid = [
            ("random", crop),
            ("random", crop.replace(decode="zarr")),
            ("random", crop.replace(decode="field")),
            ("grouped-field", crop),
            ("chunk-aware", crop),
            ("random", crop.replace(tier="typical")),
            ("paired", crop.replace(tier="typical")),
        ]
        batched = [
            dataclasses.replace(base, access=access, crop=crop, batch_size=SMOKE_BATCH)
            for access in ("random", "grouped-field")
        ]
        return [dataclasses.replace(base, access=access, crop=c) for access, c in grid] + batched
    if preset == "full":
        return _full_cases(_steady_base(samples))
    if preset == "grid":
        return _grid_cases(_steady_base(samples))
    raise ConfigError(f"preset={preset!r} is not one of smoke, full, grid")


def _steady_base(samples: int | None) -> DatasetCase:
    """The full presets' case: 1,000 steady samples (a p99 with ten points beyond it), 200 cold."""
    return DatasetCase(samples=1000 if samples is None else samples, warmup=50, cold_samples=200)


def _full_cases(base: DatasetCase) -> list[DatasetCase]:
    """Every access pattern through every decode path at the base crop (96 px, all channels, no
    transforms, float32), then one knob at a time around random access on ``direct``: crop size,
    channels, transform tier, dtype, a cold cache in steady state, and batched reads at 1 and 2 decode
    threads. About 30 cases: minutes on 2 cores, where the product of the knobs (``grid``) takes hours.
    """
    crop = CropConfig(crop_size=DEFAULT_CROP_SIZE)
    cases = [
        dataclasses.replace(base, access=access, crop=crop.replace(decode=decode))
        for access in ("random", "grouped-field", "chunk-aware", "paired")
        for decode in ("direct", "field", "zarr")
    ]
    knobs = [
        *(crop.replace(crop_size=size) for size in (64, 128, 256)),
        crop.replace(channels=("DNA", "RNA", "Mito")),
        crop.replace(tier="light"),
        crop.replace(tier="typical"),
        crop.replace(dtype="bfloat16"),
        crop.replace(dtype="uint16"),
    ]
    cases += [dataclasses.replace(base, crop=knob) for knob in knobs]
    cases.append(dataclasses.replace(base, crop=crop, cache="cold"))
    batched = dataclasses.replace(base, samples=2 * base.samples, batch_size=FULL_BATCH)  # 31 timed calls
    cases += [
        dataclasses.replace(batched, access=access, crop=crop.replace(decode_threads=threads))
        for access in ("random", "grouped-field")
        for threads in (1, 2)
    ]
    return cases


def _grid_cases(base: DatasetCase) -> list[DatasetCase]:
    """The product of the knobs (access × crop size × channels × tier × dtype × decode path, 216 cases)
    and batched reads per decode path and thread count: hours on 2 cores."""
    cases = []
    for access, size, channels, tier, dtype, decode in itertools.product(
        ("random", "grouped-field", "paired"),
        (64, 128),
        (None, ("DNA", "RNA", "Mito")),
        ("none", "light", "typical"),
        ("float32", "bfloat16"),
        ("direct", "field", "zarr"),
    ):
        crop = CropConfig(crop_size=size, channels=channels, tier=tier, dtype=dtype, decode=decode)
        cases.append(dataclasses.replace(base, access=access, crop=crop))
    for access, size, decode, threads in itertools.product(
        ("random", "grouped-field"),
        (64, 128),
        ("direct", "field", "zarr"),
        (1, 2),
    ):
        if threads == 1 or decode == "direct":
            crop = CropConfig(crop_size=size, decode=decode, decode_threads=threads)
            cases.append(dataclasses.replace(base, access=access, crop=crop, batch_size=FULL_BATCH))
    return cases


class Dataset:
    """Track ``dataset`` for the runner: the preset's grid (or ``cases``), each case measured by :func:`run_case`.

    Fixed ``cases`` let a script measure one configuration through the runner and the Record
    rather than time a loop of its own.

    Args:
        cases: The cases to measure whatever the preset; None: the preset's grid.

    Example:
        ```python
        import cropbench
        from cropbench.tracks import track_named

        records = cropbench.run("plate.zarr", [track_named("dataset").build()], preset="smoke")
        ```
    """

    name = DATASET_TRACK

    def __init__(self, cases: Sequence[DatasetCase] | None = None) -> None:
        self._cases = None if cases is None else list(cases)

    def cases(self, preset: str, context: RunContext) -> list[DatasetCase]:
        """The preset's grid of ``Dataset.__getitem__`` cases (or the fixed ``cases``).

        Args:
            preset: The preset's name: ``smoke``, ``full`` or ``grid``.
            context: The run's plate; its ``samples`` overrides each case's steady-state sample count.

        Returns:
            The cases in the order they run.

        Raises:
            ConfigError: An unknown preset.
        """
        if self._cases is not None:
            return list(self._cases)
        return preset_cases(preset, context.samples)

    def decode(self, case: DatasetCase) -> str:
        """The read path ``case`` needs; the runner skips a case whose path the plate's layout lacks."""
        return case.crop.decode

    def measure(self, case: DatasetCase, repeat: int, context: RunContext) -> Iterator[Row]:
        """Measure one case: a cold pass, a warm-up, then the steady state.

        Args:
            case: One case of :meth:`cases`.
            repeat: The repeat's number; it is added to the case's seed.
            context: The run's plate.

        Yields:
            One row: the case's steady items/s, its latency percentiles, the cold first pass and its flags.
        """
        repeated = seeded(case, repeat)
        metrics = run_case(context, repeated)
        yield Row(case, dataclasses.asdict(repeated), metrics, repeated.seed)
