"""The time a run has left: priors from what each case reads and computes, scaled by what finished cases took."""

from __future__ import annotations

import pytest

from cropbench.config import CropConfig
from cropbench.data.loader import LoaderSpec
from cropbench.harness.dataset_case import DatasetCase
from cropbench.harness.loader_case import LoaderCase
from cropbench.harness.time_left import TimeLeft, baseline, prior_seconds
from cropbench.tracks.training.cases import TrainingCase
from cropbench.tracks.training.search import WorkerSearch


def test_priors_follow_what_a_case_reads_and_computes() -> None:
    direct, zarr = DatasetCase(crop=CropConfig(decode="direct")), DatasetCase(crop=CropConfig(decode="zarr"))
    assert prior_seconds(zarr) > 2 * prior_seconds(direct)
    assert prior_seconds(DatasetCase(samples=2000)) > prior_seconds(DatasetCase(samples=1000))
    loader = LoaderCase(epochs=2)
    assert prior_seconds(LoaderCase(epochs=4)) > prior_seconds(loader)
    forkserver = LoaderCase(loader=LoaderSpec(num_workers=2, start_method="forkserver"))
    assert prior_seconds(forkserver) > prior_seconds(LoaderCase(loader=LoaderSpec(num_workers=2)))
    resnet, small = TrainingCase(model="resnet18"), TrainingCase(model="smallcnn")
    assert prior_seconds(resnet) > prior_seconds(small)
    assert prior_seconds(WorkerSearch(small, (0, 1, 2))) == pytest.approx(3 * prior_seconds(small))
    assert prior_seconds(object()) > 0


def test_a_shared_baseline_is_counted_once() -> None:
    first = baseline(TrainingCase(model="resnet18", loader=LoaderSpec(num_workers=0)))
    again = baseline(TrainingCase(model="resnet18", loader=LoaderSpec(num_workers=2)))
    assert first is not None and again is not None and first[0] == again[0] and first[1] > 0
    assert baseline(DatasetCase()) is None
    cases = [("training", TrainingCase(loader=LoaderSpec(num_workers=w))) for w in (0, 2)]
    planned = TimeLeft(cases).planned
    assert planned[0][1] == pytest.approx(planned[1][1] + first[1], rel=0.2)


def test_the_estimate_scales_the_priors_by_what_finished_cases_took() -> None:
    cases = [("dataset", DatasetCase(seed=i)) for i in range(40)]
    left = TimeLeft(cases)
    assert left.seconds() is None, "nothing measured yet, nothing to say"
    prior = left.planned[0][1]
    for _ in range(20):
        left.finish(2 * prior)  # a machine twice as slow as the priors
    estimate = left.seconds()
    assert estimate is not None and 1.6 * 20 * prior < estimate <= 2 * 20 * prior
    for _ in range(20):
        left.finish(2 * prior)
    assert left.seconds() == 0.0


def test_a_tracks_own_scale_wins_once_it_has_enough_behind_it() -> None:
    cases = [("dataset", DatasetCase(seed=i)) for i in range(200)] + [
        ("loader", LoaderCase(seed=i)) for i in range(600)
    ]
    left = TimeLeft(cases)
    for _ in range(200):
        left.finish(left.planned[left.finished][1])  # the dataset track as its priors say
    for _ in range(500):
        left.finish(3 * left.planned[left.finished][1])  # the loader track three times slower
    assert left.scale("loader/direct") == pytest.approx(3.0, rel=0.15)
    assert left.scale("dataset/direct") < 1.5, "a track measured at its priors stays near them"


def test_the_bar_counts_a_case_down_and_takes_one_past_its_estimate_as_halfway(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cropbench.cli import progress

    now = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    bar = progress.ProgressBar(False, "cases")
    bar.left = (100.0, 10.0, now[0])  # 100 s left, 10 s of them the case now running
    now[0] += 4.0
    assert bar._postfix() == "about 01:36 left"  # 90 s after it, 6 s of it
    now[0] += 36.0
    assert bar._postfix() == "about 01:50 left", "40 s into a 10 s case: 20 s more taken to remain"
