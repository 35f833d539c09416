"""The fetch targets, measured in one process with every reader interleaved: cropbench's direct
path (per item, batched, batched with 2 decode threads) against the memory-mapped ceiling read the
same way, and tensorstore's best batched configuration, on the same objects in the same order;
then DataLoader throughput with decode threads against worker processes at the same core count.

Usage: .venv/bin/python scripts/measure_targets.py PLATE OUT_DIR [--objects N] [--rounds R]
PLATE should be the ``full`` preset in the default layout
(``python -m cropbench generate --preset full --out data/full.zarr``); its memory-mapped copy is
written to OUT_DIR/memmap-ceiling. Ratios are like for like: random access over the random
ceiling, grouped-by-field access over the grouped ceiling, each path over the ceiling read the
same way (per item or batched). Readers take turns block by block (``BLOCK`` crops each, the turn
order rotating every block) for ``rounds`` passes over the objects, so a slowdown of the machine
lands on all of them alike; each reader's rate is its crops over its own summed time, with the
spread over rounds. Rows (track ``targets``) are appended to OUT_DIR/results.jsonl.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from cropbench import metrics as m
from cropbench.config import CropConfig, layout_by_name
from cropbench.data.dataset import CropDataset
from cropbench.data.loader import LoaderSpec
from cropbench.data.sampling import access_order
from cropbench.errors import PeerUnavailableError
from cropbench.formats import open_plate, read_plate_metadata
from cropbench.formats.direct import copy_pieces
from cropbench.formats.memmap import MemmapReader
from cropbench.measure import environment
from cropbench.measure.protocol import configure_threads, interleaved_rates, load_into_page_cache, per_item
from cropbench.plates.convert import convert_plate
from cropbench.records import Record, RecordWriter
from cropbench.tracks import track2
from cropbench.tracks.peers import CropWindows, TensorStoreBatched

BATCH, BLOCK = 64, 192
ACCESSES = ("random", "grouped-field")
#: Track 2 cases at 2 cores: (label, decode threads, workers).
LOADER_CASES = (("1 thread, 0 workers", 1, 0), ("2 decode threads, 0 workers", 2, 0), ("1 thread, 2 workers", 1, 2))

Reader = Callable[[list[int]], Any]


class CopyCeiling:
    """The crops cut from the memory-mapped copy by the direct reader's C copies (the GIL released),
    with one thread or two (each half of a batch): how fast and how well over threads this machine
    moves these bytes with no decoding and almost no Python. Its two-thread ratio bounds what decode
    threads can gain where copying dominates."""

    def __init__(self, memmap: Path, windows: CropWindows, threads: int) -> None:
        reader = open_plate(memmap, "direct")
        assert isinstance(reader, MemmapReader)
        pixels = reader.pixels()
        self.fields = {index: pixels[index] for index in range(len(pixels))}
        self.windows, self.threads = windows, threads
        self.pool = ThreadPoolExecutor(1) if threads == 2 else None
        self.out = np.empty((BATCH, *windows.field_shape[:1], windows.size, windows.size), dtype=pixels.dtype)

    def __call__(self, indices: list[int]) -> np.ndarray:
        _, height, width = self.windows.field_shape
        size, pieces = self.windows.size, []
        for slot, index in enumerate(indices):
            y0, x0 = int(self.windows.window_y0[index]), int(self.windows.window_x0[index])
            y1, x1 = min(y0 + size, height), min(x0 + size, width)
            cy0, cx0 = max(y0, 0), max(x0, 0)
            field = int(self.windows.field_index[index])
            pieces.append(
                (field, slot, slice(None), slice(None), cy0, y1, cx0, x1, cy0 - y0, y1 - y0, cx0 - x0, x1 - x0)
            )
        if self.pool is None:
            copy_pieces(pieces, self.fields, self.out)
        else:
            half = len(pieces) // 2
            other = self.pool.submit(copy_pieces, pieces[half:], self.fields, self.out)
            copy_pieces(pieces[:half], self.fields, self.out)
            other.result()
        return self.out


def readers(plate: Path, memmap: Path, budget: int) -> dict[str, tuple[Reader, Any]]:
    """name -> (read one block of indices, the reader whose counters to report or None)."""
    crop = CropConfig(crop_size=96, dtype="uint16", chunk_cache_bytes=budget)

    def items(dataset: CropDataset) -> Reader:
        return per_item(dataset.__getitem__)

    def batches(get: Callable[[list[int]], Any]) -> Reader:
        return lambda block: [get(block[s : s + BATCH]) for s in range(0, len(block), BATCH)]

    memmap_dataset = CropDataset(memmap, crop, objects=plate)
    direct = CropDataset(plate, crop)
    direct_batched = CropDataset(plate, crop)
    threaded = CropDataset(plate, crop.replace(decode_threads=2))
    found: dict[str, tuple[Reader, Any]] = {
        "memmap ceiling, per item": (items(memmap_dataset), None),
        "memmap ceiling, batched": (batches(CropDataset(memmap, crop, objects=plate).__getitems__), None),
        "direct, per item": (items(direct), direct.reader),
        "direct, batched": (batches(direct_batched.__getitems__), direct_batched.reader),
        "direct, batched, 2 decode threads": (batches(threaded.__getitems__), threaded.reader),
    }
    windows = CropWindows.from_dataset(direct)
    found["copy ceiling (C), 1 thread"] = (batches(CopyCeiling(memmap, windows, 1)), None)
    found["copy ceiling (C), 2 threads"] = (batches(CopyCeiling(memmap, windows, 2)), None)
    try:
        peer = TensorStoreBatched(windows, cache_bytes=budget)
        found["tensorstore, batched (ts.Batch)"] = (batches(peer.__getitems__), None)
    except PeerUnavailableError as error:
        print(f"tensorstore skipped: {error}")
    return found


def interleaved(named: dict[str, tuple[Reader, Any]], order: list[int], rounds: int) -> dict[str, dict[str, Any]]:
    """Each reader's crops/s over the same blocks of ``order``, readers taking turns block by block."""
    blocks = [order[s : s + BLOCK] for s in range(0, len(order), BLOCK)]
    for read, _ in named.values():  # warm-up: the first block, untimed
        read(blocks[0])
    for _, reader in named.values():
        if reader is not None:
            reader.stats.reset()
    rates = interleaved_rates({name: read for name, (read, _) in named.items()}, blocks, rounds)
    results = {}
    for name, rate in rates.items():
        reader = named[name][1]
        results[name] = {
            m.CROPS_PER_S: rate.overall,
            m.ROUND_MIN: min(rate.per_round),
            m.ROUND_MAX: max(rate.per_round),
            m.ROUND_MEDIAN: rate.median,
            **(reader.stats.per_region() if reader is not None else {}),
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plate", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--objects", type=int, default=3072, help="crops per pass (a multiple of 192)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-loader", action="store_true", help="leave out the Track 2 comparison")
    args = parser.parse_args()
    plate, out = args.plate, args.out
    threads = configure_threads(1)
    env = environment.collect(plate)
    memmap = convert_plate(plate, out / "memmap-ceiling", layout_by_name("memmap"), overwrite=True).path
    metadata = read_plate_metadata(plate)
    channels, height, width = metadata.field_shape
    decoded_bytes = len(metadata.fields) * channels * height * width * 2
    budget = decoded_bytes // 4
    load_into_page_cache([p for p in plate.rglob("*") if p.is_file()] + [p for p in memmap.rglob("*") if p.is_file()])
    loadavg = {"loadavg_start": os.getloadavg()}
    print(f"decoded-chunk cache {budget / 2**20:.1f} MiB = 1/4 of the decoded plate; loadavg {os.getloadavg()}")
    named = readers(plate, memmap, budget)
    reference = CropDataset(plate, CropConfig(crop_size=96, dtype="uint16"))
    results: dict[str, dict[str, dict[str, Any]]] = {}
    with RecordWriter(out / "results.jsonl") as writer:
        for access in ACCESSES:
            order = access_order(reference, access, args.objects, seed=0)
            results[access] = interleaved(named, order, args.rounds)
            for name, metrics in results[access].items():
                metrics[m.CHUNK_CACHE_FRACTION_OF_PLATE] = budget / decoded_bytes
                writer.write(
                    Record(
                        track="targets",
                        case=f"{access}/{name}",
                        environment=env,
                        metrics=metrics,
                        config={
                            "plate": str(plate),
                            "access": access,
                            "reader": name,
                            "batch": BATCH,
                            "block": BLOCK,
                            "rounds": args.rounds,
                            "objects": args.objects,
                            "chunk_cache_bytes": budget,
                            "threads": threads,
                            **loadavg,
                        },
                    )
                )
                print(
                    f"{access:14s} {name:36s} {metrics[m.CROPS_PER_S]:9,.0f} crops/s "
                    f"(rounds {metrics[m.ROUND_MIN]:,.0f}-{metrics[m.ROUND_MAX]:,.0f})",
                    flush=True,
                )
        loader: dict[str, float] = {}
        if not args.skip_loader:
            for tier, dtype in (("none", "uint16"), ("typical", "float32")):
                for label, decode_threads, workers in LOADER_CASES:
                    case = track2.Track2Case(
                        crop=CropConfig(
                            crop_size=96,
                            tier=tier,
                            dtype=dtype,
                            chunk_cache_bytes=budget,
                            decode_threads=decode_threads,
                        ),
                        loader=LoaderSpec(num_workers=workers, batch_size=BATCH),
                        samples=2048,
                        epochs=1,
                    )
                    metrics = track2.run_case(plate, case)
                    loader[f"{tier}/{label}"] = metrics[m.SAMPLES_PER_S]
                    writer.write(
                        Record(
                            track="targets",
                            case=f"loader/{tier}/{label}",
                            environment=env,
                            metrics=metrics,
                            config={"plate": str(plate), "case": case.label, "threads": threads, **loadavg},
                        )
                    )
                    print(f"loader {tier:8s} {label:28s} {metrics[m.SAMPLES_PER_S]:9,.0f} samples/s", flush=True)
    print(f"\ntargets (loadavg at start {loadavg['loadavg_start']}, at end {os.getloadavg()})")
    for access in ACCESSES:
        rates = {name: metrics[m.CROPS_PER_S] for name, metrics in results[access].items()}
        batched, threaded = rates["direct, batched"], rates["direct, batched, 2 decode threads"]
        ceiling, item_ceiling = rates["memmap ceiling, batched"], rates["memmap ceiling, per item"]
        print(
            f"  {access}: direct batched / memmap batched {batched / ceiling:.2f}, with 2 decode threads "
            f"{threaded / ceiling:.2f} (target >= {0.30 if access == 'random' else 0.50:.2f}); per item / per-item "
            f"ceiling {rates['direct, per item'] / item_ceiling:.2f}; batched / per-item ceiling "
            f"{batched / item_ceiling:.2f}"
        )
        tensorstore = rates.get("tensorstore, batched (ts.Batch)")
        if tensorstore:
            print(
                f"  {access}: direct batched / tensorstore batched {batched / tensorstore:.2f}x, with 2 decode "
                f"threads {threaded / tensorstore:.2f}x (target >= 1.5x)"
            )
        copies = rates["copy ceiling (C), 2 threads"] / rates["copy ceiling (C), 1 thread"]
        print(
            f"  {access}: 2 decode threads / 1 {threaded / batched:.2f}x (target >= 1.4x with nothing else running; "
            f"the C copies alone, 2 threads / 1: {copies:.2f}x, so {threaded / batched / copies:.2f} of their gain)"
        )
    for tier in ("none", "typical"):
        if loader:
            base = loader[f"{tier}/1 thread, 0 workers"]
            print(
                f"  loader {tier}: 2 decode threads {loader[f'{tier}/2 decode threads, 0 workers'] / base:.2f}x, "
                f"2 workers {loader[f'{tier}/1 thread, 2 workers'] / base:.2f}x over 1 thread, 0 workers"
            )


if __name__ == "__main__":
    main()
