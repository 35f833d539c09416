"""``cropbench advise``'s decisions: pure functions over the rows it measured.

Each question (read path, workers, batch, prefetch, pinning, convert or read) is answered from its rows
alone: the options read in whole epochs taking turns, and the paired ratios between them
(:mod:`cropbench.tracks.training.advise` measures them). A decision names its evidence (the rows and the
ratio) and its uncertainty (the ratio's quartiles over the rounds). No decision rests on a row with
validity flags: such a row is named among the evidence as not used. Where the noise leaves a question
open (the ratio's quartiles reach across 1), the answer is the default, the decision says it is open and
what would settle it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cropbench import metrics as m
from cropbench.harness.ratios import ratio_settled
from cropbench.records import Record

#: The records' track (``cropbench.tracks.training.advise.TRACK``), and that of the formats compared.
TRACK = "advise"
FORMATS_TRACK = "formats"
#: The questions, in the order they are measured and printed.
READ_PATH = "read-path"
WORKERS = "workers"
BATCH = "batch"
PREFETCH = "prefetch"
PINNING = "pinning"
CONVERT = "convert"
QUESTIONS = (READ_PATH, WORKERS, BATCH, PREFETCH, PINNING, CONVERT)
#: The recommendation holds when the loop achieves its predicted images/s within this share.
VERIFY_TOLERANCE = 0.15
#: The file ``advise`` writes beside its rows.
ADVICE_NAME = "advice.json"
#: torch's prefetch factor where none is set.
DEFAULT_PREFETCH = 2


@dataclass(frozen=True)
class Decision:
    """One answer: in words (``answer``), as the value the recommendation uses, the rows and ratios it rests
    on, how sure it is, whether the noise left it open, and what would settle it."""

    question: str
    answer: str
    value: Any
    evidence: tuple[str, ...]
    uncertainty: str
    open: bool
    settle: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "question": self.question,
            "answer": self.answer,
            "value": self.value,
            "evidence": list(self.evidence),
            "uncertainty": self.uncertainty,
            "open": self.open,
            "settle": self.settle or None,
        }


def flags(record: Record) -> list[str]:
    """The row's validity flags, as written with it."""
    stored = record.metrics.get(m.VALIDITY_FLAGS)
    return [str(flag) for flag in stored] if isinstance(stored, list) else []


def question_rows(records: Iterable[Record], question: str) -> tuple[list[Record], list[Record]]:
    """The option rows and the ratio rows of ``question`` (the latest of each case)."""
    latest: dict[str, Record] = {}
    for record in records:
        if record.track == TRACK and record.config.get(m.QUESTION) == question:
            latest[record.case] = record
    options = [r for r in latest.values() if m.OPTION in r.config]
    ratios = [r for r in latest.values() if "reference" in r.config]
    return options, ratios


def _number(record: Record, key: str) -> float:
    value = record.metrics.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def settled(ratio: Record) -> bool:
    """Whether the ratio row tells its options apart (as the rounds were stopped on)."""
    return ratio_settled(_number(ratio, m.RATIO_MEDIAN), _number(ratio, m.RATIO_Q1), _number(ratio, m.RATIO_Q3))


def describe_ratio(ratio: Record) -> str:
    """``case: 1.84x (quartiles 1.80-1.90 over 4 rounds)``."""
    return (
        f"{ratio.case}: {_number(ratio, m.RATIO_MEDIAN):.2f}x (quartiles {_number(ratio, m.RATIO_Q1):.2f}-"
        f"{_number(ratio, m.RATIO_Q3):.2f} over {ratio.metrics.get(m.ROUNDS)} rounds)"
    )


def describe_option(option: Record) -> str:
    """``case: 1,234 crops/s over whole epochs, 1.6 cores busy`` (and how far the budget cut the epochs)."""
    cut = ""
    if option.metrics.get(m.EPOCH_CROPS_FITTED):
        cut = (
            f"; epochs of {option.metrics.get(m.EPOCH_CROPS)} of the {option.metrics.get(m.OBJECTS)} crops, "
            "cut to fit the budget"
        )
    return (
        f"{option.case}: {_number(option, m.WHOLE_EPOCH_SAMPLES_PER_S):,.0f} crops/s over whole epochs "
        f"(first batch and worker start-up included), {_number(option, m.CORES_BUSY):.1f} cores busy{cut}"
    )


