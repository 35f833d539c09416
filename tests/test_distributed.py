"""Many ranks: the samplers split an epoch exactly once, the aggregate row's arithmetic, and real
2-rank gloo jobs started by torch's launcher (Tracks 2 and 3, one writer, a rank that hangs or dies)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from cropbench.config import CropConfig, CropOverrides
from cropbench.data.dataset import CropDataset
from cropbench.data.distributed import ChunkLocalSampler, TorchDistributedSampler, per_rank, rank_sampler
from cropbench.data.loader import LoaderSpec
from cropbench.errors import ConfigError
from cropbench.harness.context import RunContext
from cropbench.harness.loader_case import LoaderCase
from cropbench.harness.ranks import Cluster, DistributedCase, DistributedTrack, RankReport, aggregate, distributed_cases
from cropbench.harness.runner import plan
from cropbench.records import read_records
from cropbench.tracks.dataset import Dataset
from cropbench.tracks.loader import Loader
from cropbench.tracks.training import Training, TrainingCase

#: Seconds the fault tests give a rank before the others give up on it.
RANK_TIMEOUT_S = 5
#: Whole-launch limit of a test job: generous, so only a hang (never a slow machine) reaches it.
JOB_LIMIT_S = 300


def _indices(sampler_of: object, world: int) -> list[np.ndarray]:
    """Each rank's epoch order, as every rank would send it to rank 0."""
    return [sampler_of(rank).order() for rank in range(world)]  # type: ignore[operator]


