"""Figures from a results file: one command draws them, with the expected panels and units."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from matplotlib.colors import to_hex
from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from cropbench import metrics as m
from cropbench.cli import main
from cropbench.errors import OutputError
from cropbench.harness.flags import decide
from cropbench.records import Record, RecordWriter
from cropbench.report import plots


def _on_save(monkeypatch: pytest.MonkeyPatch, seen: Callable[[Figure, Path], None]) -> None:
    """Hand every figure to ``seen`` as it is saved, whichever figure module draws it."""
    savefig = Figure.savefig

    def spy(figure: Figure, path: Any, *args: Any, **kwargs: Any) -> None:
        seen(figure, Path(path))
        savefig(figure, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)


def _track2(workers: int, batch: int, rate: float, case_suffix: str = "") -> Record:
    metrics = {
        "samples_per_s": rate,
        "run_samples_per_s": 0.7 * rate,
        "first_batch_ms": 20.0 + 40 * workers,
        "epoch2_first_batch_ms": 5.0 + 30 * workers,
    }
    return Record(
        track="loader",
        case=f"plate/random/direct/none/float32/w{workers}/b{batch}{case_suffix}",
        config={"loader": {"num_workers": workers, "batch_size": batch}},
        metrics=metrics,
        environment={},
    )


def _track3(case: str, step_ms: float, compute_ms: float, wait: float) -> Record:
    metrics = {
        "step_p50_ms": step_ms,
        "compute_only_step_p50_ms": compute_ms,
        "data_wait_fraction": wait,
        "stall_crosscheck": 1 - compute_ms / step_ms,
    }
    return Record(track="training", case=case, config={}, metrics=metrics, environment={})


def _records() -> list[Record]:
    rows = [_track2(w, b, 1000.0 * (w + 1) * b / 16) for b in (16, 64) for w in (0, 1, 2)]
    rows.append(_track2(2, 64, 5000.0, "/persistent"))
    rows += [
        _track3("resnet18/train/direct/light/float32/w0/b16/pin/amp-off/auto", 400.0, 398.0, 0.01),
        _track3("emulated40ms/train/direct/light/float32/w0/b64/pin/amp-off/auto", 50.0, 40.0, 0.2),
        _track3("emulated40ms/train/direct/light/float32/w1/b64/pin/amp-off/auto", 43.0, 40.0, 0.07),
    ]
    search = {
        "tried_workers": [0, 1],
        "data_wait_fraction_by_workers": [0.2, 0.07],
        "min_workers": 1,
        "images_per_s_by_workers": [1280.0, 1490.0],
        "compute_only_images_per_s": 1600.0,
    }
    rows.append(
        Record(
            track="training",
            case="emulated40ms/train/direct/light/float32/w*/b64/pin/amp-off/auto/min-workers",
            config={},
            metrics=search,
            environment={},
        )
    )
    return rows


def test_plot_command_draws_track2_and_track3_figures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = tmp_path / "results.jsonl"
    with RecordWriter(results) as writer:
        for record in _records():
            writer.write(record)
    titles: dict[str, list[str]] = {}

    def spy(figure: Figure, path: Path) -> None:
        titles[path.name] = [axis.get_title() for axis in figure.axes if axis.get_visible()]
        labels = [axis.get_xlabel() + axis.get_ylabel() for axis in figure.axes if axis.get_visible()]
        assert all(labels), f"{path.name} has an axis without a label"

    _on_save(monkeypatch, spy)
    assert main(["plot", str(results), "--out", str(tmp_path / "figures")]) == 0
    expected = {
        "track2_workers_scaling.png": ["Track 2 samples/s vs num_workers (higher is better)"],
        "track2_first_batch.png": ["Track 2 first-batch latency (lower is better)"],
        "track3_step_and_wait.png": [
            "Track 3 step time p50 (lower is better)",
            "Track 3 data-wait fraction (lower is better)",
        ],
        "track3_workers.png": [
            "Track 3 data wait vs num_workers (lower is better)",
            "Track 3 images/s vs num_workers (higher is better)",
        ],
    }
    for name, panels in expected.items():
        path = tmp_path / "figures" / name
        assert path.is_file() and path.stat().st_size > 10_000, name
        assert all(any(title.startswith(panel) for title in titles[name]) for panel in panels), titles[name]
    assert len(titles["track2_workers_scaling.png"]) == 1, "the persistent row is not a sweep of its own"


def test_figures_show_the_latest_run_unless_all_runs_are_asked_for(tmp_path: Path) -> None:
    first = [dataclasses.replace(r, run_id="run-one") for r in _records()]
    second = [dataclasses.replace(r, run_id="run-two") for r in _records() if r.track == "loader"]
    latest = plots.latest_runs(first + second)
    assert {r.run_id for r in latest if r.track == "loader"} == {"run-two"}
    assert {r.run_id for r in latest if r.track == "training"} == {"run-one"}, "each track keeps its own latest run"
    overlaid = plots.label_runs(first + second)
    assert all(r.case.endswith(f"[run {r.run_id}]") and r.config["run"] == r.run_id for r in overlaid)
    assert plots.label_runs(first) == first, "one run needs no label"
    assert "track2_workers_scaling.png" in {p.name for p in plots.plot_results(first + second, tmp_path, True)}


def test_warmup_settles_where_the_rolling_median_stays_near_steady_state() -> None:
    curve = [9.0, 8.0, 7.0, 6.0, 5.0, 1.1, 1.0, 0.9, 1.2, 1.0, 1.1, 1.0, 0.9, 1.0]
    assert plots.steady_from(curve, steady_p50=1.0) == 8
    assert plots.steady_from([9.0] * 10, steady_p50=1.0) is None
    assert list(plots.rolling_median([3.0, 1.0, 2.0], window=2)) == [3.0, 2.0, 1.5]


def test_figures_are_skipped_without_their_rows(tmp_path: Path) -> None:
    only_track2 = [r for r in _records() if r.track == "loader"]
    names = {path.name for path in plots.plot_results(only_track2, tmp_path)}
    assert names == {"track2_workers_scaling.png", "track2_first_batch.png"}
    with pytest.raises(OutputError):
        plots.plot_results([], tmp_path)


def test_rows_without_metrics_are_left_out_with_a_warning_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unmeasured = [
        Record(track="dataset", case="random/direct/none/96px/all/float32", config={}, metrics={}, environment={}),
        Record(
            track="dataset",
            case="random/zarr/none/96px/all/float32",
            config={},
            metrics={"p95_ms": 1.0},
            environment={},
        ),
        Record(track="training", case="smallcnn/train", config={}, metrics={"objects": 5}, environment={}),
    ]
    results = tmp_path / "results.jsonl"
    with RecordWriter(results) as writer:
        for record in [*_records(), *unmeasured]:
            writer.write(record)
    with pytest.warns(UserWarning) as warned:
        assert main(["plot", str(results), "--out", str(tmp_path / "figures")]) == 0
    messages = sorted(str(warning.message) for warning in warned)
    assert messages[0].startswith("1 track training row") and messages[1].startswith("2 track dataset rows"), messages
    assert (tmp_path / "figures" / "track3_step_and_wait.png").is_file()
    only_unmeasured = tmp_path / "unmeasured.jsonl"
    with RecordWriter(only_unmeasured) as writer:
        for record in unmeasured:
            writer.write(record)
    capsys.readouterr()
    with pytest.warns(UserWarning):
        assert main(["plot", str(only_unmeasured), "--out", str(tmp_path / "none")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("cropbench: error:") and "\n" not in error, error


def test_sweep_key_drops_workers_batch_and_seed_only() -> None:
    config = {
        "source": "plate",
        "seed": 1,
        "crop": {"decode": "direct"},
        "loader": {"num_workers": 2, "batch_size": 64, "persistent_workers": True},
    }
    other = {**config, "seed": 2, "loader": {**config["loader"], "num_workers": 0, "batch_size": 16}}
    assert plots.sweep_key(config) == plots.sweep_key(other)
    assert plots.sweep_key(config) != plots.sweep_key({**config, "crop": {"decode": "zarr"}})
    assert plots.describe_loading(config) == "plate/direct/persistent_workers=True"


def test_the_cdf_marks_batch_rows_as_latency_per_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def row(case: str, calls: int) -> Record:
        metrics = {"quantiles_ms": [0.1, 0.2, 0.4, 0.9], "items_per_call": calls}
        return Record(track="dataset", case=case, config={}, metrics=metrics, environment={})

    styles: dict[str, str] = {}

    def keep_styles(figure: Figure, target: Path) -> None:
        styles.update({line.get_label(): line.get_linestyle() for line in figure.axes[0].get_lines()})

    _on_save(monkeypatch, keep_styles)
    path = plots.track1_cdf([row("random/direct", 1), row("batch/direct", 32)], tmp_path)
    assert path is not None and path.is_file()
    assert styles == {"random/direct": "-", "batch/direct [latency per call of 32]": "--"}


def _every_kind_of_bar() -> list[Record]:
    """Rows for every figure that draws bars, a flagged row among each track's."""

    def record(track: str, case: str, config: dict[str, object], **metrics: object) -> Record:
        return Record(track=track, case=case, config=config, metrics=metrics, environment={})

    rows = [
        record("dataset", "random/direct", {}, p95_ms=0.4, samples_per_s=305.0, validity_flags=[]),
        record("dataset", "random/zarr", {}, p95_ms=0.2, samples_per_s=124.0, validity_flags=["few-samples"]),
        record(
            "layouts",
            "memmap",
            {"layout_name": "memmap"},
            **{m.access_crops_per_s_key("random"): 9000.0},
            stored_bytes=2e6,
        ),
        record(
            "layouts", "zarr", {"layout_name": "zarr"}, **{m.access_crops_per_s_key("random"): 900.0}, stored_bytes=1e6
        ),
        record("peers", "cropbench-direct", {"peer": "cropbench-direct", "kind": "cropbench"}, samples_per_s=2000.0),
        record("peers", "dask-per-crop", {"peer": "dask-per-crop", "kind": "peer"}, samples_per_s=20.0),
    ]
    track2 = [r for r in _records() if r.track == "loader"]
    rows += [dataclasses.replace(track2[0], metrics={**track2[0].metrics, "validity_flags": ["re-reads"]}), *track2[1:]]
    step = {"step_p50_ms": 1356.0, "compute_only_step_p50_ms": 1701.0, "data_wait_fraction": 0.01}
    rows.append(record("training", "resnet18/train", {}, **step, stall_crosscheck=0.01, validity_flags=["impossible"]))
    rows.append(
        record(
            "training", "smallcnn/train", {}, step_p50_ms=50.0, compute_only_step_p50_ms=40.0, data_wait_fraction=0.2
        )
    )
    return rows