def not_used(records: Sequence[Record]) -> list[str]:
    """Evidence lines for the flagged rows a decision leaves out."""
    return [f"not used: {r.case} (flagged {', '.join(flags(r))})" for r in records if flags(r)]


def settle_hint(ratio: Record, budget_min: int) -> str:
    """What would settle an open ratio: an idle machine where the load was high when it was measured,
    a longer budget where the budget stopped the rounds, else a quieter machine (the options are within
    the noise of each other)."""
    load, cores = _number(ratio, m.LOADAVG_START), ratio.config.get(m.CORES)
    if isinstance(cores, int) and cores > 0 and load >= cores:
        return f"run on an idle machine (the load average was {load:.1f} on {cores} cores when it was measured)"
    if ratio.metrics.get(m.BUDGET_ENDED):
        return f"run with --budget-min {2 * budget_min} (the budget ended the rounds before they settled)"
    return (
        f"the options are within the noise of {ratio.metrics.get(m.ROUNDS)} rounds of each other: either serves; "
        "on an idle machine more rounds could still tell them apart"
    )


def flag_hint(records: Sequence[Record]) -> str:
    """What would clear the flags of the rows a decision could not use."""
    raised = {flag for r in records for flag in flags(r)}
    hints = []
    if "cache>=plate" in raised:
        hints.append("a plate larger than the reader's chunk cache")
    if "few-samples" in raised:
        hints.append("more crops per epoch (--epoch-crops) or more steps (--steps)")
    if raised - {"cache>=plate", "few-samples"}:
        hints.append("a run on an idle machine")
    return "; ".join(hints) or "a run whose rows carry no flags"


def _between(
    question: str,
    records: Iterable[Record],
    budget_min: int,
    value_of: Callable[[Record], Any],
    words: Callable[[Any], str],
) -> Decision | None:
    """A question of two options decided by their paired ratio: the faster where the ratio settled, else
    the first option (the default), open. None where the question was not measured."""
    options, ratios = question_rows(records, question)
    if not options:
        return None
    by_name = {r.config[m.OPTION]: r for r in options}
    evidence = [describe_option(r) for r in options if not flags(r)]
    if len(options) == 1 or not ratios:
        only = options[0]
        if flags(only):
            return Decision(
                question, words(value_of(only)), value_of(only), tuple(not_used(options)), "", True, flag_hint(options)
            )
        return Decision(question, words(value_of(only)), value_of(only), tuple(evidence), "one option only", False)
    ratio = ratios[0]
    first, second = by_name[ratio.config[m.READER]], by_name[ratio.config["reference"]]
    default = value_of(first)
    unusable = [r for r in (first, second, ratio) if flags(r)]
    if unusable:
        words_default = f"{words(default)} (the default: every row that could decide it is flagged)"
        return Decision(
            question, words_default, default, tuple(evidence + not_used(unusable)), "", True, flag_hint(unusable)
        )
    median, q1, q3 = (_number(ratio, key) for key in (m.RATIO_MEDIAN, m.RATIO_Q1, m.RATIO_Q3))
    evidence.append(describe_ratio(ratio))
    faster = first if median > 1 else second
    if settled(ratio):
        side = "above" if median > 1 else "below"
        uncertainty = f"the ratio's quartiles {q1:.2f}-{q3:.2f} lie {side} 1: {faster.config[m.OPTION]} is faster"
        return Decision(question, words(value_of(faster)), value_of(faster), tuple(evidence), uncertainty, False)
    uncertainty = f"the ratio's quartiles {q1:.2f}-{q3:.2f} reach across 1: the noise is as large as the difference"
    answer = f"{words(default)} (the default; open)"
    return Decision(question, answer, default, tuple(evidence), uncertainty, True, settle_hint(ratio, budget_min))


def _loader(record: Record) -> dict[str, Any]:
    loader = record.config.get("loader")
    return loader if isinstance(loader, dict) else {}


def _crop(record: Record) -> dict[str, Any]:
    crop = record.config.get("crop")
    return crop if isinstance(crop, dict) else {}


