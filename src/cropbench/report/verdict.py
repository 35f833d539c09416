"""The verdict: what a run answers, in a few lines a lab can act on.

Per track: the best configuration measured, its ratio to the ceiling measured in the same run (where
the track has one), and, in plain words from the rows' validity flags, why rows must not be quoted.
Rows are grouped by their config fields (repeats of one configuration differ only in their seed) and
each configuration is judged on the median over its repeats; a configuration is quotable when none
of its rows carries a flag. The best configuration is the best quotable one; when none is, the best
flagged one, said to be flagged.
"""

from __future__ import annotations

import json
import math
import textwrap
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cropbench import metrics as m
from cropbench.records import Record
from cropbench.report.flags import IMPOSSIBLE, row_flags
from cropbench.tracks.layouts import CEILING as MEMMAP_LAYOUT
from cropbench.tracks.validity import VALIDITY_FLAGS

#: Heading of the verdict block (the HTML report uses it too).
HEADING = "Verdict"
#: What the smoke preset's rows are for, said before any track.
SMOKE_NOTE = (
    "this run proves the pipeline: every track ran end to end on a plate sized to finish in minutes, "
    "not to measure; for numbers run --preset full (cropbench run --preset full on a plate larger "
    "than the reader's cache)"
)
#: Said where a track's best configuration has nothing in the run to be measured against.
NO_CEILING = "no ceiling in this run"
#: Each validity flag in plain words: why a row carrying it must not be quoted, and what to do.
PLAIN_REASONS: dict[str, str] = {
    "few-samples": "too few timings for a p95: run longer (--preset full, or more --samples)",
    "re-reads": "more crops drawn than the plate holds, so crops were read twice: use a larger plate",
    "cache>=plate": "the reader's cache holds the whole plate, so reads were cache hits: use a larger plate",
    "not-evicted": "the page cache could not be emptied before the cold pass: no cold numbers",
    "rate!=1/mean": "its two timing loops disagree: the machine was busy; run again on an idle machine",
    "impossible": "its numbers contradict each other (the compute-only baseline outlasted the whole loaded "
    "step): the machine's speed changed during the run; run again on an idle machine",
}
#: What each track measures, for the verdict's lines.
TRACK_TITLES: dict[str, str] = {
    "1": "Dataset __getitem__",
    "2": "DataLoader",
    "3": "training loop",
    "layouts": "storage layouts",
    "peers": "peer loaders",
}


@dataclass(frozen=True)
class Configuration:
    """The rows of one configuration (repeats differ only in their seed) and the flags any of them carries."""

    rows: tuple[Record, ...]
    flags: frozenset[str]

    @property
    def label(self) -> str:
        return self.rows[0].case

    @property
    def quotable(self) -> bool:
        return not self.flags

    def median(self, metric: str) -> float | None:
        """Median of ``metric`` over the rows that hold it as a finite number; None when none does."""
        values = [value for row in self.rows if (value := _finite(row.metrics.get(metric))) is not None]
        return float(np.median(values)) if values else None


@dataclass(frozen=True)
class Ceiling:
    """What a track's best configuration is measured against, measured in the same run."""

    name: str
    value: float


@dataclass(frozen=True)
class TrackVerdict:
    """One track's answer: its best configuration, the ceiling and ratio, and why rows are flagged."""

    track: str
    configurations: int
    quotable: int
    best: Configuration | None
    value: float | None
    unit: str
    ceiling: Ceiling | None
    ratio: float | None
    #: (flag, configurations carrying it), most frequent first.
    reasons: tuple[tuple[str, int], ...]
    #: Further answers of the track (Track 3: the fewest workers that keep the model fed).
    notes: tuple[str, ...] = ()
    #: Said instead of the ratio when there is none.
    ceiling_note: str = NO_CEILING


