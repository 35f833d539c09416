"""The compare-formats files: the table as text and the figure, from rows made by hand and from a tiny run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib import colors
from matplotlib import image as mpimg

from cropbench import api
from cropbench import metrics as m
from cropbench.data.training import TRAINING_FORMATS
from cropbench.metrics import (
    BREAK_EVEN_EPOCHS,
    CONVERSION_SECONDS,
    CONVERTING_PAYS_OFF,
    INTERLEAVED,
    RANDOM,
    REMOTE,
    REMOTE_SKIP_REASON,
    SHUFFLED,
    SIZE_RATIO_TO_PLATE,
)
from cropbench.records import Record
from cropbench.report.formats_figure import FIGURE_NAME, TABLE_NAME, formats_figure, why_no_bar, write_formats_report
from cropbench.report.plots import FLAGGED_COLOR
from cropbench.tracks.formats import FormatComparison, Formats


def row(case: str, **metrics: Any) -> Record:
    return Record(track="formats", case=case, config={"reader": case}, metrics=metrics, environment={})


IN_PLACE = row(
    "ome-zarr/direct",
    **{
        m.prefixed(RANDOM, m.SAMPLES_PER_S): 900.0,
        m.prefixed(SHUFFLED, m.SAMPLES_PER_S): 800.0,
        m.prefixed(REMOTE, m.SAMPLES_PER_S): 300.0,
        m.INJECTED_LATENCY_MS: 20.0,
    },
)
CONVERTED = row(
    "hdf5",
    **{
        CONVERSION_SECONDS: 12.0,
        SIZE_RATIO_TO_PLATE: 0.7,
        m.prefixed(RANDOM, m.SAMPLES_PER_S): 2000.0,
        m.prefixed(SHUFFLED, m.SAMPLES_PER_S): 1500.0,
        CONVERTING_PAYS_OFF: True,
        BREAK_EVEN_EPOCHS: 3.5,
        m.prefixed(INTERLEAVED, CONVERTING_PAYS_OFF): False,
        REMOTE_SKIP_REASON: "h5py reads local files",
    },
)
STREAMED = row(
    "webdataset",
    **{
        CONVERSION_SECONDS: 15.0,
        SIZE_RATIO_TO_PLATE: 1.2,
        m.prefixed(SHUFFLED, m.SAMPLES_PER_S): 1800.0,
        m.prefixed(REMOTE, m.SAMPLES_PER_S): 1200.0,
        m.prefixed(REMOTE, CONVERTING_PAYS_OFF): True,
        m.prefixed(REMOTE, BREAK_EVEN_EPOCHS): 2.0,
    },
)
SKIPPED = row("mds", **{m.SKIPPED: True, m.SKIP_REASON: "format 'mds' needs mosaicml-streaming"})


def test_a_reader_without_a_bar_says_why() -> None:
    assert why_no_bar(IN_PLACE, CONVERSION_SECONDS) == "reads in place"
    assert why_no_bar(IN_PLACE, BREAK_EVEN_EPOCHS) == "reads in place"
    assert why_no_bar(STREAMED, m.prefixed(RANDOM, m.SAMPLES_PER_S)) == "no random access"
    assert why_no_bar(CONVERTED, m.prefixed(INTERLEAVED, BREAK_EVEN_EPOCHS)) == "never pays off"
    assert why_no_bar(CONVERTED, m.prefixed(REMOTE, m.SAMPLES_PER_S)) == "not read over the store"
    assert why_no_bar(SKIPPED, m.prefixed(SHUFFLED, m.SAMPLES_PER_S)) == "skipped"


def flagged_pixels(path: Path) -> int:
    """Pixels in the flagged rows' grey."""
    pixels = mpimg.imread(path)[..., :3]
    grey = np.array(colors.to_rgb(FLAGGED_COLOR))
    return int(np.all(np.abs(pixels - grey) < 0.02, axis=-1).sum())


def test_the_figure_draws_every_reader_and_greys_flagged_rows(tmp_path: Path) -> None:
    rows = [IN_PLACE, CONVERTED, STREAMED, SKIPPED]
    plain = formats_figure(rows, tmp_path / "plain.png")
    assert plain == tmp_path / "plain.png" and plain.stat().st_size > 0
    flagged = [IN_PLACE, row(CONVERTED.case, **{**CONVERTED.metrics, m.VALIDITY_FLAGS: ["noisy"]}), STREAMED, SKIPPED]
    marked = formats_figure(flagged, tmp_path / "flagged.png")
    assert marked is not None
    assert flagged_pixels(marked) > flagged_pixels(plain) + 100  # hdf5's bars drawn grey
    assert formats_figure([Record("dataset", "x", {}, {}, {})], tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_a_tiny_run_writes_the_table_and_the_figure_beside_its_rows(tiny_plate: Path, tmp_path: Path) -> None:
    formats = tuple(name for name in ("hdf5", "webdataset") if TRAINING_FORMATS[name].available() is None)
    if not formats:
        pytest.skip("neither h5py nor webdataset is installed")
    comparison = FormatComparison(formats=formats, crop_size=32, samples=10, warmup=0, repeats=1, workers=0, epochs=1)
    out = tmp_path / "out"
    records = api.run(tiny_plate, [Formats(comparison, tmp_path / "work")], out_dir=out)
    written = write_formats_report(records, out)
    assert written == [out / TABLE_NAME, out / FIGURE_NAME]
    table = (out / TABLE_NAME).read_text()
    assert table.startswith("convert or read in place") and all(name in table for name in formats)
    assert mpimg.imread(out / FIGURE_NAME).shape[0] > 100