def _samplers(count: int, world: int, balance: str, epoch: int = 0) -> dict[str, list[np.ndarray]]:
    keys = np.repeat(np.arange(count // 3 + 1), 3)[:count]  # regions of 3 objects
    made = {
        "distributed": [TorchDistributedSampler(count, rank, world, seed=3, balance=balance) for rank in range(world)],
        "chunk-local": [ChunkLocalSampler(keys, rank, world, seed=3, balance=balance) for rank in range(world)],
    }
    for samplers in made.values():
        for sampler in samplers:
            sampler.set_epoch(epoch)
    return {name: [s.order() for s in samplers] for name, samplers in made.items()}


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("count", [24, 25, 31])
@pytest.mark.parametrize("balance", ["pad", "drop"])
def test_every_object_once_per_epoch_across_ranks(world: int, count: int, balance: str) -> None:
    for name, orders in _samplers(count, world, balance).items():
        share = per_rank(count, world, balance)
        assert [len(order) for order in orders] == [share] * world, name  # balanced
        seen = Counter(np.concatenate(orders).tolist())
        if balance == "pad":
            assert set(seen) == set(range(count)), name  # every object
            assert sum(seen.values()) - count == share * world - count, name  # only the stated padding repeats
        else:
            assert all(times == 1 for times in seen.values()), name  # none twice
            assert len(seen) == share * world, name  # only the stated remainder left out


def test_set_epoch_reshuffles_but_chunk_local_keeps_each_ranks_regions() -> None:
    first, second = _samplers(60, 2, "pad", epoch=0), _samplers(60, 2, "pad", epoch=1)
    for name in first:
        assert all(not np.array_equal(a, b) for a, b in zip(first[name], second[name], strict=True)), name
    for a, b in zip(first["chunk-local"], second["chunk-local"], strict=True):
        assert set(a.tolist()) == set(b.tolist())  # the same regions every epoch: its cache stays useful


def test_chunk_local_ranks_share_at_most_the_regions_at_their_cuts(tiny_plate: Path) -> None:
    dataset = CropDataset(tiny_plate, CropConfig(crop_size=32))
    keys = dataset.group_keys("chunk")
    for world in (2, 3):
        regions = [set(keys[rank_sampler(dataset, "chunk-local", r, world).order()].tolist()) for r in range(world)]
        shared = sum(len(a & b) for i, a in enumerate(regions) for b in regions[i + 1 :])
        assert shared <= world - 1
        torch_split = [set(keys[rank_sampler(dataset, "distributed", r, world).order()].tolist()) for r in range(world)]
        assert sum(len(a & b) for i, a in enumerate(torch_split) for b in torch_split[i + 1 :]) > shared


def test_sampler_arguments_are_checked() -> None:
    with pytest.raises(ConfigError, match="rank=2"):
        TorchDistributedSampler(10, rank=2, world=2)
    with pytest.raises(ConfigError, match="balance"):
        ChunkLocalSampler(np.zeros(10), 0, 2, balance="even")
    with pytest.raises(ConfigError, match="cannot give each of 4 ranks"):
        per_rank(3, 4, "drop")


def _report(
    rank: int, samples: int, seconds: float, wait: float, decoded: int | None, indices: list[int]
) -> RankReport:
    return RankReport(rank, "host", {}, {}, samples, seconds, wait, decoded, 100, np.array(indices), True)


def test_aggregate_row() -> None:
    reports = [
        _report(0, 10, 1.0, 1.0, 150, [0, 1, 2]),
        _report(1, 10, 2.0, 2.0, 250, [3, 4, 5]),
        _report(2, 10, 1.0, 1.5, 100, [6, 7, 7]),
    ]
    row = aggregate(reports, objects=8, balance="pad")
    assert row["total_samples_per_s"] == 30 / 2.0  # all samples over the slowest rank's loop
    assert (row["rank_samples_per_s_min"], row["rank_samples_per_s_max"]) == (5.0, 10.0)
    assert row["straggler_ratio"] == 2.0 / 1.5
    assert row["read_amplification"] == 500 / 300
    assert (row["covered_objects"], row["duplicate_samples"], row["padded_samples"]) == (8, 1, 1)
    assert row["exactly_once"] is False
    without_counters = aggregate([*reports[:2], _report(2, 10, 1.0, 1.5, None, [6, 7])], 8, "pad")
    assert without_counters["read_amplification"] is None and without_counters["exactly_once"] is True
    assert row["validity_flags"] == []


def test_the_job_row_carries_every_flag_of_its_ranks_rows() -> None:
    """A rank's rate that rests on too few batches makes the job's rate rest on them too."""
    reports = [_report(rank, 10, 1.0, 1.0, 100, [rank]) for rank in range(3)]
    reports[1].metrics["validity_flags"] = ["few-samples"]
    reports[2].metrics["validity_flags"] = ["re-reads", "few-samples"]
    assert aggregate(reports, objects=3, balance="pad")["validity_flags"] == ["few-samples", "re-reads"]


def test_cases_plan_one_rank_then_all_for_the_speed_up() -> None:
    loading = LoaderCase(crop=CropConfig(crop_size=32), loader=LoaderSpec(batch_size=16), samples=1000)
    cases = distributed_cases(loading, world=4)
    assert [(c.sampler, c.ranks) for c in cases] == [("distributed", 1), ("distributed", 4)] + [
        ("chunk-local", 1),
        ("chunk-local", 4),
    ]
    assert all(c.case == loading for c in cases)
    training = TrainingCase(crop=CropConfig(crop_size=32, tier="light"), loader=LoaderSpec(batch_size=16))
    assert {c.ranks for c in distributed_cases(training, world=2)} == {2}


class _Job:
    """What planning needs of a job: its size (no process group is joined)."""

    world_size = 2


def _planned(track: Any, context: RunContext, preset: str = "smoke") -> list[DistributedCase]:
    return [item.case for item in plan([DistributedTrack(track, cast(Cluster, _Job()))], preset, context)]


def _planned_inner(track: Any, context: RunContext, preset: str = "smoke") -> list[Any]:
    return [case.case for case in _planned(track, context, preset)]


@pytest.mark.parametrize("track", [Loader, Training], ids=["loader", "training"])
def test_ranks_run_the_presets_cases_with_the_runs_overrides(tiny_plate: Path, track: Any) -> None:
    """Under ranks a track plans its own preset (workers, batch sizes, models as the preset says) and the
    run's crop knobs reach every case, as on one process."""
    overrides = CropOverrides(crop_size=40, decode_threads=2, chunk_cache_bytes=12345)
    context = RunContext(tiny_plate, samples=128, overrides=overrides)
    inner = _planned_inner(track(), context)
    one_process = [item.case for item in plan([track()], "smoke", context)]
    expected = {(c.loader, c.crop) for c in one_process if track().on_ranks(c) is not None}
    assert inner and {(c.loader, c.crop) for c in inner} == expected
    assert all((c.crop.crop_size, c.crop.decode_threads, c.crop.chunk_cache_bytes) == (40, 2, 12345) for c in inner)
    if track is Loader:
        assert {c.loader.num_workers for c in inner} == {0, 1, 2} and {c.loader.batch_size for c in inner} == {16, 64}


def test_ranks_leave_out_what_does_not_split_and_refuse_tracks_that_cannot(tiny_plate: Path) -> None:
    said: list[str] = []
    context = RunContext(tiny_plate, samples=128, report=said.append)
    assert all(isinstance(c, TrainingCase) for c in _planned_inner(Training(), context))
    assert any("does not run across ranks" in line for line in said), "the worker search is left out, said so"
    with pytest.raises(ConfigError, match="does not run across ranks"):
        DistributedTrack(Dataset(), cast(Cluster, _Job()))


# Real jobs: torch's launcher, 2 ranks on gloo, a free rendezvous port each (--standalone).


def _launch(tmp_path: Path, script: str, ranks: int = 2) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(script))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", str(path)]
    return subprocess.run(command, capture_output=True, text=True, timeout=JOB_LIMIT_S, env=_environment())


def _environment() -> dict[str, str]:
    """This environment without a launcher's (the job's ranks get their own), one thread per rank."""
    environment = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return {**environment, "OMP_NUM_THREADS": "1"}


def _job(plate: Path, out: Path, tracks: str, extra: str = "", before: str = "") -> str:
    return f"""
        import os, sys, time
        import cropbench.tracks.loader as track2
        from cropbench.cli import main
        {before}
        sys.exit(main(["run", "--plate", {str(plate)!r}, "--out", {str(out)!r}, {tracks}, "--no-progress"{extra}]))
    """


def _lines(path: Path) -> list[dict[str, object]]:
    text = path.read_text()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.slow
def test_two_ranks_run_tracks_2_and_3_with_one_writer(tiny_plate: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    # --ranks 2: torch's elastic launcher, as torchrun --standalone --nproc-per-node 2.
    command = [sys.executable, "-m", "cropbench", "run", "--plate", str(tiny_plate), "--out", str(out), "--ranks", "2"]
    command += ["--track", "2", "--track", "3", "--samples", "128", "--no-progress"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=JOB_LIMIT_S, env=_environment())
    assert done.returncode == 0, done.stderr[-3000:]
    lines = _lines(out / "results.jsonl")  # every line whole: one writer
    keys = [(row["track"], row["case_id"], row["repeat"]) for row in lines]
    assert len(keys) == len(set(keys))  # and none twice
    # The preset's cases, each per sampler: a row per rank it ran on, then the aggregate.
    context = RunContext(tiny_plate, samples=128)
    expected = {
        name: sum(c.ranks + 1 for c in _planned(track(), context))
        for name, track in (("loader", Loader), ("training", Training))
    }
    assert Counter(row["track"] for row in lines) == expected
    records = read_records(out / "results.jsonl")
    aggregates = [r for r in records if "rank" not in r.config]
    ranks = [r for r in records if "rank" in r.config]
    assert {(r.config["rank"], r.config["backend"]) for r in ranks} == {(0, "gloo"), (1, "gloo")}
    assert all(r.config["host"] and r.config["world_size"] in (1, 2) for r in ranks)
    for row in aggregates:
        metrics = row.metrics
        assert metrics["covered_objects"] == metrics["objects"] > 0  # gathered indices of every rank
        if row.track == "loader":  # the first epoch: every object exactly once, padding stated
            assert metrics["exactly_once"] is (metrics["padded_samples"] == 0)
            assert metrics["duplicate_samples"] == metrics["padded_samples"]
        if row.config["loader"]["num_workers"] == 0:  # the decode counters are the ranks' own
            assert metrics["read_amplification"] > 0
        assert metrics["straggler_ratio"] >= 1.0
        assert len(metrics["rank_samples_per_s"]) == row.config["world_size"]
    two_ranks = [r for r in aggregates if r.track == "loader" and r.config["world_size"] == 2]
    assert two_ranks and all(r.metrics["speedup_over_one_rank"] > 0 for r in two_ranks)
    trained = [r for r in ranks if r.track == "training" and r.config["workload"] == "train"]
    assert trained and all(r.metrics["loss_last"] > 0 for r in trained if r.config["model"] != "emulated")


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["hang", "die"])
def test_a_rank_that_hangs_or_dies_fails_the_job_and_finished_rows_stay(
    tiny_plate: Path, tmp_path: Path, fault: str
) -> None:
    # Rank 1 measures first in the second case (the first runs on rank 0 alone): it hangs or dies there.
    act = "time.sleep(3600)" if fault == "hang" else "os._exit(7)"
    before = f"""
        real = track2.run_case
        def faulty(*args, **kwargs):
            if os.environ["RANK"] == "1":
                {act}
            return real(*args, **kwargs)
        track2.run_case = faulty
    """
    before = textwrap.indent(textwrap.dedent(before), " " * 8).strip()
    out = tmp_path / "out"
    script = _job(tiny_plate, out, '"--track", "2"', f', "--rank-timeout", "{RANK_TIMEOUT_S}"', before)
    done = _launch(tmp_path, script)
    assert done.returncode != 0
    lines = _lines(out / "results.jsonl")
    assert [row["config"]["world_size"] for row in lines] == [1, 1]  # the first case's rows, whole
    if fault == "hang":  # the others name the rank that did not arrive, and the timeout
        assert "cropbench: error: rank 0 of 2" in done.stderr and f"timeout_s={RANK_TIMEOUT_S}" in done.stderr
        assert "1" in done.stderr.split("cropbench: error:")[1]
    else:
        assert "exitcode" in done.stderr and "7" in done.stderr


@pytest.mark.parametrize("seconds", [float("inf"), 1e300, float("nan"), 0.0, -1.0])
def test_a_rank_timeout_outside_what_torch_accepts_is_a_config_error(seconds: float) -> None:
    from cropbench.harness.ranks import Cluster, check_timeout

    with pytest.raises(ConfigError, match=r"--rank-timeout .* got"):
        check_timeout(seconds)
    with pytest.raises(ConfigError, match=r"--rank-timeout"):
        Cluster(seconds)


@pytest.mark.parametrize(
    ("variable", "value"),
    [("WORLD_SIZE", "abc"), ("RANK", "1.5"), ("LOCAL_RANK", ""), ("WORLD_SIZE", "0"), ("RANK", "2")],
)
def test_a_launcher_variable_that_is_not_a_rank_is_a_distributed_error(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    from cropbench.errors import DistributedError
    from cropbench.harness.ranks import Cluster, launch_rank

    environment = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for name, setting in {**environment, variable: value}.items():
        monkeypatch.setenv(name, setting)
    with pytest.raises(DistributedError, match=rf"{variable}={value!r}"):
        Cluster(5.0)
    if variable == "RANK" and value == "1.5":
        with pytest.raises(DistributedError, match=r"RANK='1\.5'"):
            launch_rank()


def test_the_cli_refuses_an_infinite_rank_timeout_in_one_line(
    tiny_plate: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cropbench.cli import main

    for seconds in ("inf", "1e300"):
        code = main(
            ["run", "--plate", str(tiny_plate), "--out", str(tmp_path), "--rank-timeout", seconds, "--no-progress"]
        )
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and "--rank-timeout" in err[0], err
    assert not (tmp_path / "results.jsonl").exists()
