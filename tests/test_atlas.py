"""The crop atlas: every object's crop once more as one chunk inside the OME-Zarr plate, read in its
place only where it holds the very pixels the fields give."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from cropbench import CropConfig, CropDataset
from cropbench import metrics as m
from cropbench.config import LAYOUTS, StoreConfig
from cropbench.data.sampling import ShuffledRuns, access_order
from cropbench.errors import ConfigError, StoreError
from cropbench.formats import open_plate
from cropbench.formats.atlas import BATCH_GROUPED_RUN, GROUPED_RUN, WINDOWS_NAME, FieldRun, atlas_folder
from cropbench.formats.base import Regions
from cropbench.formats.sources import mirror_metadata
from cropbench.measure import endpoints
from cropbench.measure.remote import requests_per_crop

CROP_SIZE = LAYOUTS["atlas"].crop_atlas
#: Bytes of one crop of every channel of the tiny plate, uint16.
CROP_BYTES = 5 * CROP_SIZE * CROP_SIZE * 2


def _images(dataset: CropDataset, indices: list[int]) -> torch.Tensor:
    return dataset.__getitems__(indices).collated()["image"]


@pytest.mark.parametrize("border", ["pad", "shift"])
@pytest.mark.parametrize("crop_size", [CROP_SIZE, 64])
def test_every_crop_reads_the_same_pixels_as_the_default_layout(
    tiny_plate: Path, atlas_plate: Path, crop_size: int, border: str
) -> None:
    config = CropConfig(crop_size=crop_size, border=border)
    atlas, default = CropDataset(atlas_plate, config), CropDataset(tiny_plate, config)
    everything = list(np.random.default_rng(0).permutation(len(default)))
    assert torch.equal(_images(atlas, everything), _images(default, everything))
    for index in everything[:40]:
        assert torch.equal(atlas[int(index)]["image"], default[int(index)]["image"]), index
    share = atlas.reader.stats.per_region()[m.CROPS_FROM_ATLAS]
    if crop_size == CROP_SIZE and border == "pad":
        assert share == 1.0, "every crop of the atlas's size and windows is read from the atlas"
    elif crop_size != CROP_SIZE:
        assert share == 0.0, "a crop of another size is cut from the fields"


def test_one_region_is_routed_as_a_batch_of_regions_routes_it(atlas_plate: Path) -> None:
    """The single-crop path (plain ints) and the batch path (arrays) move the same regions to the same
    atlas pixels, and leave the same ones on the fields."""
    reader = open_plate(atlas_plate, "direct")
    (atlas,) = reader.atlases
    dataset = CropDataset(atlas_plate, CropConfig(crop_size=CROP_SIZE, border="pad"))
    exact = dataset.regions_of(np.arange(len(dataset)))
    nudged = Regions(exact.field, exact.y0 + 1, exact.y1 + 1, exact.x0, exact.x1, exact.out_y0, exact.out_x0)
    grown = Regions(exact.field, exact.y0, exact.y1 + 1, exact.x0, exact.x1, exact.out_y0, exact.out_x0)
    for regions in (exact, nudged, grown):
        atlas_field = len(reader.metadata.fields)
        routed, _ = atlas.route(regions, atlas_field)
        for i in range(len(regions)):
            field, y0, y1, x0, x1, out_y0, out_x0 = (int(column[i]) for column in regions.columns())
            one = atlas.route_one(field, y0, y1, x0, x1, (y0 - out_y0, x0 - out_x0))
            batch = tuple(int(column[i]) for column in routed.columns()[:5])
            if one is None:
                assert batch[0] != atlas_field
            else:
                assert batch == (atlas_field, *one)
    assert atlas.route(exact, len(reader.metadata.fields))[1] > 0, "the atlas holds crops of its windows"


def test_a_run_counts_the_regions_of_one_field_read_just_before_each_one() -> None:
    fields = np.array([3, 3, 3, 5, 5, 3, 3])
    before, after = FieldRun().extend(fields)
    assert before.tolist() == [0, 1, 2, 0, 1, 0, 1] and after == FieldRun(3, 2)
    before, after = FieldRun(3, 10).extend(fields)  # the run carries over from the read before
    assert before.tolist() == [10, 11, 12, 0, 1, 0, 1] and after == FieldRun(3, 2)
    one = FieldRun(3, 10)
    for field in fields.tolist():
        one = one.extend_one(field)
    assert one == after, "one region at a time keeps the same run"
    assert FieldRun(3, GROUPED_RUN).grouped is False and FieldRun(3, GROUPED_RUN + 1).grouped is True


@pytest.mark.parametrize("carried", [0, 5, GROUPED_RUN + 2])
def test_a_batch_reads_a_fields_long_stretch_from_the_field_whole(carried: int) -> None:
    """In one batch a stretch of one field's regions that reaches ``BATCH_GROUPED_RUN`` (with the run
    carried over from the batch before) reads the field for all of its regions; a shorter one only past
    ``GROUPED_RUN`` regions in a row."""
    rng = np.random.default_rng(carried)
    fields = np.repeat(rng.permutation(6), rng.integers(1, 2 * BATCH_GROUPED_RUN, size=6))
    run = FieldRun(int(fields[0]), carried)
    in_fields, after = run.in_fields(fields)
    expected, position = [], 0
    while position < len(fields):  # stretch by stretch, counted here one region at a time
        end = position
        while end < len(fields) and fields[end] == fields[position]:
            end += 1
        history = carried if position == 0 else 0
        whole = history + end - position >= BATCH_GROUPED_RUN
        expected += [whole or history + k >= GROUPED_RUN for k in range(end - position)]
        position = end
    assert in_fields.tolist() == expected
    assert after == run.extend(fields)[1]


@pytest.mark.parametrize("one_at_a_time", [True, False])
def test_a_grouped_pattern_reads_a_fields_chunks_past_its_first_crops(
    tiny_plate: Path, atlas_plate: Path, one_at_a_time: bool
) -> None:
    """Crops of one field read one after another share the field's decoded chunks: past the first
    ``GROUPED_RUN`` they come from the fields, with the same pixels, and in one batch (known whole) a
    field's ``BATCH_GROUPED_RUN`` or more crops all do; a shuffle reads them all from the atlas."""
    config = CropConfig(crop_size=CROP_SIZE, border="pad")
    atlas, default = CropDataset(atlas_plate, config), CropDataset(tiny_plate, config)
    grouped = access_order(atlas, "grouped-field", len(atlas), seed=0)
    if one_at_a_time:
        for index in grouped:
            assert torch.equal(atlas[index]["image"], default[index]["image"]), index
    else:
        assert torch.equal(_images(atlas, grouped), _images(default, grouped))
    fields = atlas.regions_of(np.asarray(grouped)).field
    runs = np.diff(np.flatnonzero(np.diff(np.concatenate([[-1], fields, [-1]]))))
    assert runs.max() >= BATCH_GROUPED_RUN, "the tiny plate has a field of more crops than a grouped run"
    from_atlas = [0 if not one_at_a_time and run >= BATCH_GROUPED_RUN else min(int(run), GROUPED_RUN) for run in runs]
    expected = sum(from_atlas) / len(grouped)
    assert atlas.reader.stats.per_region()[m.CROPS_FROM_ATLAS] == pytest.approx(expected)