def decide_read_path(records: Iterable[Record], budget_min: int) -> Decision:
    """``direct`` or ``zarr``: the faster over whole epochs, read in turns in the main process."""
    decision = _between(READ_PATH, records, budget_min, lambda r: _crop(r).get("decode"), str)
    return decision or Decision(READ_PATH, "direct (not measured)", "direct", (), "", True, "run advise again")


def decide_batch(records: Iterable[Record], budget_min: int) -> Decision | None:
    """The batch whose predicted loop images/s is higher (each batch against the model's demand at it)."""
    return _between(BATCH, records, budget_min, lambda r: _loader(r).get("batch_size"), lambda v: f"{v}")


def decide_prefetch(records: Iterable[Record], budget_min: int) -> Decision:
    """Batches each worker prepares ahead: torch's default unless more is clearly faster."""
    decision = _between(
        PREFETCH, records, budget_min, lambda r: _loader(r).get("prefetch_factor") or DEFAULT_PREFETCH, str
    )
    return decision or Decision(
        PREFETCH,
        f"{DEFAULT_PREFETCH} (torch's default)",
        DEFAULT_PREFETCH,
        (),
        "not measured: no workers, nothing to prefetch",
        False,
    )


def decide_pinning(records: Iterable[Record], budget_min: int) -> Decision:
    """Pinned memory for the copy to the accelerator: measured only where there is one."""
    decision = _between(
        PINNING, records, budget_min, lambda r: bool(_loader(r).get("pin_memory")), lambda v: "on" if v else "off"
    )
    return decision or Decision(
        PINNING, "off", False, (), "not measured: no CUDA device here, and pinning only speeds copies to one", False
    )


def decide_workers(records: Iterable[Record], budget_min: int) -> Decision:
    """The fewest workers whose whole-epoch supply keeps the model's data wait under the threshold: each
    count's paired ratio of its supply over the crops/s the model needs at that count."""
    options, ratios = question_rows(records, WORKERS)
    by_reader = {r.config[m.READER]: r for r in ratios}
    entries = sorted(
        ((int(_loader(r).get("num_workers", 0)), r, by_reader.get(r.config[m.OPTION])) for r in options),
        key=lambda entry: entry[0],
    )
    usable = [(w, o, r) for w, o, r in entries if r is not None and not flags(o) and not flags(r)]
    left_out = [row for _, o, r in entries for row in (o, r) if row is not None and flags(row)]
    if not usable:
        most = entries[-1][0] if entries else 0
        return Decision(
            WORKERS,
            f"{most} (the most tried: every row that could decide it is flagged)",
            most,
            tuple(not_used(left_out)),
            "",
            True,
            flag_hint(left_out),
        )
    threshold = _number(usable[0][1], m.THRESHOLD)
    evidence = [
        f"{describe_option(o)}; predicted data wait {_number(o, m.PREDICTED_DATA_WAIT_FRACTION):.0%}"
        for _, o, _ in usable
    ]
    evidence += [describe_ratio(r) for _, _, r in usable] + not_used(left_out)
    fed = [(w, o, r) for w, o, r in usable if _number(r, m.RATIO_MEDIAN) > 1]
    if not fed:
        workers, _, ratio = max(usable, key=lambda entry: _number(entry[2], m.RATIO_MEDIAN))
        answer = f"{workers} (the most supply; no count tried keeps the data wait under {threshold:.0%})"
        uncertainty = f"the best count supplies {_number(ratio, m.RATIO_MEDIAN):.2f}x the crops/s the model needs"
        is_open = not settled(ratio)
        hint = settle_hint(ratio, budget_min) if is_open else ""
        return Decision(WORKERS, answer, workers, tuple(evidence), uncertainty, is_open, hint)
    workers, _, ratio = fed[0]
    below = [entry for entry in usable if entry[0] < workers]
    uncertainty = (
        f"{workers} workers supply {_number(ratio, m.RATIO_MEDIAN):.2f}x the crops/s the model needs "
        f"(quartiles {_number(ratio, m.RATIO_Q1):.2f}-{_number(ratio, m.RATIO_Q3):.2f})"
    )
    unsettled = [] if settled(ratio) else [ratio]
    if below:
        fewer, _, fewer_ratio = below[-1]
        uncertainty += f"; {fewer} supply {_number(fewer_ratio, m.RATIO_MEDIAN):.2f}x"
        unsettled += [] if settled(fewer_ratio) else [fewer_ratio]
    answer = f"{workers} (the fewest that keep the data wait under {threshold:.0%})"
    if unsettled:
        return Decision(
            WORKERS,
            answer + "; open",
            workers,
            tuple(evidence),
            uncertainty,
            True,
            settle_hint(unsettled[0], budget_min),
        )
    return Decision(WORKERS, answer, workers, tuple(evidence), uncertainty, False)


