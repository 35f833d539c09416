"""Convert or read in place: the conversion's costs, the comparison's rows, break-even, and the table."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from cropbench import api
from cropbench import metrics as m
from cropbench.data.training import TRAINING_FORMATS, CropStoreInfo
from cropbench.errors import ConfigError, OutputError
from cropbench.harness.context import RunContext
from cropbench.harness.validity import CACHE_HOLDS_PLATE_FLAG, LIBRARY_CACHE_FLAG, flag_meaning
from cropbench.metrics import (
    BREAK_EVEN_EPOCHS,
    CONVERSION_PEAK_RSS_GROWTH_BYTES,
    CONVERSION_SECONDS,
    CONVERTING_PAYS_OFF,
    EPOCH_RATIO_TO_IN_PLACE,
    IDENTICAL_TO_PLATE,
    INTERLEAVED,
    INTERLEAVED_EPOCH_SECONDS,
    INTERLEAVED_IN_PLACE_EPOCH_SECONDS,
    RANDOM,
    RANDOM_RATIO_TO_IN_PLACE,
    SHUFFLED,
    SIZE_RATIO_TO_PLATE,
)
from cropbench.report.tables import formats_table
from cropbench.report.verdict import plain_reason
from cropbench.tracks import formats as conversion
from cropbench.tracks.formats import (
    FormatComparison,
    Formats,
    break_even,
    break_evens,
    convert_crops,
    library_cache,
    timed_epochs,
)

AVAILABLE = [name for name, cls in TRAINING_FORMATS.items() if cls.available() is None]
#: A comparison small enough for the fast tier: correctness, not numbers.
TINY = FormatComparison(
    formats=tuple(TRAINING_FORMATS),
    crop_size=32,
    samples=40,
    warmup=5,
    repeats=1,
    workers=0,
    batch_size=16,
    epochs=2,
    shard_bytes=200_000,
)


def test_a_conversion_records_its_time_memory_and_bytes(tiny_plate: Path, tmp_path: Path) -> None:
    if "hdf5" not in AVAILABLE:
        pytest.skip(TRAINING_FORMATS["hdf5"].available() or "")
    done = convert_crops(RunContext(plate=tiny_plate), tmp_path / "crops", "hdf5", crop_size=32, shard_bytes=10**6)
    assert done.path == tmp_path / "crops" and done.seconds > 0
    assert done.info == CropStoreInfo.read(done.path)
    assert done.info.stored_bytes == sum(p.stat().st_size for p in done.path.iterdir() if p.suffix == ".h5")
    metrics = done.metrics()
    assert metrics[m.STORED_BYTES] == done.info.stored_bytes
    assert done.peak_rss_bytes is None or metrics[CONVERSION_PEAK_RSS_GROWTH_BYTES] >= 0
    with pytest.raises(OutputError, match="already exists"):
        convert_crops(RunContext(plate=tiny_plate), tmp_path / "crops", "hdf5", crop_size=32)
    assert sorted(os.listdir(tmp_path)) == ["crops"]


def test_break_even_is_conversion_time_over_the_time_saved_per_epoch() -> None:
    assert break_even(100.0, 10.0, 5.0) == {CONVERTING_PAYS_OFF: True, BREAK_EVEN_EPOCHS: 20.0}
    assert break_even(100.0, 5.0, 10.0) == {CONVERTING_PAYS_OFF: False}
    assert break_even(100.0, 5.0, 5.0) == {CONVERTING_PAYS_OFF: False}


def test_break_even_is_decided_from_whole_epochs_never_from_steady_rates() -> None:
    """A store whose steady rate is five times the plate's but whose first batch of each epoch is slow, so
    that over whole epochs it delivers fewer crops per second than the plate in place, never pays off."""
    objects = 1000
    in_place = {m.prefixed(SHUFFLED, m.SAMPLES_PER_S): 1100.0, m.prefixed(SHUFFLED, m.EPOCH_SAMPLES_PER_S): 1000.0}
    slow_start = {
        CONVERSION_SECONDS: 30.0,
        m.prefixed(SHUFFLED, m.SAMPLES_PER_S): 5500.0,
        m.prefixed(SHUFFLED, m.FIRST_BATCH_MS): 1500.0,
        m.prefixed(SHUFFLED, m.EPOCH_SAMPLES_PER_S): 500.0,
    }
    assert break_evens(slow_start, in_place, objects) == {CONVERTING_PAYS_OFF: False}
    level = {**slow_start, m.prefixed(SHUFFLED, m.EPOCH_SAMPLES_PER_S): 1000.0}
    assert break_evens(level, in_place, objects) == {CONVERTING_PAYS_OFF: False}, "not above: never"
    # whole epochs of 0.5 s against 1 s in place: 30 s of converting back after 60 epochs
    faster = {**slow_start, m.prefixed(SHUFFLED, m.EPOCH_SAMPLES_PER_S): 2000.0}
    assert break_evens(faster, in_place, objects) == {CONVERTING_PAYS_OFF: True, BREAK_EVEN_EPOCHS: 60.0}
    over_store = {m.prefixed(m.REMOTE, m.EPOCH_SAMPLES_PER_S): 400.0}
    both = break_evens(
        {**faster, m.prefixed(m.REMOTE, m.EPOCH_SAMPLES_PER_S): 300.0}, {**in_place, **over_store}, objects
    )
    assert both[m.prefixed(m.REMOTE, CONVERTING_PAYS_OFF)] is False and both[BREAK_EVEN_EPOCHS] == 60.0
    assert m.prefixed(m.REMOTE, CONVERTING_PAYS_OFF) not in break_evens(faster, {**in_place, **over_store}, objects)


def test_a_library_cache_that_held_the_first_epoch_flags_the_row() -> None:
    assert library_cache(2, 4096) == {m.LOCAL_CACHE_BYTES: 4096, m.VALIDITY_FLAGS: [LIBRARY_CACHE_FLAG]}
    assert library_cache(2, 0) == {m.LOCAL_CACHE_BYTES: 0}, "an empty cache served nothing"
    assert library_cache(1, 4096) == {m.LOCAL_CACHE_BYTES: 4096}, "one epoch: no later epoch to serve"
    assert flag_meaning(LIBRARY_CACHE_FLAG) != LIBRARY_CACHE_FLAG and plain_reason(LIBRARY_CACHE_FLAG)


class Numbers(Dataset[dict[str, Any]]):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"image": torch.zeros(1, 2, 2), "index": index}


def test_timed_epochs_counts_what_each_epoch_delivered() -> None:
    loader = DataLoader(Numbers(), batch_size=4, shuffle=True)
    metrics = timed_epochs(loader, epochs=2, warmup_batches=1, objects=10)
    assert metrics[m.DELIVERED_SAMPLES] == metrics[m.EXPECTED_SAMPLES] == 20
    assert metrics[m.EXACTLY_ONCE] is True and len(metrics[m.EPOCH_SECONDS]) == 2
    assert metrics[m.SAMPLES_PER_S] > 0 and metrics[m.FIRST_BATCH_MS] > 0
    assert metrics[m.EPOCH_SAMPLES_PER_S] == pytest.approx(20 / sum(metrics[m.EPOCH_SECONDS]))
    called: list[int] = []
    timed_epochs(loader, epochs=2, warmup_batches=1, objects=10, after_first=lambda: called.append(1))
    assert called == [1], "once, after the first epoch"
    short = timed_epochs(DataLoader(Numbers(), batch_size=4, sampler=range(8)), epochs=1, warmup_batches=1, objects=10)
    assert short[m.EXACTLY_ONCE] is False


def test_the_comparison_checks_its_knobs() -> None:
    with pytest.raises(ConfigError, match="format 'csv' is not one of"):
        FormatComparison(formats=("csv",))
    with pytest.raises(ConfigError, match="epochs must be a whole number >= 1, got 0"):
        FormatComparison(epochs=0)
    with pytest.raises(ConfigError, match="workers must be a whole number from 0 to 256 .*, got -1"):
        FormatComparison(workers=-1)


@pytest.fixture(scope="module")
def rows(tiny_plate: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    root = tmp_path_factory.mktemp("formats")
    records = api.run(tiny_plate, [Formats(TINY, root / "work")], out_dir=root / "out")
    assert not (root / "work").exists()  # the stores this run wrote are gone, and the folder it made
    return records


def test_every_reader_gets_one_row_in_place_first(rows: list[Any]) -> None:
    assert [r.case for r in rows] == ["ome-zarr/direct", "ome-zarr/zarr", "ome-zarr/atlas", *TRAINING_FORMATS]
    assert {r.track for r in rows} == {"formats"}
    assert [r.config["format"] for r in rows] == ["ome-zarr"] * 3 + list(TRAINING_FORMATS)


def test_the_plate_rechunked_into_the_atlas_layout_is_read_in_place_from_its_atlas(rows: list[Any]) -> None:
    row = next(r for r in rows if r.case == "ome-zarr/atlas")
    assert row.config["decode"] == "direct" and row.config["layout"]["crop_atlas"] == TINY.crop_size
    assert row.config["layout_label"].endswith(f"-atlas{TINY.crop_size}")
    assert row.metrics[m.CROPS_FROM_ATLAS] == 1.0, "every crop of the comparison's size comes from the atlas"
    assert row.metrics[CONVERSION_SECONDS] > 0 and row.metrics[m.STORED_BYTES] > 0
    assert RANDOM_RATIO_TO_IN_PLACE in row.metrics and CONVERTING_PAYS_OFF in row.metrics


def test_every_reader_delivers_the_plates_crops(rows: list[Any]) -> None:
    measured = [r for r in rows if not r.metrics.get(m.SKIPPED)]
    assert {r.case for r in measured} >= {"ome-zarr/direct", "ome-zarr/zarr", *AVAILABLE}
    for row in measured:
        assert row.metrics[IDENTICAL_TO_PLATE] is True, row.case
        assert row.metrics[m.prefixed(SHUFFLED, m.EXACTLY_ONCE)] is True, row.case
        assert row.metrics[m.prefixed(SHUFFLED, m.SAMPLES_PER_S)] > 0
    hashes = {r.metrics[m.FIDELITY_SHA256] for r in measured}
    assert len(hashes) == 1


def test_converted_rows_carry_cost_size_and_break_even(rows: list[Any]) -> None:
    for row in rows:
        metrics = row.metrics
        if row.case in m.IN_PLACE or metrics.get(m.SKIPPED):
            assert CONVERSION_SECONDS not in metrics
            continue
        assert metrics[CONVERSION_SECONDS] > 0 and metrics[SIZE_RATIO_TO_PLATE] > 0
        assert CONVERTING_PAYS_OFF in metrics
        assert (BREAK_EVEN_EPOCHS in metrics) == metrics[CONVERTING_PAYS_OFF]
        whole = m.prefixed(SHUFFLED, m.EPOCH_SAMPLES_PER_S)
        assert metrics[m.SECONDS_PER_EPOCH] == pytest.approx(metrics[m.OBJECTS] / metrics[whole])
        assert metrics[CONVERTING_PAYS_OFF] == (metrics[whole] > rows[0].metrics[whole]), "from whole epochs"
        in_turns = m.prefixed(INTERLEAVED, CONVERTING_PAYS_OFF)
        assert (m.prefixed(INTERLEAVED, BREAK_EVEN_EPOCHS) in metrics) == metrics[in_turns]
        # a rate ratio, like the random one: above 1 the converted store is faster
        ratio = metrics[INTERLEAVED_IN_PLACE_EPOCH_SECONDS] / metrics[INTERLEAVED_EPOCH_SECONDS]
        assert metrics[EPOCH_RATIO_TO_IN_PLACE] == pytest.approx(ratio)
        assert (metrics[EPOCH_RATIO_TO_IN_PLACE] > 1) == metrics[m.prefixed(INTERLEAVED, CONVERTING_PAYS_OFF)]
        random_access = row.case not in TRAINING_FORMATS or TRAINING_FORMATS[row.case].random_access
        assert (m.prefixed(RANDOM, m.SAMPLES_PER_S) in metrics) == random_access
        assert (RANDOM_RATIO_TO_IN_PLACE in metrics) == random_access


def test_the_table_has_a_line_per_reader(rows: list[Any]) -> None:
    table = formats_table(rows).splitlines()
    assert len(table) == 2 + len(rows)
    assert all(line.split()[0] == row.case for line, row in zip(table[2:], rows, strict=True))
    assert " NO" not in formats_table(rows)


def test_a_format_whose_library_is_missing_is_a_skipped_row(
    tiny_plate: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls = TRAINING_FORMATS["litdata"]
    monkeypatch.setattr(cls, "module", "cropbench_no_such_module")
    comparison = FormatComparison(formats=("litdata",), crop_size=32, samples=10, warmup=0, repeats=1, workers=0)
    records = api.run(tiny_plate, [Formats(comparison, tmp_path / "work")])
    skipped = records[-1]
    assert skipped.case == "litdata" and skipped.metrics[m.SKIPPED] is True
    assert "pip install" in skipped.metrics[m.SKIP_REASON]
    assert "skipped: format 'litdata' needs litdata" in formats_table(records)


def test_keep_leaves_the_stores_and_never_replaces_a_users_folder(tiny_plate: Path, tmp_path: Path) -> None:
    if "hdf5" not in AVAILABLE:
        pytest.skip(TRAINING_FORMATS["hdf5"].available() or "")
    comparison = FormatComparison(
        formats=("hdf5",), crop_size=32, samples=10, warmup=0, repeats=1, workers=0, rechunk=()
    )
    work = tmp_path / "work"
    api.run(tiny_plate, [Formats(comparison, work, keep=True)])
    assert CropStoreInfo.read(work / "hdf5").format == "hdf5"
    api.run(tiny_plate, [Formats(comparison, work, keep=True)])  # its own store, replaced
    mine = tmp_path / "mine"
    (mine / "hdf5").mkdir(parents=True)
    (mine / "hdf5" / "notes.txt").write_text("not a store")
    with pytest.raises(OutputError, match="refusing to replace .* not a crop store"):
        api.run(tiny_plate, [Formats(comparison, mine, keep=True)])
    assert (mine / "hdf5" / "notes.txt").read_text() == "not a store"
    assert sorted(p.name for p in mine.iterdir()) == ["hdf5"]


@pytest.mark.slow
def test_with_workers_every_epoch_still_delivers_each_crop_once(tiny_plate: Path, tmp_path: Path) -> None:
    comparison = FormatComparison(
        formats=tuple(AVAILABLE), crop_size=32, samples=10, warmup=0, repeats=1, workers=2, batch_size=16
    )
    records = api.run(tiny_plate, [Formats(comparison, tmp_path / "work")])
    assert all(r.metrics[m.prefixed(SHUFFLED, m.EXACTLY_ONCE)] for r in records)
    assert all(r.metrics[IDENTICAL_TO_PLATE] for r in records)


def test_the_module_names_its_track() -> None:
    assert conversion.TRACK == "formats"


def test_compare_formats_prints_the_table_and_writes_the_rows(
    tiny_plate: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cropbench.cli import main
    from cropbench.records import read_records

    args = ["--plate", str(tiny_plate), "--out", str(tmp_path / "out"), "--crop-size", "32", "--samples", "10"]
    args += ["--workers", "0", "--epochs", "1", "--shard-mib", "0.2", "--format", "webdataset", "--no-progress"]
    assert main(["compare-formats", *args, "--rechunk", "none"]) == 0
    printed = capsys.readouterr().out
    assert "convert or read in place" in printed and "webdataset" in printed
    verdict = printed[printed.index("\nVerdict") :]  # the same verdict block as run
    if TRAINING_FORMATS["webdataset"].available() is None:
        assert "track formats (crops converted to training formats): best webdataset" in verdict
        assert "the plate read in place (ome-zarr/direct), epochs in turns" in verdict
        assert "webdataset: converting " in verdict, "after how many epochs it pays off, or never"
    else:  # its library is missing: the plate read in place never competes as the best converted store
        head = "track formats (crops converted to training formats): "
        # the verdict names what the table shows: the plate read in place measured numbers
        assert head + "no converted store measured a number (each row says why); the plate read in place: " in verdict
        assert "ome-zarr/direct " in verdict and "ome-zarr/zarr " in verdict
        assert "no configuration measured a number" not in verdict and head + "best" not in verdict
    for name in ("formats.txt", "formats.png"):  # the table and the figure beside the rows
        assert f"wrote {tmp_path / 'out' / name}" in printed and (tmp_path / "out" / name).stat().st_size > 0
    rows = read_records(tmp_path / "out" / "results.jsonl")
    assert [row.case for row in rows] == ["ome-zarr/direct", "ome-zarr/zarr", "webdataset"]
    assert not (tmp_path / "out" / "crops").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--channels", "DNA,Nope"], "unknown channel 'Nope'"),
        (["--shard-mib", "0"], "--shard-mib must be a finite number of MiB from 9.5e-07 to 4096, got 0"),
        (["--shard-mib", "nan"], "--shard-mib must be a finite number of MiB from 9.5e-07 to 4096, got nan"),
        (["--shard-mib", "inf"], "--shard-mib must be a finite number of MiB from 9.5e-07 to 4096, got inf"),
        (["--shard-mib", "1e12"], "--shard-mib must be a finite number of MiB from 9.5e-07 to 4096, got 1e+12"),
        (["--shard-mib", "1000"], "a shard of 1000 MiB is larger than the whole store"),
        (["--crop-size", "10000"], "crop_size=10000 is larger than the field (200x240)"),
        (["--epochs", "0"], "epochs must be a whole number >= 1, got 0"),
        (["--latency-ms", "nan"], "remote_latency_ms must be from 0 to 60000"),
    ],
)
def test_compare_formats_user_errors_are_one_line(
    extra: list[str], message: str, tiny_plate: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cropbench.cli import main

    args = ["compare-formats", "--plate", str(tiny_plate), "--out", str(tmp_path / "out"), "--no-progress", *extra]
    assert main(args) == 2
    error = capsys.readouterr().err
    assert error.startswith("cropbench: error:") and message in error and len(error.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # every option is checked before anything runs


def test_each_repeat_is_set_against_its_own_in_place_reference(tiny_plate: Path, tmp_path: Path) -> None:
    if "hdf5" not in AVAILABLE:
        pytest.skip(TRAINING_FORMATS["hdf5"].available() or "")
    comparison = FormatComparison(formats=("hdf5",), crop_size=32, samples=10, warmup=0, repeats=1, workers=0)
    track = Formats(comparison, tmp_path / "work")
    records = api.run(tiny_plate, [track], repeats=2)
    converted = [r for r in records if r.case == "hdf5"]
    assert [r.repeat for r in converted] == [0, 1] and sorted(track.reference) == [0, 1]
    assert all(CONVERTING_PAYS_OFF in r.metrics for r in converted)
    assert [r.seed for r in converted] == [0, 1]


def test_the_remote_latency_must_be_a_sane_number() -> None:
    with pytest.raises(ConfigError, match="remote_latency_ms must be from 0 to 60000"):
        FormatComparison(remote_latency_ms=-1)


@pytest.mark.slow
def test_over_a_loopback_store_streaming_formats_read_their_epochs_and_the_others_say_why_not(
    tiny_plate: Path, tmp_path: Path
) -> None:
    from cropbench.data.training.litdata_chunks import PLAIN_HTTP_REFUSED
    from cropbench.measure.store_emulation import SERVER_BOUND_FLAG, unavailable
    from cropbench.metrics import REMOTE, REMOTE_CACHE_BYTES, REMOTE_SKIP_REASON
    from cropbench.report.formats_figure import formats_figure

    if unavailable() is not None:
        pytest.skip(unavailable() or "")
    formats = tuple(name for name in ("hdf5", "webdataset", "litdata", "mds") if name in AVAILABLE)
    if "mds" not in formats:
        pytest.skip(TRAINING_FORMATS["mds"].available() or "")
    comparison = FormatComparison(
        formats=formats, crop_size=32, samples=10, warmup=0, repeats=1, workers=0, epochs=1, remote_latency_ms=5
    )
    rows = api.run(tiny_plate, [Formats(comparison, tmp_path / "work")])
    assert "over the emulated object store at 5 ms median first-byte latency" in formats_table(rows)
    records = {r.case: r.metrics for r in rows}
    streamed = records["mds"]
    assert streamed[m.prefixed(REMOTE, m.EXACTLY_ONCE)] is True
    assert streamed[m.prefixed(REMOTE, m.SAMPLES_PER_S)] > 0 and streamed[m.INJECTED_LATENCY_MS] == 5
    assert streamed[REMOTE_CACHE_BYTES] > 0
    # every crop came over the store at least once: a request per shard and the index at the least
    assert 0 < streamed[m.prefixed(REMOTE, m.REQUESTS_PER_CROP)] < 1
    assert streamed[m.prefixed(REMOTE, m.BYTES_TRANSFERRED_PER_CROP)] > 32 * 32 * 2, "every crop crossed the wire"
    flagged = SERVER_BOUND_FLAG in streamed.get(m.VALIDITY_FLAGS, [])
    assert streamed[m.prefixed(REMOTE, m.SERVER_BOUND)] is flagged, "a server-bound row says so among its flags"
    if "hdf5" in records:
        assert "local files" in records["hdf5"][REMOTE_SKIP_REASON]
    if "webdataset" in records:  # shards by plain HTTP through curl
        assert records["webdataset"][m.prefixed(REMOTE, m.EXACTLY_ONCE)] is True
        assert records["webdataset"][m.prefixed(REMOTE, m.REQUESTS_PER_CROP)] > 0
    if "litdata" in records:  # its epochs, or the one line saying why its client refused the store
        litdata = records["litdata"]
        reason = litdata.get(REMOTE_SKIP_REASON)
        if reason is None:
            assert litdata[m.prefixed(REMOTE, m.EXACTLY_ONCE)] is True
        else:
            assert reason == PLAIN_HTTP_REFUSED.format(version=TRAINING_FORMATS["litdata"].library_version())
            assert f"litdata          not read: {reason}" in formats_table(rows).splitlines()
    in_place = records["ome-zarr/direct"]  # the plate itself over the same store, read by the direct path
    assert in_place[m.prefixed(REMOTE, m.EXACTLY_ONCE)] is True
    assert in_place[m.prefixed(REMOTE, m.REQUESTS_PER_CROP)] > 0
    assert "not read over the store" in records["ome-zarr/zarr"][REMOTE_SKIP_REASON]
    assert m.prefixed(REMOTE, CONVERTING_PAYS_OFF) in streamed
    assert not (tmp_path / "work").exists()
    figure = formats_figure(rows, tmp_path / "formats.png")  # remote bars beside the local ones
    assert figure is not None and figure.stat().st_size > 0


@pytest.mark.slow
def test_the_plate_in_place_over_the_store_reads_with_forked_workers_like_on_disk(
    tiny_plate: Path, tmp_path: Path
) -> None:
    """Forked workers, as the local epochs use: each starts its own HTTP client (and read-ahead), and
    every crop arrives once; no forkserver start-up in the first batch."""
    from cropbench.measure.store_emulation import unavailable
    from cropbench.metrics import REMOTE

    if unavailable() is not None:
        pytest.skip(unavailable() or "")
    comparison = dataclasses.replace(TINY, formats=(), epochs=2, workers=2, batch_size=4, remote_latency_ms=1)
    context = RunContext(plate=tiny_plate)
    row = Formats(comparison, tmp_path / "work")._in_place_over_store(comparison, context, context.object_count)
    assert row[m.prefixed(REMOTE, m.EXACTLY_ONCE)] is True
    assert row[m.prefixed(REMOTE, m.REQUESTS_PER_CROP)] > 0
    # the chunk cache the read-ahead grew, of the decoded fields; one that holds them all flags the row
    fraction = row[m.prefixed(REMOTE, m.CACHE_FRACTION_OF_PLATE)]
    assert fraction > 0
    assert (CACHE_HOLDS_PLATE_FLAG in row.get(m.VALIDITY_FLAGS, [])) == (fraction >= 1)


@pytest.mark.slow
def test_mds_workers_over_a_keep_alive_store_each_read_their_own_shards(tiny_plate: Path, tmp_path: Path) -> None:
    """Forked workers sharing the connection the parent opened for index.json read each other's
    answers (shards holding another shard's bytes): the remote epochs deliver every crop, decoded."""
    from cropbench.data.training import training_format
    from cropbench.measure.store_emulation import unavailable
    from cropbench.metrics import REMOTE, REMOTE_SKIP_REASON
    from cropbench.tracks.formats import remote_epochs

    if unavailable() is not None:
        pytest.skip(unavailable() or "")
    if "mds" not in AVAILABLE:
        pytest.skip(TRAINING_FORMATS["mds"].available() or "")
    done = convert_crops(RunContext(plate=tiny_plate), tmp_path / "mds", "mds", crop_size=32, shard_bytes=20_000)
    comparison = dataclasses.replace(TINY, formats=("mds",), epochs=1, workers=2, batch_size=4, remote_latency_ms=1)
    row = remote_epochs(training_format("mds"), done.path, done.info.plate_name, comparison, done.info.count)
    assert REMOTE_SKIP_REASON not in row, row.get(REMOTE_SKIP_REASON)
    assert row[m.prefixed(REMOTE, m.EXACTLY_ONCE)] is True


def test_a_remote_failure_is_one_line_and_litdatas_plain_http_refusal_says_what_refused() -> None:
    from cropbench.data.training import S3Access
    from cropbench.data.training.litdata_chunks import PLAIN_HTTP_REFUSED

    hdf5 = TRAINING_FORMATS["hdf5"]()
    assert (
        hdf5.remote_failure(OSError("connection refused\nmore")) == "h5py over the loopback store: connection refused"
    )
    if "litdata" not in AVAILABLE:
        pytest.skip(TRAINING_FORMATS["litdata"].available() or "")
    litdata = TRAINING_FORMATS["litdata"]()
    refused = RuntimeError(
        "Chunk prefetch thread crashed. GenericError: Generic S3 error: GET http://x - HTTP error: builder error"
    )
    reason = litdata.remote_failure(refused)
    assert reason == PLAIN_HTTP_REFUSED.format(version=litdata.library_version()) and "\n" not in reason
    assert (
        litdata.remote_failure(RuntimeError("NoSuchBucket\ndetail")) == "litdata over the loopback store: NoSuchBucket"
    )
    plain = S3Access("http://127.0.0.1:9000", "key", "secret", "us-east-1")
    assert litdata.remote_environment(plain) == {"AWS_ALLOW_HTTP": "true"}
    assert litdata.remote_environment(dataclasses.replace(plain, endpoint="https://s3.example.org")) == {}


def compare_formats(plate: Path, tmp_path: Path, *extra: str) -> list[str]:
    """compare-formats' arguments for a fast run of HDF5 (no re-chunked plate) on ``plate``, writing under
    ``tmp_path``."""
    args = ["compare-formats", "--plate", str(plate), "--out", str(tmp_path / "out"), "--crop-size", "32"]
    args += ["--samples", "10", "--workers", "0", "--epochs", "1", "--format", "hdf5", "--no-progress"]
    return [*args, *(extra if "--rechunk" in extra else (*extra, "--rechunk", "none"))]


def test_compare_formats_never_replaces_a_users_folder_with_a_hand_made_manifest(
    tiny_plate: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cropbench.cli import main
    from cropbench.data.training import MANIFEST_NAME

    if "hdf5" not in AVAILABLE:
        pytest.skip(TRAINING_FORMATS["hdf5"].available() or "")
    mine = tmp_path / "work" / "hdf5"
    mine.mkdir(parents=True)
    (mine / "mine.txt").write_text("keep me")
    (mine / MANIFEST_NAME).write_text("{}")
    work = ("--work", str(tmp_path / "work"))
    assert main(compare_formats(tiny_plate, tmp_path, *work, "--keep")) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"cropbench: error: refusing to replace {mine}") and "\n" not in error
    assert main(compare_formats(tiny_plate, tmp_path, *work)) == 0
    assert sorted(p.name for p in mine.iterdir()) == [MANIFEST_NAME, "mine.txt"]
    assert (mine / "mine.txt").read_text() == "keep me" and (mine / MANIFEST_NAME).read_text() == "{}"
    assert [p.name for p in (tmp_path / "work").iterdir()] == ["hdf5"]


@pytest.mark.parametrize("keep", [False, True])
def test_ctrl_c_during_a_conversion_is_one_line_and_leaves_no_scratch(
    keep: bool, tiny_plate: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cropbench.cli import main
    from cropbench.data.training import base

    if "hdf5" not in AVAILABLE:
        pytest.skip(TRAINING_FORMATS["hdf5"].available() or "")
    cut = base.cut_crops

    def interrupted(dataset: Any, batch: int = base.CUT_BATCH) -> Any:
        yield from list(cut(dataset, 16))[:2]  # two batches reach h5py's file, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(base, "cut_crops", interrupted)
    work = tmp_path / "work"
    work.mkdir()
    assert main(compare_formats(tiny_plate, tmp_path, "--work", str(work), *(["--keep"] if keep else []))) == 130
    assert capsys.readouterr().err.strip() == "cropbench: interrupted; every finished row is kept"
    assert list(work.iterdir()) == []


SIGTERM_DURING_CONVERSION = """
import sys, time
from cropbench.cli import main
from cropbench.data.training import base
cut = base.cut_crops
def slow(dataset, batch=base.CUT_BATCH):
    yield from list(cut(dataset, 16))[:2]  # two batches reach h5py's file, then it waits for SIGTERM
    print("converting", flush=True)
    time.sleep(120)
base.cut_crops = slow
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("keep", [False, True])
def test_sigterm_during_a_conversion_is_one_line_and_leaves_no_scratch(
    keep: bool, tiny_plate: Path, tmp_path: Path
) -> None:
    import signal
    import subprocess
    import sys

    if "hdf5" not in AVAILABLE:
        pytest.skip(TRAINING_FORMATS["hdf5"].available() or "")
    work = tmp_path / "work"
    work.mkdir()
    args = compare_formats(tiny_plate, tmp_path, "--work", str(work), *(["--keep"] if keep else []))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_DURING_CONVERSION, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "converting"
        assert any(p.name.endswith(".partial") for p in work.iterdir())  # the store being written
        process.send_signal(signal.SIGTERM)
        _, error = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGTERM, error
    assert error.strip() == "cropbench: interrupted (SIGTERM); every finished row is kept"
    assert list(work.iterdir()) == []


def test_every_skipped_format_is_one_line_naming_the_install_script(
    tiny_plate: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cropbench.cli import main

    for cls in TRAINING_FORMATS.values():
        monkeypatch.setattr(cls, "module", "cropbench_no_such_module")
    args = compare_formats(tiny_plate, tmp_path)
    assert main([*args[:-3], "--format", "hdf5", "--format", "mds", "--no-progress"]) == 0
    captured = capsys.readouterr()
    skipped = [line for line in captured.err.splitlines() if line.startswith("cropbench: skipping")]
    assert len(skipped) == 2 and all("scripts/setup_formats.sh installs it" in line for line in skipped)
    lines = captured.out.strip().splitlines()
    said = lines.index(next(line for line in lines if line.startswith("no training format was measured")))
    assert lines[said + 2] == "Verdict", "said plainly, just before the verdict block"


def test_kept_crop_stores_are_named_with_their_size(
    tiny_plate: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cropbench.cli import main

    if "hdf5" not in AVAILABLE:
        pytest.skip(TRAINING_FORMATS["hdf5"].available() or "")
    work = tmp_path / "work"
    assert main(compare_formats(tiny_plate, tmp_path, "--work", str(work), "--keep")) == 0
    size = sum(p.stat().st_size for p in work.rglob("*") if p.is_file())
    assert f"crop stores kept in: {work} ({size / 2**20:.1f} MiB)" in capsys.readouterr().out


def test_a_library_failing_over_the_loopback_store_leaves_no_traceback_on_stderr(
    tiny_plate: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from cropbench.data.training import training_format
    from cropbench.measure.store_emulation import unavailable
    from cropbench.metrics import REMOTE_SKIP_REASON
    from cropbench.tracks.formats import remote_epochs

    if unavailable() is not None:
        pytest.skip(unavailable() or "")
    if "litdata" not in AVAILABLE:
        pytest.skip(TRAINING_FORMATS["litdata"].available() or "")
    done = convert_crops(
        RunContext(plate=tiny_plate), tmp_path / "litdata", "litdata", crop_size=32, shard_bytes=200_000
    )
    comparison = dataclasses.replace(TINY, formats=("litdata",), epochs=1, remote_latency_ms=1)
    capfd.readouterr()
    row = remote_epochs(training_format("litdata"), done.path, done.info.plate_name, comparison, done.info.count)
    assert "Traceback" not in capfd.readouterr().err  # litdata printed its prefetch thread's traceback there
    if REMOTE_SKIP_REASON in row:  # litdata refuses the plain-http loopback store in one line
        assert "\n" not in row[REMOTE_SKIP_REASON]


def test_compare_formats_onto_a_disk_too_small_is_one_line_before_anything_runs(
    tiny_plate: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    from cropbench.cli import main

    if "hdf5" not in AVAILABLE:
        pytest.skip(TRAINING_FORMATS["hdf5"].available() or "")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(2**30, 2**30, 2**10))  # type: ignore[attr-defined]
    assert main(compare_formats(tiny_plate, tmp_path, "--work", str(tmp_path / "work"))) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("cropbench: error: cannot write crop stores under") and "[Errno 28]" in error
    assert "\n" not in error and not (tmp_path / "out").exists() and not (tmp_path / "work").exists()


@pytest.mark.parametrize("keep", [False, True])
def test_ctrl_c_while_rechunking_is_one_line_and_leaves_no_scratch(
    keep: bool, tiny_plate: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cropbench.cli import main
    from cropbench.plates import convert

    def interrupted(plate: Path, layout: Any) -> int:
        assert ".partial" in str(plate) and plate.is_dir(), f"the plate is being written, not {plate}"
        raise KeyboardInterrupt

    monkeypatch.setattr(convert, "write_crop_atlas", interrupted)
    work = tmp_path / "work"
    work.mkdir()
    args = compare_formats(tiny_plate, tmp_path, "--work", str(work), "--rechunk", "atlas", "--format", "hdf5")
    assert main([*args, *(["--keep"] if keep else [])]) == 130
    said = capsys.readouterr().err.strip().splitlines()  # after a line per format not installed, if any
    assert said[-1] == "cropbench: interrupted; every finished row is kept"
    assert all(line.startswith("cropbench: skipping ") for line in said[:-1]), said
    assert list(work.iterdir()) == []