@dataclass(frozen=True)
class Verdict:
    """The whole run's answer, one :class:`TrackVerdict` per track in the order the rows came."""

    tracks: tuple[TrackVerdict, ...]
    preset: str | None = None

    def preamble(self) -> str | None:
        """What is said of the whole run before the tracks, if anything."""
        if self.preset == "smoke":
            return SMOKE_NOTE
        if self.tracks and not any(track.quotable for track in self.tracks):
            return "no row of this run is a measurement to quote (the reasons are under each track)"
        return None

    def lines(self) -> list[str]:
        """The verdict as text: a heading, then a few indented lines per track."""
        lines = [HEADING]
        preamble = self.preamble()
        if preamble:
            lines += textwrap.wrap(preamble, width=100, initial_indent="  ", subsequent_indent="  ")
        for track in self.tracks:
            lines += [f"  {line}" if index == 0 else f"    {line}" for index, line in enumerate(track_lines(track))]
        return lines

    def text(self) -> str:
        return "\n".join(self.lines())


def track_lines(verdict: TrackVerdict) -> list[str]:
    """One track's lines: the best configuration, its ratio to the ceiling, further answers, the flags."""
    title = TRACK_TITLES.get(verdict.track, verdict.track)
    head = f"track {verdict.track} ({title}): "
    best = verdict.best
    if best is None or verdict.value is None:
        lines = [head + "no configuration measured a number"]
    else:
        flagged = "" if best.quotable else " [flagged: not a number to quote]"
        lines = [f"{head}best {best.label}: {_number(verdict.value)} {verdict.unit}{flagged}"]
        if verdict.ceiling is None or verdict.ratio is None:
            lines.append(verdict.ceiling_note)
        else:
            lines.append(
                f"{verdict.ratio:.2f}x the ceiling measured in the same run: {verdict.ceiling.name} "
                f"({_number(verdict.ceiling.value)} {verdict.unit})"
            )
    lines += list(verdict.notes)
    total, quotable = verdict.configurations, verdict.quotable
    if total == 1:
        lines.append(
            "its one configuration carries no flag" if quotable else "its one configuration must not be quoted:"
        )
    elif total:
        if quotable == total:
            lines.append(f"all {total} configurations carry no flag")
        elif quotable == 0:
            lines.append(f"none of its {total} configurations may be quoted:")
        else:
            lines.append(f"{quotable} of {total} configurations carry no flag; the others must not be quoted:")
    lines += [f"  - {plain_reason(flag)} ({flag}: {count})" for flag, count in verdict.reasons]
    return lines


def plain_reason(flag: str) -> str:
    """Why a row carrying ``flag`` must not be quoted, in plain words."""
    return PLAIN_REASONS.get(flag) or VALIDITY_FLAGS.get(flag, flag)


@dataclass(frozen=True)
class _Rule:
    """How a track is judged: which configurations compete, on what value, against which ceiling."""

    unit: str
    #: Whether a configuration competes for "best" (ceilings and summaries do not).
    competes: Callable[[Configuration], bool]
    #: The number a configuration is ranked on (higher is better); None: it measured none.
    value: Callable[[Configuration], float | None]
    #: The ceiling for the best configuration among all of the track's configurations, and the ratio.
    #: A string says why there is none for this configuration.
    ceiling: Callable[[Configuration, float, Sequence[Configuration]], tuple[Ceiling, float] | str | None]
    notes: Callable[[Sequence[Configuration]], tuple[str, ...]] = lambda _: ()
    #: What "best" ranks on when not the value itself (Track 3: the share of its own model's rate,
    #: since images/s of different models do not compare).
    rank: Callable[[Configuration], float | None] | None = None


def _no_ceiling(best: Configuration, value: float, everything: Sequence[Configuration]) -> None:
    return None


def _ratio(name: str, ceiling: float | None, value: float) -> tuple[Ceiling, float] | None:
    if ceiling is None or ceiling <= 0:
        return None
    return Ceiling(name, ceiling), value / ceiling


def _source(configuration: Configuration) -> str:
    return str(configuration.rows[0].config.get("source", "plate"))