def _epoch_range(conversion: float, in_place: Sequence[float], converted: Sequence[float]) -> tuple[float, float]:
    """Break-even epochs from the fastest and the slowest epochs of each side (inf: never)."""

    def epochs(saved: float) -> float:
        return conversion / saved if saved > 0 else math.inf

    return epochs(max(in_place) - min(converted)), epochs(min(in_place) - max(converted))


def _epochs_text(epochs: float) -> str:
    return "never" if not math.isfinite(epochs) else f"{epochs:.1f} epochs"


def decide_convert(records: Iterable[Record], not_compared: str | None = None) -> Decision:
    """Convert or read in place: per training format compared (``compare-formats``' rows), the epochs after
    which converting pays for itself, from whole epochs read in turns, conversion included; ``never`` when
    it never pays. ``not_compared`` says why the formats were left out (the budget), where they were."""
    if not_compared is not None:
        return Decision(
            CONVERT,
            "read in place (no training format compared)",
            None,
            (not_compared,),
            "not measured",
            True,
            "a longer --budget-min",
        )
    rows = [r for r in records if r.track == FORMATS_TRACK]
    measured = [r for r in rows if not r.metrics.get(m.SKIPPED)]
    reference = next((r for r in measured if r.metrics.get(m.READER) == m.REFERENCE), None)
    converted = [r for r in measured if m.CONVERSION_SECONDS in r.metrics]
    if reference is None or not converted:
        reasons = sorted({str(r.metrics.get(m.SKIP_REASON)) for r in rows if r.metrics.get(m.SKIPPED)})
        return Decision(
            CONVERT,
            "read in place (no training format compared)",
            None,
            tuple(reasons) or ("no training format library is installed",),
            "not measured",
            True,
            "install the training formats (bash scripts/setup_formats.sh) and run advise again",
        )
    if flags(reference):
        return Decision(
            CONVERT, "read in place (the in-place row is flagged)", None, tuple(not_used([reference])), "", True,
            flag_hint([reference]),
        )  # fmt: skip
    usable = [r for r in converted if not flags(r) and r.metrics.get(m.IDENTICAL_TO_PLATE) is not False]
    evidence = not_used([r for r in converted if flags(r)])
    evidence += [
        f"not used: {r.case} (its crops differ from the plate's)"
        for r in converted
        if r.metrics.get(m.IDENTICAL_TO_PLATE) is False
    ]
    in_place_epochs = reference.metrics.get(m.prefixed(m.SHUFFLED, m.EPOCH_SECONDS)) or []
    found: list[tuple[float, float, float, Record]] = []
    for row in usable:
        pays = bool(row.metrics.get(m.prefixed(m.INTERLEAVED, m.CONVERTING_PAYS_OFF)))
        epochs = _number(row, m.prefixed(m.INTERLEAVED, m.BREAK_EVEN_EPOCHS)) if pays else math.inf
        own = row.metrics.get(m.prefixed(m.SHUFFLED, m.EPOCH_SECONDS)) or []
        low, high = (
            _epoch_range(_number(row, m.CONVERSION_SECONDS), in_place_epochs, own)
            if in_place_epochs and own
            else (epochs, epochs)
        )
        found.append((epochs, low, high, row))
        evidence.append(
            f"{row.case}: conversion {_number(row, m.CONVERSION_SECONDS):.1f} s, whole epoch "
            f"{_number(row, m.INTERLEAVED_EPOCH_SECONDS):.2f} s against "
            f"{_number(row, m.INTERLEAVED_IN_PLACE_EPOCH_SECONDS):.2f} s in place (read in turns): "
            f"break-even {_epochs_text(epochs)}"
        )
    if not found:
        return Decision(
            CONVERT, "read in place (every converted row is flagged)", None, tuple(evidence), "", True,
            flag_hint(converted),
        )  # fmt: skip
    epochs, low, high, best = min(found, key=lambda entry: (entry[0], entry[1]))
    name = str(best.metrics.get(m.READER, best.case))
    spread = f"from {_epochs_text(low)} to {_epochs_text(high)} over the fastest and slowest epochs of each side"
    if math.isfinite(epochs):
        action = (
            f"re-chunk the plate into layout {name.removeprefix(m.RECHUNKED_PREFIX)} (still OME-Zarr, read in place)"
            if name.startswith(m.RECHUNKED_PREFIX)
            else f"convert to {name}"
        )
        answer = f"{action} if training runs more than {epochs:.1f} epochs (break-even, conversion included)"
        is_open = not math.isfinite(high)
        hint = "more epochs per reader (a longer --budget-min) or an idle machine" if is_open else ""
        return Decision(
            CONVERT, answer, {"format": name, m.BREAK_EVEN_EPOCHS: epochs}, tuple(evidence), spread, is_open, hint
        )
    could = [entry for entry in found if math.isfinite(entry[1])]
    is_open = bool(could)
    hint = "more epochs per reader (a longer --budget-min) or an idle machine" if is_open else ""
    answer = "read in place: converting never pays off"
    return Decision(
        CONVERT,
        answer,
        "never",
        tuple(evidence),
        spread if is_open else "no epoch of any format was faster",
        is_open,
        hint,
    )