def test_a_channel_subset_comes_from_the_atlas_too(tiny_plate: Path, atlas_plate: Path) -> None:
    config = CropConfig(crop_size=CROP_SIZE, channels=("RNA", "DNA"))
    atlas, default = CropDataset(atlas_plate, config), CropDataset(tiny_plate, config)
    indices = np.random.default_rng(0).permutation(len(default)).tolist()  # shuffled: no grouped run
    assert torch.equal(_images(atlas, indices), _images(default, indices))
    assert atlas.reader.stats.per_region()[m.CROPS_FROM_ATLAS] == 1.0


def test_the_atlas_is_an_ome_zarr_image_that_zarr_python_and_ome_zarr_py_read(
    tiny_plate: Path, atlas_plate: Path
) -> None:
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Reader

    folder = atlas_plate / atlas_folder(CROP_SIZE)
    document = json.loads((folder / WINDOWS_NAME).read_text())
    array = zarr.open_array(str(folder / "0"), mode="r")
    assert array.chunks == (5, CROP_SIZE, CROP_SIZE) and array.shards is not None
    default = CropDataset(tiny_plate, CropConfig(crop_size=CROP_SIZE))
    columns = document["columns"]
    for cell in (0, 1, len(document["windows"]) - 1):
        row, column = divmod(cell, columns)
        top, left = row * CROP_SIZE, column * CROP_SIZE
        stored = np.asarray(array[:, top : top + CROP_SIZE, left : left + CROP_SIZE])
        assert np.array_equal(stored, default[cell]["image"].numpy()), f"cell {cell} holds object {cell}'s crop"
    nodes = list(Reader(parse_url(str(folder)))())
    assert np.array_equal(np.asarray(nodes[0].data[0]), np.asarray(array[...]))
    plate_nodes = list(Reader(parse_url(str(atlas_plate)))())
    assert plate_nodes, "ome-zarr-py still reads the plate"
    assert zarr.open_group(str(atlas_plate), mode="r").attrs["ome"]["plate"]["wells"]