def _drawn(records: list[Record], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Figure]:
    figures: dict[str, Figure] = {}

    def keep(figure: Figure, path: Path) -> None:
        figures[path.name] = figure

    _on_save(monkeypatch, keep)
    plots.plot_results(records, tmp_path)
    return figures


def test_bars_lie_on_linear_axes_from_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    figures = _drawn(_every_kind_of_bar(), tmp_path, monkeypatch)
    with_bars = {
        (name, axis.get_title()): axis
        for name, figure in figures.items()
        for axis in figure.axes
        if any(isinstance(container, BarContainer) for container in axis.containers)
    }
    expected = {"track1_latency_throughput.png", "layouts_comparison.png", "peers_comparison.png"}
    expected |= {"track2_first_batch.png", "track3_step_and_wait.png"}
    assert {name for name, _ in with_bars} == expected
    for (name, title), axis in with_bars.items():
        assert axis.get_xscale() == "linear" and axis.get_xlim()[0] == 0, (name, title)
    throughput = figures["track1_latency_throughput.png"].axes[1]
    lengths = sorted(bar.get_width() for bar in throughput.patches if isinstance(bar, Rectangle))[-2:]
    assert lengths == [124.0, 305.0], "bar lengths are the numbers themselves"


def test_every_figure_draws_flagged_rows_the_same_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    figures = _drawn(_every_kind_of_bar(), tmp_path, monkeypatch)
    for name in ("track1_latency_throughput.png", "track3_step_and_wait.png", "track2_first_batch.png"):
        figure = figures[name]
        legends = [*figure.legends, *(axis.get_legend() for axis in figure.axes if axis.get_legend())]
        notes = [text.get_text() for legend in legends for text in legend.get_texts()]
        assert plots.FLAGGED_NOTE in notes, name
    track1, track3 = figures["track1_latency_throughput.png"], figures["track3_step_and_wait.png"]
    for figure, flagged_label in ((track1, "random/zarr"), (track3, "resnet18/train")):
        axis = figure.axes[0]
        labels = [tick.get_text() for tick in axis.get_yticklabels()]
        bars = [bar for container in axis.containers for bar in container.patches]
        by_row = {labels[round(bar.get_y() + bar.get_height() / 2)]: bar for bar in bars}
        for label, bar in by_row.items():
            grey = to_hex(bar.get_facecolor()) == to_hex(plots.FLAGGED_COLOR)
            assert grey == (label == flagged_label) == (bar.get_hatch() == plots.FLAGGED_HATCH), label


