"""Issue 8's targets, measured in one run on one plate: cropbench's fast path against zarr-python,
the memory-mapped copy ceiling, and 2 DataLoader workers against 0.

Usage: .venv/bin/python scripts/measure_targets.py PLATE OUT_DIR
PLATE should be the ``full`` preset in the default layout
(``python -m cropbench generate --preset full --out data/full.zarr``). Rows (track ``targets``)
are appended to OUT_DIR/results.jsonl; a summary with each ratio is printed.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

from cropbench.config import CropConfig, layout_by_name
from cropbench.data.dataset import CropDataset
from cropbench.data.loader import LoaderSpec
from cropbench.data.sampling import access_order
from cropbench.formats import read_plate_metadata
from cropbench.measure import environment
from cropbench.measure.protocol import configure_threads, time_each, time_loop
from cropbench.plates.convert import convert_plate
from cropbench.records import Record, RecordWriter
from cropbench.tracks import track2

SAMPLES, WARMUP, PASSES = 3000, 300, 3


def crops_per_s(plate: Path, config: CropConfig, access: str, granularity: int = 8) -> dict[str, Any]:
    """Median over passes of a tight ``__getitem__`` loop after a warm-up, with read amplification."""
    dataset = CropDataset(plate, config)
    indices = access_order(dataset, access, WARMUP + SAMPLES, seed=0, granularity=granularity)
    time_each(dataset.__getitem__, indices[:WARMUP])
    dataset.reader.stats.reset()
    rates = [SAMPLES / time_loop(dataset.__getitem__, indices[WARMUP:]) for _ in range(PASSES)]
    return {"crops_per_s": statistics.median(rates), "min": min(rates), "max": max(rates),
            **dataset.reader.stats.per_region()}


def main(plate_arg: str, out_arg: str) -> None:
    plate, out = Path(plate_arg), Path(out_arg)
    threads = configure_threads(1)
    env = environment.collect(plate)
    memmap = convert_plate(plate, out / "memmap-ceiling", layout_by_name("memmap"), overwrite=True).path
    metadata = read_plate_metadata(plate)
    channels, height, width = metadata.field_shape
    decoded_bytes = len(metadata.fields) * channels * height * width * 2
    bounded = CropConfig(crop_size=96, dtype="uint16", decode="direct")
    cases: dict[str, tuple[Path, CropConfig, str]] = {
        "memmap ceiling, random": (memmap, bounded, "random"),
        "memmap ceiling, grouped-field": (memmap, bounded, "grouped-field"),
        "zarr-python, random": (plate, bounded.replace(decode="zarr"), "random"),
        "direct, random": (plate, bounded, "random"),
        "direct, chunk-aware x8": (plate, bounded, "chunk-aware"),
        "direct, grouped-field": (plate, bounded, "grouped-field"),
        "field, grouped-field": (plate, bounded.replace(decode="field"), "grouped-field"),
        "direct, random, unbounded cache": (plate, bounded.replace(chunk_cache_bytes=2**40), "random"),
    }
    results: dict[str, dict[str, Any]] = {}
    with RecordWriter(out / "results.jsonl") as writer:
        for name, (path, config, access) in cases.items():
            metrics = crops_per_s(path, config, access)
            metrics["chunk_cache_fraction_of_plate"] = config.chunk_cache_bytes / decoded_bytes
            results[name] = metrics
            writer.write(Record(track="targets", case=name, environment=env, metrics=metrics,
                                config={"plate": str(path), "crop": config.__dict__, "access": access,
                                        "threads": threads}))
            print(f"{name:36s} {metrics['crops_per_s']:10,.0f} crops/s", flush=True)
        for workers in (0, 2):
            case = track2.Track2Case(
                crop=CropConfig(crop_size=96, decode="direct", tier="typical"),
                loader=LoaderSpec(num_workers=workers, batch_size=64), samples=2048, epochs=1,
            )
            metrics = track2.run_case(plate, case)
            results[f"loader w{workers}"] = metrics
            writer.write(Record(track="targets", case=f"loader typical w{workers}", environment=env,
                                metrics=metrics, config={"plate": str(plate), "case": case.label, "threads": threads}))
            print(f"loader, typical transforms, {workers} workers: {metrics['samples_per_s']:,.0f} samples/s",
                  flush=True)
    ceiling = results["memmap ceiling, random"]["crops_per_s"]
    direct = results["direct, random"]["crops_per_s"]
    print("\ntargets")
    print(f"  direct / zarr-python (random, same store):  {direct / results['zarr-python, random']['crops_per_s']:.1f}x"
          "  (target >= 5x)")
    print(f"  direct / memmap ceiling (random):           {direct / ceiling:.2f}  (target >= 0.20)")
    for name in ("direct, chunk-aware x8", "direct, grouped-field", "field, grouped-field"):
        print(f"  {name} / memmap ceiling:  {results[name]['crops_per_s'] / ceiling:.2f}  (target >= 0.50)")
    print(f"  2 workers / 0 workers (typical):            "
          f"{results['loader w2']['samples_per_s'] / results['loader w0']['samples_per_s']:.2f}x  (target >= 1.6x)")
    cache_fraction = results["direct, random"]["chunk_cache_fraction_of_plate"]
    print(f"  decoded-chunk cache / decoded plate:        {cache_fraction:.2f}  (must be <= 0.25)")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