def decide(records: Sequence[Record], budget_min: int, not_compared: str | None = None) -> list[Decision]:
    """Every decision, in :data:`QUESTIONS`' order (batch only where it was measured); ``not_compared``: why
    the training formats were not (see :func:`decide_convert`)."""
    batch = decide_batch(records, budget_min)
    found = [
        decide_read_path(records, budget_min),
        decide_workers(records, budget_min),
        *([batch] if batch is not None else []),
        decide_prefetch(records, budget_min),
        decide_pinning(records, budget_min),
        decide_convert(records, not_compared),
    ]
    return found


@dataclass(frozen=True)
class Recommendation:
    """The loader a lab should run: read path, workers, batch, prefetch factor and pinning."""

    decode: str
    workers: int
    batch_size: int
    prefetch: int
    pin_memory: bool

    def matches(self, record: Record) -> bool:
        loader, crop = _loader(record), _crop(record)
        return (
            crop.get("decode") == self.decode
            and loader.get("num_workers") == self.workers
            and loader.get("batch_size") == self.batch_size
            and (loader.get("prefetch_factor") or DEFAULT_PREFETCH) == self.prefetch
            and bool(loader.get("pin_memory")) == self.pin_memory
        )


def _recommended_row(records: Iterable[Record], recommendation: Recommendation) -> Record | None:
    """The last unflagged option row measured at the recommendation; None without one."""
    rows = [
        r
        for r in records
        if r.track == TRACK and m.OPTION in r.config and m.PREDICTED_IMAGES_PER_S in r.metrics and not flags(r)
    ]
    matching = [r for r in rows if recommendation.matches(r)]
    return matching[-1] if matching else None


def prediction(records: Iterable[Record], recommendation: Recommendation) -> dict[str, Any] | None:
    """The loop the last unflagged option row measured at the recommendation predicts; None without one."""
    row = _recommended_row(records, recommendation)
    if row is None:
        return None
    return {
        m.IMAGES_PER_S: _number(row, m.PREDICTED_IMAGES_PER_S),
        m.DATA_WAIT_FRACTION: _number(row, m.PREDICTED_DATA_WAIT_FRACTION),
        "row": row.case,
    }


def supply(records: Iterable[Record], recommendation: Recommendation) -> float | None:
    """Crops/s over whole epochs the recommended loader delivered (its last unflagged row); None without one."""
    row = _recommended_row(records, recommendation)
    return None if row is None else _number(row, m.WHOLE_EPOCH_SAMPLES_PER_S)