def test_a_worker_search_greys_the_points_whose_own_rows_are_flagged() -> None:
    shared = {"plate": "p.zarr", "layout": "default", "threads": {"torch_threads": 1}}
    case = {"model": "emulated", "steps": 10, "seed": 0, "loader": {"batch_size": 64, "num_workers": 0}}

    def point(workers: int, flags: list[str], **changes: object) -> Record:
        config = {**shared, **case, "loader": {"batch_size": 64, "num_workers": workers}, **changes}
        metrics = {"data_wait_fraction": 0.2, "validity_flags": flags}
        return Record(track="training", case=f"w{workers}", config=config, metrics=metrics, environment={}, run_id="r")

    search = Record(
        track="training",
        case="w*/min-workers",
        config={**shared, "case": case, "candidates": [0, 1, 2], "threshold": 0.1, "stop_early": True},
        metrics={"tried_workers": [0, 1, 2]},
        environment={},
        run_id="r",
    )
    rows = [point(0, ["re-reads"]), point(1, []), point(2, ["few-samples"], steps=12), point(1, ["x"], seed=5)]
    assert plots.flagged_workers(search, [search, *rows]) == {0, 2}, "another seed is another search"


def test_the_layouts_figure_draws_memmap_as_the_reference_not_a_ceiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figure = _drawn(_every_kind_of_bar(), tmp_path, monkeypatch)["layouts_comparison.png"]
    rates = figure.axes[0]
    label = rates.get_xlabel()
    assert "reference" in label and "ceiling" not in label, label
    dotted = [line.get_xdata()[0] for line in rates.get_lines() if line.get_linestyle() == ":"]
    assert dotted == [9000.0], "the dotted line is the memmap layout's rate"


