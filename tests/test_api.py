"""cropbench.run: the one runner behind the CLI; --objects reaches every track; resume keys on case identity."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_SPEC

import cropbench
from cropbench import api
from cropbench import metrics as m
from cropbench.cli import main
from cropbench.config import DEFAULT_CHUNK_CACHE_BYTES, LAYOUTS, CropConfig, CropOverrides
from cropbench.harness.context import RunContext
from cropbench.harness.runner import Row
from cropbench.objects import OBJECT_TABLE_NAME, read_object_table
from cropbench.plates.generate import generate_plate
from cropbench.records import Record, read_records


@dataclass(frozen=True)
class CountCase:
    samples: int
    seed: int = 0

    @property
    def label(self) -> str:
        return "count"


class Counting:
    """A track that measures nothing and counts the cases it was asked to measure."""

    name = "count"

    def __init__(self) -> None:
        self.measured: list[tuple[Path, int]] = []

    def cases(self, preset: str, context: RunContext) -> list[CountCase]:
        return [CountCase(samples=context.samples or 10)]

    def decode(self, case: CountCase) -> None:
        return None

    def measure(self, case: CountCase, repeat: int, context: RunContext) -> Iterator[Row]:
        self.measured.append((context.plate, repeat))
        yield Row(case, dataclasses.asdict(case), {m.SAMPLES_PER_S: 1.0}, case.seed + repeat)


def _count(plate: Path, out: Path, **options: Any) -> int:
    track = Counting()
    cropbench.run(plate, [track], out_dir=out, resume=True, **options)
    return len(track.measured)


def test_resume_skips_the_same_case_and_measures_another_plate_layout_or_sample_count(
    tiny_plate: Path,
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    assert _count(tiny_plate, out, repeats=2) == 2
    assert _count(tiny_plate, out, repeats=2) == 0, "same config, plate and layout: nothing to do"
    copy = tmp_path / "copy.zarr"
    shutil.copytree(tiny_plate, copy)
    assert _count(copy, out) == 0, "a copy of the plate is the same plate"
    assert _count(tiny_plate, out, samples=5) == 1
    other = generate_plate(
        tmp_path / "other.zarr", dataclasses.replace(TINY_SPEC, seed=8), LAYOUTS["default"], progress=False
    ).path
    assert _count(other, out) == 1
    assert _count(tiny_plate, out, layout="tiles", layout_dir=tmp_path / "layouts") == 1
    records = read_records(out / "results.jsonl")
    assert len(records) == 5 and len({r.case_id for r in records}) == 4 and all(r.case == "count" for r in records)
    assert {r.config["layout"] for r in records} == {LAYOUTS["default"].label, LAYOUTS["tiles"].label}


def test_progress_callback_sees_messages_and_each_record(tiny_plate: Path) -> None:
    seen: list[tuple[str, Record | None]] = []
    records = cropbench.run(tiny_plate, [Counting()], repeats=2, progress=lambda message, r: seen.append((message, r)))
    assert [r for _, r in seen if r is not None] == records and len(records) == 2
    assert any(r is None and "repeat 1" in message for message, r in seen)


@pytest.mark.slow
def test_objects_reach_tracks_2_and_3_on_a_plate_without_a_bundled_table(tiny_plate: Path, tmp_path: Path) -> None:
    plate = tmp_path / "bare.zarr"
    shutil.copytree(tiny_plate, plate)
    table = tmp_path / "cells.parquet"
    (plate / OBJECT_TABLE_NAME).rename(table)
    out = tmp_path / "out"
    code = main(
        [
            "run",
            "--plate",
            str(plate),
            "--objects",
            str(table),
            "--track",
            "2",
            "--track",
            "3",
            "--samples",
            "64",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    records = read_records(out / "results.jsonl")
    assert {r.track for r in records} == {"loader", "training"}
    assert {r.metrics[m.OBJECTS] for r in records if m.OBJECTS in r.metrics} == {len(read_object_table(table))}
    without = ["run", "--plate", str(plate), "--track", "2", "--out", str(tmp_path / "without"), "--no-progress"]
    assert main(without) == 2, "the plate has no table of its own"


def test_smoke_generates_its_plate_once_then_runs_every_track(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    generated: list[Path] = []
    runs: list[tuple[Any, ...]] = []

    def fake_generate(path: Path, *args: Any, **kwargs: Any) -> str:
        path.mkdir(parents=True, exist_ok=True)
        generated.append(path)
        return "plate"

    monkeypatch.setattr(api, "generate_plate", fake_generate)
    monkeypatch.setattr(api, "run", lambda *args, **kwargs: runs.append(args) or [])
    first = api.smoke(tmp_path)
    again = api.smoke(tmp_path)
    forced = api.smoke(tmp_path, force=True)
    assert first.generated == "plate" and again.generated is None and forced.generated == "plate"
    assert generated == [tmp_path / api.SMOKE_PLATE] * 2
    assert runs == [(tmp_path / api.SMOKE_PLATE, api.SMOKE_TRACKS, "smoke", tmp_path)] * 3


@dataclass(frozen=True)
class CropCase:
    crop: CropConfig
    seed: int = 0

    @property
    def label(self) -> str:
        return f"{self.crop.decode_threads}/{self.crop.chunk_cache_bytes}/{self.crop.tier}"


class Crops(Counting):
    """Cases that differ in the knobs a preset sets; records the crops it was asked to measure."""

    name = "crops"

    def __init__(self) -> None:
        super().__init__()
        self.crops: list[CropConfig] = []

    def cases(self, preset: str, context: RunContext) -> list[CropCase]:  # type: ignore[override]
        return [
            CropCase(CropConfig(decode_threads=1)),
            CropCase(CropConfig(decode_threads=2)),
            CropCase(CropConfig(tier="typical")),
        ]

    def measure(self, case: CropCase, repeat: int, context: RunContext) -> Iterator[Row]:  # type: ignore[override]
        self.crops.append(case.crop)
        yield Row(case, dataclasses.asdict(case), {m.SAMPLES_PER_S: 1.0}, case.seed + repeat)


def test_overrides_reach_every_case_and_cases_they_make_identical_run_once(tiny_plate: Path) -> None:
    track = Crops()
    records = cropbench.run(tiny_plate, [track], overrides=CropOverrides(decode_threads=3, chunk_cache_bytes=2**20))
    assert [(c.decode_threads, c.chunk_cache_bytes) for c in track.crops] == [(3, 2**20), (3, 2**20)]
    assert [r.config["crop"]["decode_threads"] for r in records] == [3, 3]
    track = Crops()
    seen: list[str] = []
    cropbench.run(tiny_plate, [track], overrides=CropOverrides(dtype="uint16"), progress=lambda s, r: seen.append(s))
    assert [c.dtype for c in track.crops] == ["uint16", "uint16"], "uint16 with tier typical is not a valid crop"
    assert any("not run with the overrides" in message for message in seen)
    assert CropConfig().chunk_cache_bytes == DEFAULT_CHUNK_CACHE_BYTES


def test_the_command_line_sets_every_crop_knob(capsys: pytest.CaptureFixture[str]) -> None:
    from cropbench.cli import build_parser
    from cropbench.cli.runs import _crop_overrides

    argv = ["run", "--plate", "p", "--decode-threads", "2", "--chunk-cache-bytes", "1024", "--crop-size", "64"]
    args = build_parser().parse_args([*argv, "--decode", "zarr", "--dtype", "bfloat16", "--tier", "light"])
    assert _crop_overrides(args) == CropOverrides(64, "zarr", "bfloat16", "light", 1024, 2)
    with pytest.raises(SystemExit) as stop:
        main(["run", "--plate", "missing.zarr", "--decode-threads", "0", "--no-progress"])
    assert stop.value.code == 2
    assert "argument --decode-threads: expected a whole number of at least 1, got '0'" in capsys.readouterr().err


def test_a_preset_one_of_the_tracks_lacks_is_refused_before_any_case_runs(
    tiny_plate: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """'grid' is Track 1's alone: asked of Tracks 1 and 2 together, the run stops before Track 1's hours."""
    out = tmp_path / "out"
    code = main(
        ["run", "--plate", str(tiny_plate), "--track", "1", "--track", "2", "--preset", "grid"]
        + ["--out", str(out), "--no-progress"]
    )
    assert code == 2
    assert "preset='grid' is not one of" in capsys.readouterr().err
    results = out / "results.jsonl"
    assert not results.exists() or read_records(results) == [], "no case ran"
