"""The verdict: what a run answers, in a few lines a lab can act on.

Per track: the best configuration measured, its ratio to the ceiling (or the reference) measured in
the same run (where the track has one), and, in plain words from the rows' validity flags, why rows
must not be quoted. Track ``targets`` answers with its paired ratios instead: per access pattern, the
direct reader over the copy ceiling at the same thread count and over each peer at its best.
Rows are grouped by their config fields (repeats of one configuration differ only in their seed) and
each configuration is judged on the median over its repeats; a configuration is quotable when none
of its rows carries a flag (the flags it was written with: :mod:`cropbench.harness.flags`). No answer
rests on a flagged row: the best configuration is the one with the highest rate (samples/s, crops/s;
Track 3: images/s, judged per model) among the quotable ones, and a ceiling or reference it is set
against is a quotable row too; when none is quotable, the verdict says so and names none. Every
track's answer says the rule. Each track's rule (:mod:`cropbench.report.rules`) is named in its report
(:data:`cropbench.report.tracks.REPORTS`).
"""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cropbench import metrics as m
from cropbench.harness.flags import IMPOSSIBLE, impossible_reasons, row_flags
from cropbench.harness.validity import LIBRARY_CACHE_FLAG, flag_meaning
from cropbench.records import Record
from cropbench.report.rules import NO_CEILING, Ceiling, Configuration, Rule, number, searches
from cropbench.report.tracks import report_of
from cropbench.tracks import TITLES

#: Heading of the verdict block (the HTML report uses it too).
HEADING = "Verdict"
#: What the smoke preset's rows are for, said before any track.
SMOKE_NOTE = (
    "this run proves the pipeline: every track ran end to end on a plate sized to finish in minutes, "
    "not to measure; for numbers run --preset full (cropbench run --preset full on a plate larger "
    "than the reader's cache)"
)
#: Impossible configurations named, with their reasons, under a track's verdict.
IMPOSSIBLE_EXAMPLES = 5
#: Each validity flag in plain words: why a row carrying it must not be quoted, and what to do.
PLAIN_REASONS: dict[str, str] = {
    "few-samples": "too few timings for a p95: run longer (--preset full, or more --samples)",
    "re-reads": "more crops drawn than the plate holds, so crops were read twice: use a larger plate",
    "cache>=plate": "the reader's cache holds the whole plate, so reads were cache hits: use a larger plate",
    "not-evicted": "the page cache could not be emptied before the cold pass: no cold numbers",
    "rate!=1/mean": "its two timing loops disagree: the machine was busy; run again on an idle machine",
    IMPOSSIBLE: "its numbers contradict each other: run again on an idle machine",
    LIBRARY_CACHE_FLAG: "the library's own local cache served the epochs after the first over the store, so its "
    "rates over the store are not the store's: run one epoch (--epochs 1) for those",
}


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
    #: The track's answer where it is not one best configuration (track targets: its paired ratios);
    #: said instead of the best configuration and its ratio.
    answer: tuple[str, ...] = ()
    #: What ``configurations`` counts, singular and plural.
    nouns: tuple[str, str] = ("configuration", "configurations")
    #: What part of the track this answer covers where a track answers per part (Track 3: per model).
    subject: str = ""
    #: How the best configuration was chosen, said under it.
    chosen_by: str = ""
    #: A few impossible configurations, each with why: ``label: reason``.
    impossible: tuple[str, ...] = ()
    #: Said instead of the best configuration where there is none.
    nothing: str = "no configuration measured a number"


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
    title = TITLES.get(verdict.track, verdict.track) + (f", {verdict.subject}" if verdict.subject else "")
    head = f"track {verdict.track} ({title}): "
    best = verdict.best
    if verdict.answer:
        lines = [head + verdict.answer[0], *verdict.answer[1:]]
    elif best is None or verdict.value is None:
        lines = [head + verdict.nothing]
    else:
        lines = [f"{head}best {best.label}: {number(verdict.value)} {verdict.unit}"]
        if verdict.ceiling is None or verdict.ratio is None:
            lines.append(verdict.ceiling_note)
        else:
            lines.append(
                f"{verdict.ratio:.2f}x the {verdict.ceiling.kind} measured in the same run: {verdict.ceiling.name} "
                f"({number(verdict.ceiling.value)} {verdict.unit})"
            )
        if verdict.chosen_by:
            lines.append(f"chosen as {verdict.chosen_by}")
    lines += list(verdict.notes)
    total, quotable = verdict.configurations, verdict.quotable
    one, many = verdict.nouns
    if total == 1:
        lines.append(f"its one {one} carries no flag" if quotable else f"its one {one} must not be quoted:")
    elif total:
        if quotable == total:
            lines.append(f"all {total} {many} carry no flag")
        elif quotable == 0:
            lines.append(f"none of its {total} {many} may be quoted:")
        else:
            lines.append(f"{quotable} of {total} {many} carry no flag; the others must not be quoted:")
    for flag, count in verdict.reasons:
        lines.append(f"  - {plain_reason(flag, verdict.track)} ({flag}: {count})")
        if flag == IMPOSSIBLE:
            lines += [f"  - {example}" for example in verdict.impossible]
    return lines