def _dtype(configuration: Configuration) -> object:
    return configuration.rows[0].config.get("crop", {}).get("dtype")


def _track2_ceiling(
    best: Configuration, value: float, everything: Sequence[Configuration]
) -> tuple[Ceiling, float] | str | None:
    """Crops already in memory: the workers' hand-over alone, of the same dtype where there is one.
    Loading in the main process hands nothing over, so nothing in the run bounds it."""
    if not best.rows[0].config.get("loader", {}).get("num_workers"):
        return f"{NO_CEILING} for loading in the main process (crops already in memory bound the workers' hand-over)"
    memory = [c for c in everything if _source(c) == "memory" and c.median(m.SAMPLES_PER_S) is not None]
    same_dtype = [c for c in memory if _dtype(c) == _dtype(best)] or memory
    rates = [rate for c in same_dtype if (rate := c.median(m.SAMPLES_PER_S)) is not None]
    return _ratio("crops already in memory, the workers' hand-over alone", max(rates, default=None), value)


def _searches(configuration: Configuration) -> bool:
    return bool(configuration.rows[0].metrics.get(m.TRIED_WORKERS))


def _track3_fed(configuration: Configuration) -> float | None:
    """The share of the model's compute-only rate the loaded loop ran at: never above 1 for a sound row."""
    rates = []
    for row in configuration.rows:
        images, ceiling = (
            _finite(row.metrics.get(m.IMAGES_PER_S)),
            _finite(row.metrics.get(m.COMPUTE_ONLY_IMAGES_PER_S)),
        )
        if images is None or not ceiling:
            continue
        stall = _finite(row.metrics.get(m.STALL_CROSSCHECK))
        rates.append((images, ceiling, math.inf if stall is None else 1.0 - stall))
    if not rates:
        return None
    return float(np.median([min(images / ceiling, fed) for images, ceiling, fed in rates]))


def _track3_ceiling(
    best: Configuration, value: float, everything: Sequence[Configuration]
) -> tuple[Ceiling, float] | None:
    """The model's compute-only rate: the baseline's, or the loop's own compute parts' where those ran
    faster (as the stall takes it), so the rate named is never below the one it bounds."""
    ratio = _track3_fed(best)
    baseline = best.median(m.COMPUTE_ONLY_IMAGES_PER_S)
    if ratio is None or baseline is None:
        return None
    ceiling = value / ratio if ratio > 0 else baseline
    return Ceiling("its model's compute-only rate, batches already on the device", ceiling), ratio


def _track3_notes(configurations: Sequence[Configuration]) -> tuple[str, ...]:
    return tuple(
        f"fewest workers that keep {c.label.removesuffix('/min-workers')} fed: "
        f"{c.rows[-1].metrics.get(m.MIN_WORKERS_ANSWER, '?')}"
        for c in configurations
        if _searches(c)
    )


def _is_memmap(configuration: Configuration) -> bool:
    return configuration.rows[0].config.get("layout_name") == MEMMAP_LAYOUT


def _layouts_ceiling(
    best: Configuration, value: float, everything: Sequence[Configuration]
) -> tuple[Ceiling, float] | None:
    memmap = [rate for c in everything if _is_memmap(c) and (rate := c.median(m.crops_per_s("random"))) is not None]
    return _ratio("the memory-mapped raw plate", max(memmap, default=None), value)


def _kind(configuration: Configuration) -> object:
    return configuration.rows[0].config.get("kind")


def _peers_ceiling(
    best: Configuration, value: float, everything: Sequence[Configuration]
) -> tuple[Ceiling, float] | None:
    direct = [
        rate
        for c in everything
        if _kind(c) == "cropbench"
        and c.rows[0].config.get("decode") == "direct"
        and (rate := c.median(m.SAMPLES_PER_S)) is not None
    ]
    return _ratio("cropbench direct on the same crops", max(direct, default=None), value)


