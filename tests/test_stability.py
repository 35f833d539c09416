"""Repeat summaries: median, interval, CV warning and the tail-percentile warning."""

from __future__ import annotations

import dataclasses

import pytest

from cropbench.records import Record
from cropbench.report.stability import bootstrap_median_interval, format_repeat_summary, summarise_repeats


def rows(values: list[float], case: str = "c", p99_reliable: bool = True) -> list[Record]:
    return [
        Record(
            track="dataset",
            case=case,
            config={},
            environment={},
            repeat=i,
            metrics={"samples_per_s": v, "p99_reliable": p99_reliable, "p95_reliable": True, "count": 300},
        )
        for i, v in enumerate(values)
    ]


def test_stable_repeats_have_no_warning_and_an_interval_around_the_median() -> None:
    (summary,) = summarise_repeats(rows([100.0, 101.0, 99.0, 100.5, 100.2]))
    assert summary.repeats == 5 and summary.median == pytest.approx(100.2)
    assert summary.ci_low <= summary.median <= summary.ci_high
    assert summary.cv < 0.05 and summary.warnings == ()


def test_one_repeat_has_no_interval_and_no_spread() -> None:
    (summary,) = summarise_repeats(rows([7897.9]))
    line = format_repeat_summary([summary]).splitlines()[1]
    assert "7,897.9" in line and "[" not in line and "%" not in line and "only 1 repeat" in line


def test_noisy_repeats_and_thin_tails_are_flagged() -> None:
    (summary,) = summarise_repeats(rows([100.0, 130.0, 80.0, 110.0, 95.0], p99_reliable=False))
    assert any(w.startswith("CV") for w in summary.warnings)
    assert any("p99 rests on 300 samples" in w for w in summary.warnings)
    assert "CV" in format_repeat_summary([summary])


def test_cases_are_summarised_separately_and_the_interval_is_seeded() -> None:
    summaries = summarise_repeats(rows([1.0, 2.0, 3.0], "a") + rows([10.0, 20.0, 30.0], "b"))
    assert [s.case for s in summaries] == ["a", "b"]
    assert bootstrap_median_interval([1.0, 5.0, 9.0, 2.0]) == bootstrap_median_interval([1.0, 5.0, 9.0, 2.0])


def test_repeats_of_one_label_on_different_plates_are_not_pooled() -> None:
    first = [dataclasses.replace(r, case_id="plate-a") for r in rows([1.0, 2.0, 3.0])]
    second = [dataclasses.replace(r, case_id="plate-b") for r in rows([10.0, 20.0, 30.0])]
    summaries = summarise_repeats(first + second)
    assert [(s.case, s.repeats, s.median) for s in summaries] == [("c", 3, 2.0), ("c", 3, 20.0)]