def plain_reason(flag: str, track: str | None = None) -> str:
    """Why a row of ``track`` carrying ``flag`` must not be quoted, in plain words."""
    return report_of(track or "").reasons.get(flag) or PLAIN_REASONS.get(flag) or flag_meaning(flag, track)


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


def judge_track(track: str, groups: Sequence[Configuration], subject: str = "") -> TrackVerdict:
    """One track's verdict from its configurations (``subject``: the part of the track they are)."""
    rule = report_of(track).rule
    measured = [c for c in groups if _measured(c)]
    counted = [c for c in measured if rule.counted(c)]
    ranked = [(value, c) for c in measured if rule.competes(c) and (value := rule.value(c)) is not None]
    clean = [entry for entry in ranked if entry[1].quotable]
    value, best = max(clean, key=lambda entry: entry[0]) if clean else (None, None)
    found = rule.ceiling(best, value, groups) if best is not None and value is not None else None
    note = found if isinstance(found, str) else NO_CEILING
    found = None if isinstance(found, str) else found
    reasons = Counter(flag for c in counted for flag in c.flags)
    among = f"{len(clean)} {'configuration' if len(clean) == 1 else 'configurations'}"
    return TrackVerdict(
        track=track,
        configurations=len(counted),
        quotable=sum(c.quotable for c in counted),
        best=best,
        value=value,
        unit=rule.unit,
        ceiling=found[0] if found else None,
        ratio=found[1] if found else None,
        reasons=tuple(sorted(reasons.items(), key=lambda item: (-item[1], item[0]))),
        notes=rule.notes(groups),
        ceiling_note=note,
        answer=rule.answer(measured) if rule.answer else (),
        nouns=rule.nouns,
        subject=subject,
        chosen_by=f"the highest {rule.unit} of {among} without flags" if best is not None else "",
        impossible=tuple(f"{c.label}: {why}" for c in counted if (why := _why_impossible(c)))[:IMPOSSIBLE_EXAMPLES],
        nothing=_nothing(rule, ranked, groups),
    )


def _nothing(rule: Rule, ranked: Sequence[tuple[float, Configuration]], groups: Sequence[Configuration]) -> str:
    """What is said where no configuration is named best: none measured a number, or every one carries a flag."""
    if all(IMPOSSIBLE in c.flags for _, c in ranked) and ranked:
        return "no configuration to name: every one that measured a number contradicts itself (below)"
    if ranked:
        return "no configuration to name: every one that measured a number carries a flag (below)"
    return rule.nothing(groups) if rule.nothing is not None else "no configuration measured a number"


def _why_impossible(configuration: Configuration) -> str:
    """Why the first impossible row of the configuration is impossible ("" when none is)."""
    for row in configuration.rows:
        reasons = impossible_reasons(row)
        if reasons:
            return "; ".join(reasons)
    return ""


def judge(track: str, groups: Sequence[Configuration]) -> list[TrackVerdict]:
    """A track's verdicts: one, or one per part where the track is judged per part (Track 3: per model)."""
    rule = report_of(track).rule
    if rule.part is None:
        return [judge_track(track, groups)]
    parts = list(dict.fromkeys(rule.part(c) for c in groups))
    if len(parts) < 2:
        return [judge_track(track, groups, parts[0] if parts else "")]
    return [judge_track(track, [c for c in groups if rule.part(c) == part], part) for part in parts]


def verdict(records: Iterable[Record], preset: str | None = None) -> Verdict:
    """The verdict over ``records`` (every row given: a run's, or a whole results file read back).

    Each row's flags are those it was written with (:mod:`cropbench.harness.flags`), so a flagged row
    is never the best. ``preset`` names the case grid when known: a smoke run says what it proves
    before the tracks.
    """
    groups = configurations(records)
    tracks = list(dict.fromkeys(c.rows[0].track for c in groups))
    return Verdict(
        tuple(answer for t in tracks for answer in judge(t, [c for c in groups if c.rows[0].track == t])), preset
    )


def _measured(configuration: Configuration) -> bool:
    """Whether any row of it measured (a skipped peer or a search's summary is not a measurement row)."""
    return not configuration.rows[0].metrics.get(m.SKIPPED) and not searches(configuration)


__all__ = [
    "HEADING",
    "TrackVerdict",
    "Verdict",
    "configurations",
    "verdict",
]
