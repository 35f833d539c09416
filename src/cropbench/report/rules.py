"""How each track is judged in the verdict: which configurations compete for best, on what value,
against which ceiling or reference, and what further answers the track gives.

Each rule is a :class:`Rule`; the table of tracks (:data:`cropbench.report.tracks.REPORTS`) names the
rule of each track, and :mod:`cropbench.report.verdict` applies it. A configuration is the rows of one
case that differ only in their seed, judged on the median over them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cropbench import metrics as m
from cropbench.config import CEILING_LAYOUT as MEMMAP_LAYOUT
from cropbench.harness.flags import crop_dtype, loader_shape, shape_label, source
from cropbench.records import Record

#: Said where a track's best configuration has nothing in the run to be measured against.
NO_CEILING = "no ceiling in this run"


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
    """What a track's best configuration is measured against, measured in the same run: a ceiling (no
    sound row passes it) or a reference (a comparison's baseline, which rows may pass)."""

    name: str
    value: float
    kind: str = "ceiling"


#: What a track's best configuration is measured against, and the ratio; a string says why there is none.
CeilingOf = Callable[[Configuration, float, Sequence[Configuration]], tuple[Ceiling, float] | str | None]


@dataclass(frozen=True)
class Rule:
    """How a track is judged: which configurations compete, on what value, against which ceiling."""

    unit: str
    #: Whether a configuration competes for "best" (ceilings and summaries do not).
    competes: Callable[[Configuration], bool]
    #: The number a configuration is ranked on (higher is better); None: it measured none.
    value: Callable[[Configuration], float | None]
    #: The ceiling for the best configuration among all of the track's configurations, and the ratio.
    #: A string says why there is none for this configuration.
    ceiling: CeilingOf
    notes: Callable[[Sequence[Configuration]], tuple[str, ...]] = lambda _: ()
    #: What part of the track a configuration belongs to where the track is judged per part (Track 3:
    #: its model, since images/s of different models do not compare); None: the track is judged whole.
    part: Callable[[Configuration], str] | None = None
    #: The track's answer in lines where it is not one best configuration (see ``TrackVerdict.answer``).
    answer: Callable[[Sequence[Configuration]], tuple[str, ...]] | None = None
    #: Which measured configurations the flag counts cover, and what they are called.
    counted: Callable[[Configuration], bool] = lambda _: True
    nouns: tuple[str, str] = ("configuration", "configurations")
    #: What is said where no competing configuration measured a number (None: that it did not).
    nothing: Callable[[Sequence[Configuration]], str] | None = None


def _no_ceiling(best: Configuration, value: float, everything: Sequence[Configuration]) -> None:
    return None


def _ratio(name: str, ceiling: float | None, value: float, kind: str = "ceiling") -> tuple[Ceiling, float] | None:
    if ceiling is None or ceiling <= 0:
        return None
    return Ceiling(name, ceiling, kind), value / ceiling


def _quotable_ratio(
    name: str, rates: Sequence[tuple[float, Configuration]], value: float, kind: str = "reference"
) -> tuple[Ceiling, float] | str | None:
    """The best of ``rates`` among the quotable configurations as the ceiling or reference of ``value``;
    where every one measured carries a flag, why there is none."""
    quotable = [rate for rate, c in rates if c.quotable]
    if rates and not quotable:
        return f"{NO_CEILING}: every row of {name} carries a flag"
    return _ratio(name, max(quotable, default=None), value, kind)


def _source(configuration: Configuration) -> str:
    return source(configuration.rows[0])


def _dtype(configuration: Configuration) -> object:
    return crop_dtype(configuration.rows[0])


def _loader_shape(configuration: Configuration) -> tuple[int, int | None, str]:
    """A Track 2 configuration's worker count, batch size and collate."""
    return loader_shape(configuration.rows[0])


def _track2_ceiling(
    best: Configuration, value: float, everything: Sequence[Configuration]
) -> tuple[Ceiling, float] | str | None:
    """Crops already in memory: the workers' hand-over alone, at the same worker count, batch size and
    collate (another of these hands over at another rate, so it bounds nothing), of the same dtype
    where there is one. Loading in the main process hands nothing over, so nothing bounds it."""
    shape = _loader_shape(best)
    workers, _, _ = shape
    if not workers:
        return f"{NO_CEILING} for loading in the main process (crops already in memory bound the workers' hand-over)"
    memory = [c for c in everything if _source(c) == "memory" and c.median(m.SAMPLES_PER_S) is not None]
    matching = [c for c in memory if _loader_shape(c) == shape]
    if memory and not matching:
        shapes = ", ".join(sorted({shape_label(*s) for s in map(_loader_shape, memory)}))
        return f"{NO_CEILING} at {shape_label(*shape)}: crops already in memory were handed over at {shapes} only"
    quotable = [c for c in matching if c.quotable]
    if matching and not quotable:
        return f"{NO_CEILING} at {shape_label(*shape)}: every row of crops already in memory there carries a flag"
    same_dtype = [c for c in quotable if _dtype(c) == _dtype(best)] or quotable
    rates = [rate for c in same_dtype if (rate := c.median(m.SAMPLES_PER_S)) is not None]
    return _ratio("crops already in memory, the workers' hand-over alone", max(rates, default=None), value)


def searches(configuration: Configuration) -> bool:
    """Whether the rows are a worker search's summary (Track 3's fewest workers), not a measurement."""
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


def _model(configuration: Configuration) -> str:
    """A Track 3 configuration's model (a worker search names it in its case)."""
    config = configuration.rows[0].config
    case = config.get("case")
    model = config.get("model") or (case.get("model") if isinstance(case, dict) else None)
    return f"model {model}" if model else ""


def _track3_notes(configurations: Sequence[Configuration]) -> tuple[str, ...]:
    return tuple(
        f"fewest workers that keep {c.label.removesuffix('/min-workers')} fed: "
        f"{c.rows[-1].metrics.get(m.MIN_WORKERS_ANSWER, '?')}"
        for c in configurations
        if searches(c)
    )


def _is_memmap(configuration: Configuration) -> bool:
    return configuration.rows[0].config.get("layout_name") == MEMMAP_LAYOUT


def _layouts_ceiling(
    best: Configuration, value: float, everything: Sequence[Configuration]
) -> tuple[Ceiling, float] | str | None:
    """The memory-mapped raw plate through the same dataset: the comparison's reference, not a ceiling
    (it carries the dataset's per-crop work; the ceiling no reader passes is track targets')."""
    memmap = [
        (rate, c)
        for c in everything
        if _is_memmap(c) and (rate := c.median(m.access_crops_per_s_key("random"))) is not None
    ]
    return _quotable_ratio("the memory-mapped raw plate, through the same dataset", memmap, value)


def _kind(configuration: Configuration) -> object:
    return configuration.rows[0].config.get("kind")


def _peers_ceiling(
    best: Configuration, value: float, everything: Sequence[Configuration]
) -> tuple[Ceiling, float] | str | None:
    direct = [
        (rate, c)
        for c in everything
        if _kind(c) == "cropbench"
        and c.rows[0].config.get("decode") == "direct"
        and (rate := c.median(m.SAMPLES_PER_S)) is not None
    ]
    return _quotable_ratio("cropbench direct on the same crops", direct, value)


@dataclass(frozen=True)
class PairedRatio:
    """Track targets: the direct reader over one reference (the copy ceiling at the reader's thread count,
    or a peer at its best) for one access pattern, from its ratio rows: the median over repeats of each
    row's median per-block ratio and of its quartiles, and every block counted."""

    access: str
    reference: str
    #: The direct reader's decode threads (None where the row does not say).
    threads: int | None
    #: Whether the reference is the copy ceiling (its rows name the ceiling's threads).
    ceiling: bool
    median: float
    q1: float
    q3: float
    blocks: int
    flags: frozenset[str]


def _is_ceiling_ratio(configuration: Configuration) -> bool:
    """Whether the rows are track targets' ratios to the copy ceiling (they name the ceiling's threads)."""
    return any(m.CEILING_THREADS in row.metrics for row in configuration.rows)


def paired_ratios(configurations: Iterable[Configuration]) -> list[PairedRatio]:
    """The ratio rows of track targets among ``configurations``, one :class:`PairedRatio` each, in order;
    rows that do not name their readers and access pattern in their config are left out."""
    found = []
    for c in configurations:
        config = c.rows[0].config
        median, q1, q3 = (c.median(metric) for metric in (m.RATIO_MEDIAN, m.RATIO_Q1, m.RATIO_Q3))
        if median is None or not config.get("reference_name") or not config.get("access"):
            continue
        reader = config.get("reader")
        threads = reader.get("decode_threads") if isinstance(reader, dict) else None
        found.append(
            PairedRatio(
                access=str(config["access"]),
                reference=str(config["reference_name"]),
                threads=threads if isinstance(threads, int) else None,
                ceiling=_is_ceiling_ratio(c),
                median=median,
                q1=median if q1 is None else q1,
                q3=median if q3 is None else q3,
                blocks=sum(int(row.metrics.get(m.PAIRED_BLOCKS) or 0) for row in c.rows),
                flags=c.flags,
            )
        )
    return found


def _times(ratio: float) -> str:
    """A ratio to three figures or so (0.21, 13.6, 183)."""
    return f"{ratio:,.0f}" if ratio >= 100 else f"{ratio:.1f}" if ratio >= 10 else f"{ratio:.2f}"


def _spreads(ratios: Sequence[PairedRatio]) -> str:
    """Each ratio with its quartiles and the direct reader's decode threads, fewest threads first."""
    cells = []
    for index, ratio in enumerate(sorted(ratios, key=lambda r: r.threads or 0)):
        threads = "?" if ratio.threads is None else str(ratio.threads)
        unit = "" if index else (" decode thread" if ratio.threads == 1 else " decode threads")
        flagged = f" (flagged {', '.join(sorted(ratio.flags))}: not a number to quote)" if ratio.flags else ""
        spread = f"[{_times(ratio.q1)}-{_times(ratio.q3)}]"
        cells.append(f"{_times(ratio.median)}x {spread} with {threads}{unit}{flagged}")
    return ", ".join(cells)


def _targets_answer(configurations: Sequence[Configuration]) -> tuple[str, ...]:
    """Per access pattern: the direct reader over the copy ceiling at each thread count, then over each
    peer at its best; the peers left out, and readers whose crops were not the direct reader's."""
    ratios = paired_ratios(configurations)
    if not ratios:
        return ()
    lines = ["the direct reader's crops/s over each reference's, the median of per-block paired ratios [quartiles]"]
    for access in dict.fromkeys(ratio.access for ratio in ratios):
        of_access = [ratio for ratio in ratios if ratio.access == access]
        ceilings = [ratio for ratio in of_access if ratio.ceiling]
        if ceilings:
            lines.append(f"{access}, over the copy ceiling at the same thread count: {_spreads(ceilings)}")
        for peer in dict.fromkeys(ratio.reference for ratio in of_access if not ratio.ceiling):
            against = [ratio for ratio in of_access if ratio.reference == peer]
            lines.append(f"{access}, over {peer} at its best: {_spreads(against)}")
    left_out = {name: None for c in configurations for name in (c.rows[-1].metrics.get(m.SKIPPED_PEERS) or {})}
    if left_out:
        lines.append(f"peers left out (not installed or not applicable, see skipped_peers): {', '.join(left_out)}")
    differ = [
        f"{c.rows[0].config.get('reader_name', c.label)} ({c.rows[0].config.get('case', {}).get('access', '?')})"
        for c in configurations
        if any(row.metrics.get(m.IDENTICAL_TO_DIRECT) is False for row in c.rows)
    ]
    if differ:
        lines.append(
            f"crops not byte for byte the direct reader's, so their ratios compare other work: {', '.join(differ)}"
        )
    return tuple(lines)


#: The read paths of a plate in a store and each one's key prefix in a store-layouts row.
STORE_READ_PATHS = {"direct": m.DIRECT_, "zarr": m.ZARR_}


def _local_reference(name: str, local_metric: str, ratio_metric: str | None = None) -> CeilingOf:
    """The same measurement on local disk as the reference of a store's best configuration."""

    def reference(
        best: Configuration, value: float, everything: Sequence[Configuration]
    ) -> tuple[Ceiling, float] | str:
        local = best.median(local_metric)
        if local is None or local <= 0:
            return "no local plate measured beside the store in this run (--local-plate PATH does)"
        ratio = best.median(ratio_metric) if ratio_metric else None
        return Ceiling(name, local, "reference"), value / local if ratio is None else ratio

    return reference


def _is_in_place(configuration: Configuration) -> bool:
    """Whether the row reads the plate in place (cropbench's own readers), not a converted crop store."""
    return configuration.rows[0].config.get(m.READER) in m.IN_PLACE


def _formats_ceiling(
    best: Configuration, value: float, everything: Sequence[Configuration]
) -> tuple[Ceiling, float] | str | None:
    """The plate read in place: the reference each converted store's epochs were measured in turns with,
    so the ratio is the interleaved one of the best store's own row."""
    ratio = best.median(m.EPOCH_RATIO_TO_IN_PLACE)
    if ratio is None or ratio <= 0:
        return f"no epochs of {m.REFERENCE} measured in turns with it in this run"
    return Ceiling(f"the plate read in place ({m.REFERENCE}), epochs in turns", value / ratio, "reference"), ratio


def _formats_notes(configurations: Sequence[Configuration]) -> tuple[str, ...]:
    """Per converted store: after how many epochs converting pays off (its conversion cost over the saving
    of its epochs measured in turns with the plate in place), or that it never does."""
    notes = []
    for c in configurations:
        if _is_in_place(c) or c.rows[0].metrics.get(m.SKIPPED):
            continue
        reader = c.rows[0].config.get(m.READER, c.label)
        # The break-even of whole epochs measured in turns with the plate in place (like for like).
        pays = c.rows[0].metrics.get(m.prefixed(m.INTERLEAVED, m.CONVERTING_PAYS_OFF))
        epochs = c.median(m.prefixed(m.INTERLEAVED, m.BREAK_EVEN_EPOCHS))
        if not c.quotable:
            notes.append(f"{reader}: no break-even to quote (flagged {', '.join(sorted(c.flags))})")
        elif pays is False:
            notes.append(f"{reader}: converting never pays off (its whole epochs are no faster than reading in place)")
        elif epochs is not None:
            notes.append(f"{reader}: converting pays off after {epochs:,.1f} epochs")
    return tuple(notes)


def _formats_rate(configuration: Configuration) -> float | None:
    """Crops/s over whole shuffled epochs (the steady rate in rows written before the whole-epoch one)."""
    whole = configuration.median(m.prefixed(m.SHUFFLED, m.EPOCH_SAMPLES_PER_S))
    return whole if whole is not None else configuration.median(m.prefixed(m.SHUFFLED, m.SAMPLES_PER_S))


#: What track formats ranks its converted stores on.
FORMATS_UNIT = "crops/s, whole shuffled epochs"


def _formats_nothing(configurations: Sequence[Configuration]) -> str:
    """Where no converted store measured a number: that, and what the plate read in place measured."""
    in_place = [
        f"{c.label} {number(rate)}" + ("" if c.quotable else " [flagged]")
        for c in configurations
        if _is_in_place(c) and (rate := _formats_rate(c)) is not None
    ]
    read = f"; the plate read in place: {', '.join(in_place)} {FORMATS_UNIT}" if in_place else ""
    return f"no converted store measured a number (each row says why){read}"


def _kib(value: float | None) -> str:
    return "?" if value is None else f"{value / 1024:,.0f} KiB"


def _remote_notes(configurations: Sequence[Configuration]) -> tuple[str, ...]:
    """Requests and bytes per random crop per read path (the same on every worker count)."""
    cells = []
    for decode in dict.fromkeys(str(c.rows[0].config.get("decode", "?")) for c in configurations):
        rows = [c for c in configurations if str(c.rows[0].config.get("decode", "?")) == decode]
        requests = _median_of(rows, m.REQUESTS_PER_CROP)
        if requests is not None:
            cells.append(f"{decode} {requests:.2f} ({_kib(_median_of(rows, m.BYTES_TRANSFERRED_PER_CROP))})")
    return (
        (f"requests per random crop, decoded-chunk cache off (bytes transferred): {', '.join(cells)}",) if cells else ()
    )


def _store_layouts_notes(configurations: Sequence[Configuration]) -> tuple[str, ...]:
    """The zarr path's best layout, the requests per random crop per layout, and the store's settings."""
    lines = []
    zarr_rate, zarr_local = m.prefixed(m.ZARR_, m.SAMPLES_PER_S), m.prefixed(m.ZARR_, m.LOCAL_SAMPLES_PER_S)
    ranked = [(rate, c) for c in configurations if (rate := c.median(zarr_rate)) is not None]
    quotable = [(rate, c) for rate, c in ranked if c.quotable]
    if quotable:
        rate, best = max(quotable, key=lambda entry: entry[0])
        local = best.median(zarr_local)
        beside = f" ({rate / local:.2f}x the same layout on local disk)" if local else ""
        lines.append(f"zarr path: best {best.label}: {number(rate)} crops/s{beside}")
    elif ranked:
        lines.append("zarr path: no layout to name: every one that measured a number carries a flag")
    cells = []
    for c in configurations:
        counts = [c.median(m.prefixed(prefix, m.REQUESTS_PER_CROP)) for prefix in STORE_READ_PATHS.values()]
        if any(count is not None for count in counts):
            cells.append(f"{c.label} " + " / ".join("?" if n is None else f"{n:.2f}" for n in counts))
    if cells:
        lines.append(f"requests per random crop ({' / '.join(STORE_READ_PATHS)}): {', '.join(cells)}")
    latency, in_flight = _median_of(configurations, m.INJECTED_LATENCY_MS), _median_of(configurations, m.IN_FLIGHT)
    if latency is not None:
        held = "" if in_flight is None else f", {in_flight:.0f} requests in flight"
        lines.append(f"over a loopback store at {latency:g} ms injected per request{held}, no workers")
    return tuple(lines)


def _median_of(configurations: Sequence[Configuration], metric: str) -> float | None:
    values = [value for c in configurations if (value := c.median(metric)) is not None]
    return float(np.median(values)) if values else None


#: Tracks without a rule of their own are ranked on samples/s without a ceiling (track dataset's rule).
SAMPLES_RULE = Rule("samples/s", lambda c: True, lambda c: c.median(m.SAMPLES_PER_S), _no_ceiling)
LOADER_RULE = Rule("samples/s", lambda c: _source(c) != "memory", lambda c: c.median(m.SAMPLES_PER_S), _track2_ceiling)
TRAINING_RULE = Rule(
    "images/s",
    lambda c: not searches(c) and _track3_fed(c) is not None,
    lambda c: c.median(m.IMAGES_PER_S),
    _track3_ceiling,
    _track3_notes,
    part=_model,
)
LAYOUTS_RULE = Rule(
    "crops/s", lambda c: not _is_memmap(c), lambda c: c.median(m.access_crops_per_s_key("random")), _layouts_ceiling
)
PEERS_RULE = Rule("samples/s", lambda c: _kind(c) == "peer", lambda c: c.median(m.SAMPLES_PER_S), _peers_ceiling)
TARGETS_RULE = Rule(
    "crops/s",
    lambda c: False,
    lambda c: None,
    _no_ceiling,
    answer=_targets_answer,
    counted=_is_ceiling_ratio,
    nouns=("ratio to the ceiling", "ratios to the ceiling"),
)
REMOTE_RULE = Rule(
    "crops/s through the loader",
    lambda c: True,
    lambda c: c.median(m.SAMPLES_PER_S),
    _local_reference("the same case on local disk", m.LOCAL_SAMPLES_PER_S, m.RATIO_TO_LOCAL),
    _remote_notes,
)
FORMATS_RULE = Rule(
    FORMATS_UNIT,
    lambda c: not _is_in_place(c),
    _formats_rate,
    _formats_ceiling,
    _formats_notes,
    nothing=_formats_nothing,
)
STORE_LAYOUTS_RULE = Rule(
    "crops/s, direct path",
    lambda c: True,
    lambda c: c.median(m.prefixed(m.DIRECT_, m.SAMPLES_PER_S)),
    _local_reference("the same layout on local disk", m.prefixed(m.DIRECT_, m.LOCAL_SAMPLES_PER_S)),
    _store_layouts_notes,
)


def _finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite number (not missing, None, NaN, text or a bool); else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def number(value: float) -> str:
    """A rate to about three figures (0.214, 13.6, 1,830)."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.3g}"


__all__ = [
    "FORMATS_RULE",
    "LAYOUTS_RULE",
    "LOADER_RULE",
    "NO_CEILING",
    "PEERS_RULE",
    "REMOTE_RULE",
    "SAMPLES_RULE",
    "STORE_LAYOUTS_RULE",
    "TARGETS_RULE",
    "TRAINING_RULE",
    "Ceiling",
    "CeilingOf",
    "Configuration",
    "PairedRatio",
    "Rule",
    "number",
    "paired_ratios",
    "searches",
]