def test_rows_of_tracks_without_figures_draw_nothing_and_raise_nothing(tmp_path: Path) -> None:
    rows = [
        Record(
            track="targets", case="random/direct-batched-1t", config={}, metrics={"crops_per_s": 5.0}, environment={}
        ),
        Record(track="remote", case="direct/w0/b32", config={}, metrics={"samples_per_s": 5.0}, environment={}),
    ]
    assert plots.plot_results(rows, tmp_path) == [] and not list(tmp_path.iterdir())


def test_a_track3_row_whose_wait_disagrees_with_its_crosscheck_is_drawn_flagged_not_fed() -> None:
    """1.7 % data wait against a 13.2 % cross-check was drawn as a green "fed" bar."""
    metrics = {
        m.STEP_P50_MS: 100.0,
        m.COMPUTE_ONLY_STEP_P50_MS: 90.0,
        m.DATA_WAIT_FRACTION: 0.017,
        m.STALL_CROSSCHECK: 0.132,
        m.VALIDITY_FLAGS: [],
    }
    row = Record(track="training", case="resnet18/amp-bf16", config={}, metrics=metrics, environment={})
    assert plots.flagged(decide(row)), "as the runner writes it"
    assert not plots.flagged(decide(dataclasses.replace(row, metrics={**metrics, m.STALL_CROSSCHECK: 0.03})))