def verification(predicted: dict[str, Any] | None, achieved: Record) -> dict[str, Any]:
    """Predicted against achieved images/s and data wait; whether the recommendation holds (achieved within
    :data:`VERIFY_TOLERANCE` of predicted, on an unflagged row), said in one sentence."""
    images, wait = _number(achieved, m.IMAGES_PER_S), _number(achieved, m.DATA_WAIT_FRACTION)
    raised = flags(achieved)
    result: dict[str, Any] = {
        "predicted": None if predicted is None else {k: predicted[k] for k in (m.IMAGES_PER_S, m.DATA_WAIT_FRACTION)},
        "achieved": {m.IMAGES_PER_S: images, m.DATA_WAIT_FRACTION: wait},
        "row": achieved.case,
        m.VALIDITY_FLAGS: raised,
    }
    if predicted is None:
        result.update(holds=None, statement="no unflagged row measured the recommendation: nothing to predict")
        return result
    expected = float(predicted[m.IMAGES_PER_S])
    ratio = images / expected if expected > 0 else math.nan
    holds = bool(abs(ratio - 1.0) <= VERIFY_TOLERANCE)
    achieved_text = f"achieved {images:,.0f} images/s, data wait {wait:.0%}"
    predicted_text = f"predicted {expected:,.0f} images/s, data wait {float(predicted[m.DATA_WAIT_FRACTION]):.0%}"
    if holds:
        statement = f"the recommendation holds: {achieved_text}; {predicted_text} (within {VERIFY_TOLERANCE:.0%})"
    else:
        side = "below" if ratio < 1 else "above"
        statement = (
            f"the recommendation does NOT hold: {achieved_text}, {abs(ratio - 1):.0%} {side} the {predicted_text} "
            f"(outside {VERIFY_TOLERANCE:.0%}): the loader and the model measured apart do not add up on this "
            "machine (on a CPU the model's compute and the workers share the cores)"
        )
    if raised:
        statement += f"; the loop's row is flagged ({', '.join(raised)}): it checks the wiring, not the prediction"
    result.update(ratio=ratio, holds=holds, statement=statement)
    return result


def advice_document(
    decisions: Sequence[Decision], checked: dict[str, Any] | None, context: dict[str, Any]
) -> dict[str, Any]:
    """What ``advice.json`` holds: the run (``context``), every decision and the verification."""
    return {**context, "decisions": [d.to_json() for d in decisions], "verification": checked}


def write_advice(document: dict[str, Any], out_dir: str | Path) -> Path:
    """``out_dir/advice.json``, written whole beside a temporary name and moved into place."""
    path = Path(out_dir) / ADVICE_NAME
    partial = path.with_name(f".{ADVICE_NAME}.partial")
    with partial.open("w", encoding="utf-8") as handle:  # one document, not result rows (those go through RecordWriter)
        json.dump(document, handle, indent=2, allow_nan=False, default=str)
        handle.write("\n")
    os.replace(partial, path)
    return path


def advice_text(decisions: Sequence[Decision], checked: dict[str, Any] | None) -> str:
    """The short answer on the terminal: one line per decision (open ones say what would settle them), then
    the verification."""
    width = max(len(d.question) for d in decisions) if decisions else 0
    lines = ["Advice:"]
    for decision in decisions:
        lines.append(f"  {decision.question:<{width}}  {decision.answer}")
        if decision.uncertainty:
            lines.append(f"  {'':<{width}}    {decision.uncertainty}")
        if decision.open and decision.settle:
            lines.append(f"  {'':<{width}}    open: to settle it, {decision.settle}")
    if checked is not None:
        lines.append(f"Verification: {checked['statement']}")
    return "\n".join(lines)


__all__ = [
    "ADVICE_NAME",
    "BATCH",
    "CONVERT",
    "PINNING",
    "PREFETCH",
    "QUESTIONS",
    "READ_PATH",
    "TRACK",
    "VERIFY_TOLERANCE",
    "WORKERS",
    "Decision",
    "Recommendation",
    "advice_document",
    "advice_text",
    "decide",
    "decide_batch",
    "decide_convert",
    "decide_pinning",
    "decide_prefetch",
    "decide_read_path",
    "decide_workers",
    "flags",
    "prediction",
    "question_rows",
    "verification",
    "write_advice",
]
