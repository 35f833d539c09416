"""The one loop every track runs in: skip and resume, repeats and seeds, progress, decode applicability,
and the records.

A track only plans its cases for a preset and measures one case; the loop owns the rest. Each case
is identified by :func:`case_identity` (its canonical config, the plate's fingerprint and layout),
not by its label: ``--resume`` into results of another plate, layout or sample count measures again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, Self, TypeVar, runtime_checkable

from cropbench import metrics as m
from cropbench.config import CropConfig, CropOverrides
from cropbench.errors import ConfigError, UnusedSettingError
from cropbench.harness.flags import decide, decide_run, row_flags
from cropbench.harness.time_left import TimeLeft
from cropbench.records import DATASET_TRACK, FORMER_VALUES, Record, jsonable


class Site(Protocol):
    """Where a run measures, as the loop needs it: the plate's identity and layout (or, for a track
    that writes its own plates, the work folder's), the machine, progress, and the run's knobs.
    :class:`~cropbench.harness.context.RunContext` is the site of a plate,
    :class:`~cropbench.harness.work.WorkSite` that of a work folder."""

    @property
    def environment(self) -> dict[str, Any]: ...

    @property
    def thread_settings(self) -> dict[str, Any]: ...

    @property
    def overrides(self) -> CropOverrides | None: ...

    @property
    def server_requests_per_s(self) -> float | None: ...

    @property
    def local(self) -> Self | None: ...

    @property
    def fingerprint(self) -> str: ...

    @property
    def layout(self) -> str: ...

    @property
    def location(self) -> str: ...

    @property
    def remote(self) -> dict[str, Any] | None: ...

    @property
    def decodes(self) -> tuple[str, ...]: ...

    def progress(self, message: str) -> None: ...


#: The site a track measures at: a plate (RunContext) or a work folder (WorkSite).
S = TypeVar("S", bound=Site)
S_contra = TypeVar("S_contra", bound=Site, contravariant=True)


class Case(Protocol):
    """A planned measurement: a frozen dataclass with a display label."""

    @property
    def label(self) -> str: ...


@dataclass(frozen=True)
class Row:
    """What a track measured for one case and repeat.

    ``case`` is the case as planned (before the repeat's seed): it gives the label and identity;
    ``config`` is what actually ran (with the repeat's seed).
    """

    case: Any
    config: dict[str, Any]
    metrics: dict[str, Any]
    seed: int


class Track(Protocol[S_contra]):
    """A benchmark track: its cases for a preset, and the measurement of one case at a site (a plate's
    :class:`RunContext` unless it says otherwise)."""

    name: str

    def cases(self, preset: str, context: S_contra) -> Sequence[Any]:
        """The preset's cases, in the order they run."""
        ...

    def decode(self, case: Any) -> str | None:
        """The decode path the case needs (skipped where the plate's layout lacks it), or None."""
        ...

    def measure(self, case: Any, repeat: int, context: S_contra) -> Iterator[Row]:
        """Measure ``case`` for ``repeat``: its row, after any rows of the cases it is made of."""
        ...


def seeded(case: Any, repeat: int) -> Any:
    """The case with ``seed + repeat``: repeats differ only in their seed."""
    return dataclasses.replace(case, seed=case.seed + repeat)


def with_overrides(case: Any, overrides: CropOverrides | None) -> Any:
    """``case`` with the run's crop overrides: applied to its ``crop``, or to its own fields of the knobs'
    names (a case that keeps ``crop_size`` or ``decode`` flat), and within the settings it is made of
    (the case a case across ranks or a worker search wraps, a peer comparison). A knob the case has no
    place for is an :class:`~cropbench.errors.UnusedSettingError` naming the option, never dropped in
    silence."""
    changes = overrides.changes() if overrides is not None else {}
    if overrides is None or not changes:
        return case
    changed, used = _reach(case, overrides)
    unused = [knob for knob in changes if knob not in used]
    if unused:
        options = ", ".join("--" + knob.replace("_", "-") for knob in unused)
        raise UnusedSettingError(
            f"{options} does not reach the case {case.label} ({type(case).__name__}, which has no such knob); "
            "drop the option or run the track without it"
        )
    return changed


def _reach(value: Any, overrides: CropOverrides) -> tuple[Any, set[str]]:
    """``value`` with the overrides it has a place for, and the knobs that found one."""
    changes = overrides.changes()
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return value, set()
    crop = getattr(value, "crop", None)
    if isinstance(crop, CropConfig):
        return dataclasses.replace(value, crop=overrides.apply(crop)), set(changes)
    updates: dict[str, Any] = {}
    used: set[str] = set()
    for field in dataclasses.fields(value):
        if field.name in changes:
            updates[field.name] = changes[field.name]
            used.add(field.name)
            continue
        inner, reached = _reach(getattr(value, field.name), overrides)
        if reached:
            updates[field.name] = inner
            used |= reached
    return (dataclasses.replace(value, **updates) if updates else value), used


def canonical_config(case: Any) -> dict[str, Any]:
    """The case's knobs as plain data (a frozen dataclass's fields)."""
    return dataclasses.asdict(case)


def case_identity(track: str, case: Any, context: Site) -> str:
    """Stable hash of the track, the planned case's canonical config, the plate fingerprint, layout and threads."""
    document = {
        # A renamed track hashes the value its rows first carried, so --resume still matches them.
        "track": FORMER_VALUES.get(track, track),
        "config": canonical_config(case),
        "plate": context.fingerprint,
        "layout": context.layout,
        "threads": context.thread_settings,
    }
    text = json.dumps(document, sort_keys=True, default=jsonable, allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def store_metrics(
    remote: dict[str, Any] | None, measured: dict[str, Any], server_requests_per_s: float | None = None
) -> dict[str, Any]:
    """A remote plate's row: the reader's reads and fetched bytes per crop as requests and bytes
    transferred, with the in-flight limit and injected latency it ran under (and the server's ceiling
    where it was measured); nothing for a local plate."""
    if remote is None:
        return {}
    store = remote["store"]
    metrics: dict[str, Any] = {m.IN_FLIGHT: store["in_flight"], m.INJECTED_LATENCY_MS: store["latency_ms"]}
    if server_requests_per_s is not None:
        metrics[m.SERVER_REQUESTS_PER_S] = server_requests_per_s
    for source, name in (
        (m.READS_PER_CROP, m.REQUESTS_PER_CROP),
        (m.BYTES_FETCHED_PER_CROP, m.BYTES_TRANSFERRED_PER_CROP),
        (m.FETCH_AMPLIFICATION, m.BYTES_TRANSFERRED_PER_DELIVERED_BYTE),
    ):
        if source in measured:
            metrics[name] = measured[source]
    return metrics


#: Tracks whose cases are also measured on the local plate beside a plate in a store.
LOCAL_REFERENCE_TRACKS = (DATASET_TRACK, "remote")


def local_rates(track: Track[S], case: Any, repeat: int, context: S) -> dict[str, float]:
    """samples/s of ``case`` on the same plate on local disk (``context.local``), by row label, measured
    just before the store's rows so both see the same machine; empty when there is nothing to compare."""
    if context.local is None or context.remote is None or track.name not in LOCAL_REFERENCE_TRACKS:
        return {}
    context.progress(f"track {track.name} {case.label} (repeat {repeat}, local plate)")
    return {
        row.case.label: float(row.metrics[m.SAMPLES_PER_S])
        for row in track.measure(case, repeat, context.local)
        if m.SAMPLES_PER_S in row.metrics
    }


def ratio_to_local(local_samples_per_s: float | None, measured: dict[str, Any]) -> dict[str, Any]:
    """A store row's samples/s over the local plate's for the same case; nothing without a local rate."""
    if not local_samples_per_s or m.SAMPLES_PER_S not in measured:
        return {}
    return {
        m.LOCAL_SAMPLES_PER_S: local_samples_per_s,
        m.RATIO_TO_LOCAL: float(measured[m.SAMPLES_PER_S]) / local_samples_per_s,
    }


@runtime_checkable
class CaseCounter(Protocol):
    """A progress display that also shows how many of the planned cases are done and the time left
    (:class:`~cropbench.harness.time_left.TimeLeft`'s estimate; None before a case has finished)."""

    def cases(self, done: int, total: int, left_s: float | None = None, case_s: float | None = None) -> None:
        """``done`` of ``total`` cases measured; ``left_s`` the seconds the unfinished ones should take,
        ``case_s`` those of the one starting now (None: nothing measured yet to say)."""
        ...


@dataclass(frozen=True)
class Planned(Generic[S]):
    """One case and repeat a run will measure."""

    track: Track[S]
    case: Any
    repeat: int


def plan(
    tracks: Sequence[Track[S]],
    preset: str,
    context: S,
    *,
    repeats: int = 1,
    done: Collection[tuple[str, str, int]] = frozenset(),
) -> list[Planned[S]]:
    """Every case and repeat of ``tracks`` still to measure, in the order they run.

    Cases the overrides made identical run once; cases the overrides make invalid (uint16 and a tier, say)
    are left out; an override a case has no place for fails the plan; cases whose decode path the plate's layout lacks,
    and rows already in ``done`` (``--resume``), are left out, each skip said through progress.
    """
    planned: list[Planned[S]] = []
    for track in tracks:
        seen: set[str] = set()
        for preset_case in track.cases(preset, context):
            try:
                case = with_overrides(preset_case, context.overrides)
            except UnusedSettingError:
                raise
            except ConfigError as error:
                context.progress(f"track {track.name} {preset_case.label}: not run with the overrides ({error})")
                continue
            identity = case_identity(track.name, case, context)
            if identity in seen:
                continue
            seen.add(identity)
            decode = track.decode(case)
            if decode is not None and decode not in context.decodes:
                context.progress(f"track {track.name} {case.label}: decode {decode} does not apply to {context.layout}")
                continue
            planned += [Planned(track, case, r) for r in range(repeats) if (track.name, identity, r) not in done]
    return planned


def run_tracks(
    tracks: Sequence[Track[S]],
    preset: str,
    context: S,
    emit: Callable[[Record], None],
    *,
    repeats: int = 1,
    done: Collection[tuple[str, str, int]] = frozenset(),
    counter: CaseCounter | None = None,
    earlier: Sequence[Record] = (),
    amend: Callable[[list[Record]], None] | None = None,
) -> list[Record]:
    """Run every case of every track ``repeats`` times, handing each record to ``emit`` at once, its
    flags decided (:func:`cropbench.harness.flags.decide`) against the rows measured before it.

    ``done`` holds the ``Record.key`` of rows already measured (``--resume``); they are not measured
    again, and rows a case is made of (a worker search's steps) are not written twice; ``earlier`` are
    those rows, which this run's rows are judged beside. Every record of the call shares one ``run_id``.
    ``counter`` is told the cases done out of those planned, before the first and after each.
    Once every case is measured, each row is decided again against every row of the run (a ceiling
    measured after a row counts too); where any row's flags changed, ``amend`` is given the run's rows
    (in the order emitted) to write over those emitted. Returns the run's rows as finally decided.
    """
    run_id = uuid.uuid4().hex[:12]
    measured: list[Record] = []  # as the tracks wrote them, before the runner decided their flags
    written: list[Record] = []
    cases = plan(tracks, preset, context, repeats=repeats, done=done)
    left = TimeLeft([(item.track.name, item.case) for item in cases])
    for finished, item in enumerate(cases):
        track, case, repeat = item.track, item.case, item.repeat
        if counter is not None:
            counter.cases(finished, len(cases), left.seconds(), left.current())
        started = time.monotonic()
        local = local_rates(track, case, repeat, context)
        context.progress(f"track {track.name} {case.label} (repeat {repeat})")
        for row in track.measure(case, repeat, context):
            case_id = case_identity(track.name, row.case, context)
            if row.case is not case and (track.name, case_id, repeat) in done:
                continue
            config = {
                "plate": context.location,
                "layout": context.layout,
                "threads": context.thread_settings,
                **({"store": context.remote["store"]} if context.remote is not None else {}),
                **row.config,
            }
            record = Record(
                track=track.name,
                case=row.case.label,
                case_id=case_id,
                config=config,
                # What a row measured of its own store settings wins over the run's.
                metrics={
                    **store_metrics(context.remote, row.metrics, context.server_requests_per_s),
                    **row.metrics,
                    **ratio_to_local(local.get(row.case.label), row.metrics),
                },
                environment=context.environment,
                seed=row.seed,
                repeat=repeat,
                run_id=run_id,
            )
            measured.append(record)
            # Numbers that cannot all be true are flagged as written: within the row, or against a
            # ceiling measured before it in this run.
            record = decide(record, [*earlier, *measured])
            emit(record)
            written.append(record)
        left.finish(time.monotonic() - started)
    if counter is not None:
        counter.cases(len(cases), len(cases), 0.0)
    final = decide_run(measured, earlier)
    if amend is not None and any(_decision(a) != _decision(b) for a, b in zip(final, written, strict=True)):
        amend(final)
    return final


def _decision(record: Record) -> tuple[list[str], object]:
    """What the runner decided of a row: its flags and why it is impossible."""
    return row_flags(record), record.metrics.get(m.IMPOSSIBLE_REASONS)
