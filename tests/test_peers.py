"""Peers: same crops as cropbench, clean skips without their extras, rows from the CLI and the runner."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import TINY_SPEC
from torch.utils.data import DataLoader

from cropbench import metrics as m
from cropbench.cli import main
from cropbench.config import LAYOUTS, CropConfig
from cropbench.data.dataset import CropDataset
from cropbench.errors import ConfigError, PeerUnavailableError
from cropbench.harness.context import RunContext
from cropbench.harness.runner import run_tracks
from cropbench.harness.windows import CropWindows
from cropbench.plates.generate import generate_plate
from cropbench.records import Record, read_records
from cropbench.report.plots import peers_comparison
from cropbench.tracks.peers import (
    MIN_SAMPLES,
    PEERS,
    PeerComparison,
    Peers,
    SpatialDataTiles,
    measure_loader,
    open_peer,
)

ZARR_PEERS = (
    "zarr-open-per-crop",
    "zarr-kept-open",
    "dask-per-crop",
    "zarr-zarrs",
    "tensorstore-per-crop",
    "tensorstore-batched",
)
ARROW_PEERS = ("arrow-crop-rows", "arrow-field-rows")


def _reference(plate: Path, size: int = 96) -> CropDataset:
    return CropDataset(plate, CropConfig(crop_size=size, dtype="uint16"))


def _peer_or_skip(name: str, windows: CropWindows, work_dir: Path) -> Any:
    try:
        return open_peer(name, windows, work_dir)
    except PeerUnavailableError as error:
        pytest.skip(str(error))


def _border_indices(dataset: CropDataset) -> np.ndarray:
    _, height, width = dataset.reader.metadata.field_shape
    size = dataset.config.crop_size
    y0, x0 = dataset.window_y0, dataset.window_x0
    return np.flatnonzero((y0 < 0) | (x0 < 0) | (y0 + size > height) | (x0 + size > width))


@pytest.fixture(scope="module")
def reference(tiny_plate: Path) -> CropDataset:
    return _reference(tiny_plate)


@pytest.fixture(scope="module")
def windows(reference: CropDataset) -> CropWindows:
    return CropWindows.from_dataset(reference)


@pytest.fixture(scope="module")
def spatialdata_peer(windows: CropWindows, tmp_path_factory: pytest.TempPathFactory) -> SpatialDataTiles:
    peer = _peer_or_skip("spatialdata-tiles", windows, tmp_path_factory.mktemp("peers"))
    assert isinstance(peer, SpatialDataTiles)
    return peer


def test_the_tiny_plate_has_border_and_interior_cells(reference: CropDataset) -> None:
    border = _border_indices(reference)
    assert 0 < len(border) < len(reference)


@pytest.mark.parametrize("name", [*ZARR_PEERS, *ARROW_PEERS])
def test_peer_crops_are_byte_identical_to_cropbench_in_every_layout(
    name: str,
    layout_plate: Path,
    tmp_path: Path,
) -> None:
    reference = _reference(layout_plate, size=64)
    peer = _peer_or_skip(name, CropWindows.from_dataset(reference), tmp_path)
    assert len(peer) == len(reference)
    for index in range(len(reference)):
        item = peer[index]
        assert item["index"] == index
        assert item["image"].dtype == torch.uint16
        assert np.array_equal(item["image"].numpy(), reference.read_raw(index)), f"{name} differs at object {index}"


def test_tensorstore_batches_are_byte_identical_to_cropbench(layout_plate: Path, tmp_path: Path) -> None:
    reference = _reference(layout_plate, size=64)
    peer = _peer_or_skip("tensorstore-batched", CropWindows.from_dataset(reference), tmp_path)
    order = np.random.default_rng(2).permutation(len(reference)).tolist()
    batch = peer.__getitems__(order)
    assert torch.equal(batch["index"], torch.tensor(order))
    assert np.array_equal(batch["image"].numpy(), np.stack([reference.read_raw(i) for i in order]))


def test_spatialdata_interior_tiles_are_byte_identical(
    spatialdata_peer: SpatialDataTiles, reference: CropDataset
) -> None:
    border = set(_border_indices(reference).tolist())
    interior = [i for i in range(len(reference)) if i not in border]
    for index in interior:
        pixels, _, _ = spatialdata_peer.raw_tile(index)
        assert np.array_equal(pixels, reference.read_raw(index)), f"tile {index} differs from cropbench"


def test_spatialdata_border_tiles_are_clipped_to_the_field_and_padded_by_the_wrapper(
    spatialdata_peer: SpatialDataTiles,
    reference: CropDataset,
) -> None:
    size = reference.config.crop_size
    _, height, width = reference.reader.metadata.field_shape
    for index in _border_indices(reference).tolist():
        pixels, tile_y0, tile_x0 = spatialdata_peer.raw_tile(index)
        y0, x0 = int(reference.window_y0[index]), int(reference.window_x0[index])
        # What ImageTilesDataset returns: only the part of the window inside the field, not padded.
        assert (tile_y0, tile_x0) == (max(y0, 0), max(x0, 0))
        assert pixels.shape[1:] == (min(y0 + size, height) - tile_y0, min(x0 + size, width) - tile_x0)
        assert pixels.shape[1:] != (size, size)
        crop = reference.read_raw(index)
        top, left = tile_y0 - y0, tile_x0 - x0
        assert np.array_equal(pixels, crop[:, top : top + pixels.shape[1], left : left + pixels.shape[2]])
        # The wrapper places it in a zeroed window: cropbench's border="pad".
        assert np.array_equal(spatialdata_peer[index]["image"].numpy(), crop)


def test_spatialdata_wrapper_counts_clipped_tiles(windows: CropWindows, reference: CropDataset, tmp_path: Path) -> None:
    peer = _peer_or_skip("spatialdata-tiles", windows, tmp_path)
    border = _border_indices(reference)[:3].tolist()
    for index in border:
        peer[index]
    interior = next(i for i in range(len(reference)) if i not in set(_border_indices(reference).tolist()))
    peer[interior]
    info = peer.info()
    assert (info[m.CLIPPED_TILES], info[m.TILES_READ]) == (len(border), len(border) + 1)
    assert info[m.CLIPPED_FRACTION] == pytest.approx(len(border) / (len(border) + 1))


def test_raw_spatialdata_items_do_not_collate_but_the_wrapper_does(spatialdata_peer: SpatialDataTiles) -> None:
    from torch.utils.data import default_collate

    raw = [spatialdata_peer.tiles[0][i] for i in range(2)]
    with pytest.raises(TypeError):
        default_collate(raw)
    batch = default_collate([spatialdata_peer[i] for i in range(4)])
    assert batch["image"].shape == (4, 5, 96, 96)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dask-per-crop", "spatialdata-tiles", "zarr-kept-open", "arrow-crop-rows"])
def test_peers_load_through_forked_workers_after_dask_used_threads(
    name: str,
    windows: CropWindows,
    reference: CropDataset,
    tmp_path: Path,
) -> None:
    peer = _peer_or_skip(name, windows, tmp_path)
    if name in ("dask-per-crop", "spatialdata-tiles"):
        import dask.array as da

        # The parent starts dask's threaded pool, which forked workers inherit without its threads.
        da.ones((64, 64), chunks=8).sum().compute(scheduler="threads")
    loader = DataLoader(peer, batch_size=8, num_workers=2, multiprocessing_context="fork", timeout=120)
    seen = 0
    for batch in loader:
        for image, index in zip(batch["image"], batch["index"].tolist(), strict=True):
            assert np.array_equal(image.numpy(), reference.read_raw(index))
            seen += 1
    assert seen == len(reference)


@pytest.mark.parametrize(
    ("name", "module", "command"),
    [
        ("dask-per-crop", "dask", r"\.venv/bin/pip install -e '\.\[dask\]'"),
        ("spatialdata-tiles", "spatialdata", r"bash scripts/setup_peers\.sh"),
    ],
)
def test_a_peer_without_its_extra_is_unavailable_with_a_command_that_installs_it(
    name: str,
    module: str,
    command: str,
    windows: CropWindows,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(PeerUnavailableError, match=rf"{module}.*{command}"):
        open_peer(name, windows, tmp_path)


def test_zarr_peers_skip_a_memmap_plate_while_arrow_peers_read_it(tmp_path: Path) -> None:
    plate = tmp_path / "memmap-plate"
    generate_plate(plate, TINY_SPEC, LAYOUTS["memmap"], progress=False)
    reference = _reference(plate, size=64)
    windows = CropWindows.from_dataset(reference)
    for name in ("zarr-open-per-crop", "dask-per-crop", "spatialdata-tiles"):
        with pytest.raises(PeerUnavailableError, match="memmap"):
            open_peer(name, windows, tmp_path / "work")
    peer = open_peer("arrow-field-rows", windows, tmp_path / "work")
    assert np.array_equal(peer[0]["image"].numpy(), reference.read_raw(0))


def test_unknown_peer_and_bad_comparison_are_config_errors(windows: CropWindows) -> None:
    with pytest.raises(ConfigError, match="peer='nope'"):
        open_peer("nope", windows)
    with pytest.raises(ConfigError, match="samples"):
        PeerComparison(samples=1)
    with pytest.raises(ConfigError, match="peer 'nope'"):
        PeerComparison(peers=("nope",))
    with pytest.raises(ConfigError, match="preset"):
        PeerComparison.for_preset("huge")


def test_peers_refuse_a_dataset_with_a_channel_subset(tiny_plate: Path) -> None:
    subset = CropDataset(tiny_plate, CropConfig(channels=("DNA",), dtype="uint16"))
    with pytest.raises(ConfigError, match="all channels"):
        CropWindows.from_dataset(subset)


def test_arrow_tables_are_written_once_and_rebuilt_when_the_windows_change(
    tiny_plate: Path,
    windows: CropWindows,
    tmp_path: Path,
) -> None:
    first = open_peer("arrow-crop-rows", windows, tmp_path)
    again = open_peer("arrow-crop-rows", windows, tmp_path)
    assert first.built and not again.built
    smaller = CropWindows.from_dataset(_reference(tiny_plate, size=48))
    other = open_peer("arrow-crop-rows", smaller, tmp_path)
    assert other.built and other.path != first.path
    shifted = CropWindows(**{**smaller.__dict__, "window_y0": smaller.window_y0 + 1})
    assert open_peer("arrow-crop-rows", shifted, tmp_path).built


def test_measure_loader_caps_slow_loaders_at_the_budget_but_not_below_the_floor() -> None:
    comparison = PeerComparison(samples=200, warmup=5, seconds=0.05)
    metrics = measure_loader(lambda index: time.sleep(0.002), list(range(405)), comparison)
    assert metrics[m.COUNT] == MIN_SAMPLES
    assert metrics[m.BUDGET_CAPPED] is True
    assert metrics[m.SAMPLES_REQUESTED] == 200
    fast = measure_loader(lambda index: index, list(range(405)), PeerComparison(samples=200, warmup=5))
    assert fast[m.COUNT] == 200 and fast[m.BUDGET_CAPPED] is False


def _run(plate: Path, comparison: PeerComparison, work_dir: Path) -> list[Record]:
    context = RunContext(plate, environment={"python": "x"}, thread_settings={"torch_threads": 1})
    return run_tracks([Peers(comparison, work_dir)], "smoke", context, lambda record: None)


def test_run_peers_writes_one_row_per_loader_with_ratios_to_direct(tiny_plate: Path, tmp_path: Path) -> None:
    comparison = PeerComparison(samples=MIN_SAMPLES, warmup=3, seconds=0.5, crop_size=64)
    records = _run(tiny_plate, comparison, tmp_path)
    assert len(records) == 3 + len(PEERS)
    by_peer = {r.config["peer"]: r for r in records}
    assert list(by_peer)[:3] == ["cropbench-direct", "cropbench-zarr", "cropbench-field"]
    assert set(by_peer) == {"cropbench-direct", "cropbench-zarr", "cropbench-field", *PEERS}
    direct = by_peer["cropbench-direct"].metrics[m.SAMPLES_PER_S]
    for record in records:
        assert record.track == "peers"
        assert record.config["crop_size"] == 64 and record.config["access"] == "random"
        if record.metrics.get(m.SKIPPED):
            assert record.config["kind"] == "peer" and record.metrics[m.SKIP_REASON]
            continue
        assert record.metrics[m.COUNT] >= MIN_SAMPLES
        assert "few-samples" in record.metrics[m.VALIDITY_FLAGS], "a p95 over 20 timings is not one to quote"
        if record.config["peer"] != "cropbench-direct":
            assert record.metrics[m.RATIO_TO_DIRECT] == pytest.approx(record.metrics[m.SAMPLES_PER_S] / direct)


def test_run_peers_records_a_missing_extra_as_a_skipped_row(
    tiny_plate: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "dask", None)
    comparison = PeerComparison(samples=MIN_SAMPLES, warmup=3, seconds=0.5, peers=("dask-per-crop",))
    records = _run(tiny_plate, comparison, tmp_path)
    row = records[-1]
    assert row.config["peer"] == "dask-per-crop"
    assert row.metrics[m.SKIPPED] is True
    assert ".venv/bin/pip install -e '.[dask]'" in row.metrics[m.SKIP_REASON]
    assert "scripts/setup_peers.sh" in PEERS["spatialdata-tiles"].install_hint, "spatialdata cannot share .venv"


def test_cli_run_peers_writes_peer_rows_and_the_figure(
    tiny_plate: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = main(
        [
            "run",
            "--plate",
            str(tiny_plate),
            "--peers",
            "--samples",
            str(MIN_SAMPLES),
            "--out",
            str(out),
            "--no-progress",
            "--plot",
        ]
    )
    assert code == 0
    records = read_records(out / "results.jsonl")
    assert {r.track for r in records} == {"peers"}
    assert {r.config["peer"] for r in records} == {"cropbench-direct", "cropbench-zarr", "cropbench-field", *PEERS}
    assert (out / "plots" / "peers_comparison.png").stat().st_size > 0
    lines = (out / "results.jsonl").read_text().splitlines()
    assert all(json.loads(line)["track"] == "peers" for line in lines)
    left = tiny_plate.parent / f"{tiny_plate.name}.peers"  # the peers' copies, reused by the next run
    size = sum(p.stat().st_size for p in left.rglob("*") if p.is_file())
    assert f"peer loaders' copies of the plate kept in: {left} ({size / 2**20:.1f} MiB)" in capsys.readouterr().out


def test_peers_figure_draws_measured_and_skipped_rows(tmp_path: Path) -> None:
    def row(peer: str, kind: str, metrics: dict[str, Any]) -> Record:
        return Record(
            track="peers",
            case=f"{peer}/96px/all",
            config={"peer": peer, "kind": kind, "plate": "p.zarr", "layout": "default", "crop_size": 96},
            metrics=metrics,
            environment={},
        )

    records = [
        row("cropbench-direct", "cropbench", {m.SAMPLES_PER_S: 5000.0}),
        row("dask-per-crop", "peer", {m.SAMPLES_PER_S: 50.0, m.DIRECT_SPEEDUP: 100.0}),
        row("spatialdata-tiles", "peer", {m.SKIPPED: True, m.SKIP_REASON: "spatialdata cannot be imported"}),
    ]
    path = peers_comparison(records, tmp_path)
    assert path is not None and path.name == "peers_comparison.png" and path.stat().st_size > 0
    assert peers_comparison([r for r in records if r.track == "dataset"], tmp_path) is None