def test_the_layout_is_named_checked_and_labelled() -> None:
    assert LAYOUTS["atlas"].label.endswith(f"-atlas{CROP_SIZE}")
    with pytest.raises(ConfigError, match="crop_atlas needs format 'ome-zarr'"):
        LAYOUTS["memmap"].__class__(format="memmap", codec="none", crop_atlas=96)
    with pytest.raises(ConfigError, match="crop_atlas must be"):
        LAYOUTS["default"].__class__(crop_atlas=-1)


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda text: text[: len(text) // 2], "is unreadable"),
        (lambda text: text.replace('"A/1/0/0"', '"Z/9/0/0"', 1), "which plate"),
        (lambda text: json.dumps({**json.loads(text), "crop_size": 0}), "is unreadable"),
        (lambda text: json.dumps({**json.loads(text), "columns": 10**6}), "cannot hold"),
    ],
    ids=["truncated", "unknown-field", "no-size", "too-many-columns"],
)
def test_a_damaged_windows_document_is_refused_naming_it(atlas_plate: Path, tmp_path: Path, damage, message) -> None:
    import shutil

    copy = tmp_path / "plate.zarr"
    shutil.copytree(atlas_plate, copy)
    windows = copy / atlas_folder(CROP_SIZE) / WINDOWS_NAME
    windows.write_text(damage(windows.read_text()))
    with pytest.raises(StoreError, match=message) as raised:
        open_plate(copy, "direct")
    assert WINDOWS_NAME in str(raised.value) or atlas_folder(CROP_SIZE) in str(raised.value)


@pytest.fixture(scope="module")
def served(tiny_plate: Path, atlas_plate: Path) -> Iterator[dict[str, str]]:
    if endpoints.nginx_binary() is None:
        pytest.skip("nginx is not installed: apt-get install -y nginx")
    with endpoints.http_plate(tiny_plate) as default, endpoints.http_plate(atlas_plate) as atlas:
        yield {"default": default, "atlas": atlas}


def test_over_a_store_a_crop_is_one_request_of_about_its_compressed_bytes(
    served: dict[str, str], tmp_path: Path
) -> None:
    counts = {
        name: requests_per_crop(
            mirror_metadata(url, StoreConfig(), cache_dir=tmp_path / name), "direct", crops=64, cache_bytes=0
        )
        for name, url in served.items()
    }
    moved = {name: count[m.BYTES_TRANSFERRED_PER_CROP] / CROP_BYTES for name, count in counts.items()}
    assert moved["atlas"] <= 1.0 < moved["default"], moved
    assert counts["atlas"][m.REQUESTS_PER_CROP] == 1.0, counts["atlas"]


def test_over_a_store_a_run_of_objects_is_one_request(served: dict[str, str], tmp_path: Path) -> None:
    mirror = mirror_metadata(served["atlas"], StoreConfig(), cache_dir=tmp_path / "mirror")
    dataset = CropDataset(mirror, CropConfig(crop_size=CROP_SIZE, chunk_cache_bytes=0))
    dataset.__getitems__(list(range(len(dataset))))  # every shard index read once
    reads = {}
    for run in (1, 8):
        dataset.reader.stats.reset()
        dataset.__getitems__(list(ShuffledRuns(len(dataset), run, seed=3))[:64])
        reads[run] = dataset.reader.stats.reads
    assert reads[8] <= 64 // 8 + 1, "a run of cells is one byte range (a run may span two shards)"
    assert reads[8] < reads[1], reads


def test_the_runs_shuffle_reads_every_object_once_an_epoch_in_runs() -> None:
    sampler = ShuffledRuns(48, 8, seed=1)
    first, second = list(sampler), list(sampler)
    assert sorted(first) == sorted(second) == list(range(48)) and first != second, "each epoch a new order"
    for order in (first, second):
        runs = [sorted(order[start : start + 8]) for start in range(0, 48, 8)]
        assert all(run == list(range(run[0], run[0] + 8)) and run[0] % 8 == 0 for run in runs), runs
    assert [first[start] // 8 for start in range(0, 48, 8)] != list(range(6)), "the runs come in a random order"