RULES: dict[str, _Rule] = {
    "1": _Rule("samples/s", lambda c: True, lambda c: c.median(m.SAMPLES_PER_S), _no_ceiling),
    "2": _Rule("samples/s", lambda c: _source(c) != "memory", lambda c: c.median(m.SAMPLES_PER_S), _track2_ceiling),
    "3": _Rule(
        "images/s",
        lambda c: not _searches(c) and _track3_fed(c) is not None,
        lambda c: c.median(m.IMAGES_PER_S),
        _track3_ceiling,
        _track3_notes,
        _track3_fed,
    ),
    "layouts": _Rule(
        "crops/s", lambda c: not _is_memmap(c), lambda c: c.median(m.crops_per_s("random")), _layouts_ceiling
    ),
    "peers": _Rule("samples/s", lambda c: _kind(c) == "peer", lambda c: c.median(m.SAMPLES_PER_S), _peers_ceiling),
}
#: Tracks without a rule of their own are ranked on samples/s without a ceiling.
DEFAULT_RULE = RULES["1"]


def configurations(records: Iterable[Record]) -> list[Configuration]:
    """The records grouped by track and config fields (the seed aside), in the order first seen."""
    groups: dict[tuple[str, str, str], list[Record]] = {}
    for record in records:
        config = {key: value for key, value in record.config.items() if key != "seed"}
        # A row written without its config (by another tool) is a configuration of its own name.
        key = (record.track, json.dumps(config, sort_keys=True, default=str), "" if config else record.case)
        groups.setdefault(key, []).append(record)
    return [
        Configuration(tuple(rows), frozenset(flag for row in rows for flag in row_flags(row)))
        for rows in groups.values()
    ]


def judge_track(track: str, groups: Sequence[Configuration]) -> TrackVerdict:
    """One track's verdict from its configurations."""
    rule = RULES.get(track, DEFAULT_RULE)
    measured = [c for c in groups if _measured(c)]
    rank = rule.rank or rule.value
    ranked = [
        (score, value, c)
        for c in measured
        if rule.competes(c) and (value := rule.value(c)) is not None and (score := rank(c)) is not None
    ]
    candidates = [entry for entry in ranked if IMPOSSIBLE not in entry[2].flags]
    pool = [entry for entry in candidates if entry[2].quotable] or candidates
    _, value, best = max(pool, key=lambda entry: entry[0]) if pool else (None, None, None)
    found = rule.ceiling(best, value, groups) if best is not None and value is not None else None
    note = found if isinstance(found, str) else NO_CEILING
    found = None if isinstance(found, str) else found
    reasons = Counter(flag for c in measured for flag in c.flags)
    return TrackVerdict(
        track=track,
        configurations=len(measured),
        quotable=sum(c.quotable for c in measured),
        best=best,
        value=value,
        unit=rule.unit,
        ceiling=found[0] if found else None,
        ratio=found[1] if found else None,
        reasons=tuple(sorted(reasons.items(), key=lambda item: (-item[1], item[0]))),
        notes=rule.notes(groups),
        ceiling_note=note,
    )


def verdict(records: Iterable[Record], preset: str | None = None) -> Verdict:
    """The verdict over ``records`` (one run's rows, as a run returns them or as read back).

    ``preset`` names the case grid when known: a smoke run says what it proves before the tracks.
    """
    groups = configurations(records)
    tracks = list(dict.fromkeys(c.rows[0].track for c in groups))
    return Verdict(tuple(judge_track(t, [c for c in groups if c.rows[0].track == t]) for t in tracks), preset)


def _measured(configuration: Configuration) -> bool:
    """Whether any row of it measured (a skipped peer or a search's summary is not a measurement row)."""
    return not configuration.rows[0].metrics.get(m.SKIPPED) and not _searches(configuration)


def _finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite number (not missing, None, NaN, text or a bool); else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.3g}"


__all__ = ["HEADING", "Ceiling", "Configuration", "TrackVerdict", "Verdict", "configurations", "verdict"]
