"""The headline table: track ``targets``' ratios over several committed runs, rendered as Markdown
between two marker comments in one docs page, so the figures the docs quote come from rows, never
from typing.

The rows are every ``*.jsonl`` under one folder (``measurements/targets/`` in this repository), as
``cropbench run --track targets`` writes them. A *run* is one ``cropbench run`` (one ``run_id``);
within a run each ratio is the median, over its repeats, of the row's median per-block paired ratio.
A cell of the table is the median of those run values, with the lowest and highest run. A ratio to
the copy ceiling above 1 is marked ``impossible`` (no reader of the same crops can pass the ceiling),
whether or not the rows were written with the flag. The commit, the machine and the load average
the runs saw are read from the rows too.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cropbench import metrics as m
from cropbench.errors import OutputError
from cropbench.harness.flags import IMPOSSIBLE, row_flags
from cropbench.records import Record, read_records

#: The track whose rows the headline reads.
TRACK = "targets"
#: Where the rows and the table live, relative to the repository root.
ROWS_FOLDER = "measurements/targets"
PAGE = "docs/results/decode-paths.md"
#: The marker lines around the generated table; everything between them is replaced.
START = "<!-- headline:start -->"
END = "<!-- headline:end -->"
#: Names of the rows' references: the copy ceiling's start with this.
CEILING_PREFIX = "ceiling-"
#: Access patterns in the order the table shows them (others follow in the order found).
ACCESS_ORDER = ("random", "grouped")
#: The command that regenerates the table, as the page tells its reader.
REGENERATE = "cropbench headline"


def read_rows(source: str | Path) -> list[Record]:
    """Track ``targets``' rows of every ``*.jsonl`` under ``source`` (a folder, or one file), in file
    name order; none when ``source`` does not exist."""
    path = Path(source)
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(path.rglob("*.jsonl"))
    else:
        return []
    return [record for file in files for record in read_records(file) if record.track == TRACK]


@dataclass(frozen=True)
class RatioKey:
    """One line of the table: the direct reader ``reader`` (at ``threads`` decode threads) over ``reference``."""

    reader: str
    threads: int
    reference: str

    @property
    def ceiling(self) -> bool:
        return self.reference.startswith(CEILING_PREFIX)


@dataclass
class Cell:
    """One ratio in one access pattern: each run's value, and how many rows were impossible."""

    runs: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    impossible_rows: int = 0
    rows: int = 0
    ceiling_threads: set[int] = field(default_factory=set)
    tuning: dict[str, None] = field(default_factory=dict)
    different_crops: bool = False

    def run_values(self) -> list[float]:
        return [statistics.median(values) for values in self.runs.values()]


def _is_ratio(record: Record) -> bool:
    return "reference_name" in record.config and m.RATIO_MEDIAN in record.metrics


def _is_summary(record: Record) -> bool:
    return m.LOADAVG_START in record.metrics


def _threads(record: Record) -> int:
    reader = record.config.get("reader")
    if isinstance(reader, dict) and "decode_threads" in reader:
        return int(reader["decode_threads"])
    raise OutputError(f"targets row {record.case!r} (run {record.run_id}) names no decode_threads for its reader")


def describe_tuning(tuning: dict[str, Any]) -> str:
    """A reader's tuning as one line of ``name value`` pairs: nested settings by their own name (a
    ``limit`` by its setting's), byte counts in MiB."""
    pairs: list[str] = []

    def walk(settings: dict[str, Any], parent: str) -> None:
        for key, value in settings.items():
            name = parent if key in ("limit", "total_bytes_limit") and parent else key
            if isinstance(value, dict):
                walk(value, key)
            elif "bytes" in key and isinstance(value, (int, float)) and not isinstance(value, bool):
                pairs.append(f"{name} {value / 2**20:,.0f} MiB")
            else:
                pairs.append(f"{name} {value}")

    walk(tuning, "")
    return ", ".join(pairs)


def _reference_name(key: RatioKey, ceiling_threads: set[int]) -> str:
    if key.ceiling:
        counts = "/".join(str(t) for t in sorted(ceiling_threads)) or "?"
        noun = "thread" if ceiling_threads == {1} else "threads"
        return f"the copy ceiling at {counts} {noun} (`{key.reference}`)"
    return f"`{key.reference}`"


def _spread(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def _cell_text(cell: Cell | None, runs: int, ceiling: bool) -> str:
    if cell is None or not cell.runs:
        return "–"
    values = cell.run_values()
    text = _spread(values)
    if len(values) < runs:
        text += f" in {len(values)} of {runs} runs"
    if cell.impossible_rows or (ceiling and statistics.median(values) > 1.0):
        text += f", **{IMPOSSIBLE}** in {cell.impossible_rows} of {cell.rows} rows"
    if cell.different_crops:
        text += ", **not the same crops**"
    return text


def _one(values: Iterable[str], what: str) -> str:
    """The one value, or every distinct one named as ``what``; "" when there is none."""
    found = sorted(set(values))
    return found[0] if len(found) == 1 else f"{what}: " + "; ".join(found) if found else ""


def _machine(environment: dict[str, Any]) -> str:
    ram = environment.get("ram_bytes")
    cores = environment.get("cpu_affinity") or environment.get("cpu_logical")
    parts = [
        str(environment.get("cpu_model") or "unknown CPU"),
        f"{cores} usable of {environment.get('cpu_logical')} logical cores",
        f"{ram / 2**30:.0f} GiB" if isinstance(ram, (int, float)) else "RAM unknown",
        str(environment.get("machine") or "?"),
    ]
    return ", ".join(parts)


def _commit(environment: dict[str, Any]) -> str:
    commit = environment.get("cropbench_commit")
    if not commit:
        return "unknown"
    head, dirty, _ = str(commit).partition("-dirty")
    return head[:7] + ("-dirty" if dirty else "")


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _range(values: Sequence[int]) -> str:
    return str(min(values)) if min(values) == max(values) else f"{min(values)}–{max(values)}"


def headline(records: Sequence[Record], source: str = ROWS_FOLDER) -> str:
    """The headline table of track ``targets``' rows, with where they came from; a line saying how to
    measure them when there are none."""
    records = [record for record in records if record.track == TRACK]
    if not records:
        return (
            f"No rows in `{source}/` yet, so no figures: measure them as this section says and run `{REGENERATE}`. "
            "Until then this page quotes no ratio."
        )
    machines = {_machine(record.environment) for record in records}
    if len(machines) > 1:
        raise OutputError(
            f"the rows in {source} come from {len(machines)} machines ({'; '.join(sorted(machines))}); "
            "a headline is one machine's: keep one machine's rows there"
        )
    cells: dict[tuple[str, RatioKey], Cell] = {}
    accesses: dict[str, None] = {}
    keys: dict[RatioKey, None] = {}
    repeats: dict[str, set[int]] = defaultdict(set)
    different: set[tuple[str, str, str]] = set()  # (run, access, reader) whose crops were not the direct reader's
    for record in records:
        repeats[record.run_id].add(record.repeat)
        if record.metrics.get(m.IDENTICAL_TO_DIRECT) is False:
            case = record.config.get("case") or {}
            different.add((record.run_id, str(case.get("access")), str(record.config.get("reader_name"))))
        if not _is_ratio(record):
            continue
        access = str(record.config["access"])
        key = RatioKey(str(record.config["reader_name"]), _threads(record), str(record.config["reference_name"]))
        accesses[access] = None
        keys[key] = None
        cell = cells.setdefault((access, key), Cell())
        ratio = float(record.metrics[m.RATIO_MEDIAN])
        cell.runs[record.run_id].append(ratio)
        cell.rows += 1
        cell.impossible_rows += IMPOSSIBLE in row_flags(record) or (key.ceiling and ratio > 1.0)
        if m.CEILING_THREADS in record.metrics:
            cell.ceiling_threads.add(int(record.metrics[m.CEILING_THREADS]))
        cell.tuning[describe_tuning(record.config.get("reference") or {})] = None
    if not cells:
        raise OutputError(f"the rows in {source} hold no ratio of track targets (rows of a smoke run cut short?)")
    for (access, key), cell in cells.items():
        cell.different_crops = any(
            (run, access, reader) in different for run in cell.runs for reader in (key.reader, key.reference)
        )
    order = [a for a in ACCESS_ORDER if a in accesses] + [a for a in accesses if a not in ACCESS_ORDER]
    peers = list(dict.fromkeys(k.reference for k in keys if not k.ceiling))
    ordered_keys = sorted(keys, key=lambda k: (-1 if k.ceiling else peers.index(k.reference), k.threads))
    runs = len(repeats)
    lines = [_provenance(records, runs, [len(r) for r in repeats.values()], source), ""]
    lines.append("| `direct`, batched | over | the reference's tuning | " + " | ".join(order) + " |")
    lines.append("| --- | --- | --- |" + " --- |" * len(order))
    for key in ordered_keys:
        row_cells = [cells.get((access, key)) for access in order]
        present = [cell for cell in row_cells if cell is not None]
        threads = set().union(*(cell.ceiling_threads for cell in present))
        tuning = " / ".join(dict.fromkeys(t for cell in present for t in cell.tuning))
        reader = _count(key.threads, "decode thread")
        reference = _reference_name(key, threads)
        lines.append(
            f"| {reader} | {reference} | {tuning} | "
            + " | ".join(_cell_text(c, runs, key.ceiling) for c in row_cells)
            + " |"
        )
    return "\n".join(lines)


def _provenance(records: Sequence[Record], runs: int, repeats: Sequence[int], source: str) -> str:
    """Where the figures come from: runs, repeats, plate, case sizes, commit, machine, load average."""
    summaries = [record for record in records if _is_summary(record)]
    loads = [
        float(load[0])
        for record in summaries
        for load in (record.metrics.get(m.LOADAVG_START), record.metrics.get(m.LOADAVG_END))
        if load
    ]
    plates = _one((f"`{Path(str(r.config.get('plate', '?'))).name}`" for r in records), "plates")
    layouts = _one((str(r.config.get("layout", "?")) for r in records), "layouts")
    sizes = _one(
        (
            f"{r.config.get('objects', 0):,} crops of {r.config.get('crop_size', '?')} px in blocks of "
            f"{r.config.get('block', '?')}, {_count(int(r.config.get('rounds', 0)), 'round')}, batches of "
            f"{r.config.get('batch', '?')}"
            for r in summaries
        ),
        "cases",
    )
    commits = sorted({_commit(record.environment) for record in records})
    systems = _one((str(record.environment.get("os") or "?") for record in records), "systems")
    fractions = [
        float(r.metrics[m.CHUNK_CACHE_FRACTION_OF_PLATE])
        for r in summaries
        if m.CHUNK_CACHE_FRACTION_OF_PLATE in r.metrics
    ]
    cache = _one((f"{f:.0%}" for f in fractions), "fractions") if fractions else "not recorded"
    repeat = "repeats" if max(repeats) > 1 else "repeat"
    load = f"{min(loads):.2f}–{max(loads):.2f}" if loads else "not recorded"
    return (
        f"Generated by `{REGENERATE}` from the rows in `{source}/`: {_count(runs, 'run')} of "
        f"`cropbench run --track targets` ({_range(repeats)} {repeat} each) on the {plates} plate "
        f"({layouts} layout), each case {sizes or 'not recorded'}, the direct reader's decoded-chunk cache "
        f"(and tensorstore's cache pool) at {cache} of the decoded plate; "
        f"{'commit' if len(commits) == 1 else 'commits'} {', '.join(f'`{c}`' for c in commits)}; "
        f"{_machine(records[0].environment)}, {systems}; 1-minute load average {load} over the runs. "
        "Each cell: the median over runs of each run's median per-block paired ratio (its repeats' median), "
        "with the lowest and highest run. Over the copy ceiling a ratio above 1 is impossible and marked so."
    )


def block(records: Sequence[Record], source: str = ROWS_FOLDER) -> str:
    """The page's generated block, markers included."""
    note = f"<!-- generated from {source}/ by {REGENERATE}: edit the rows, not this block -->"
    return f"{START}\n{note}\n\n{headline(records, source)}\n\n{END}"


def _bounds(text: str, where: str) -> tuple[int, int]:
    starts, ends = text.count(START), text.count(END)
    if starts != 1 or ends != 1:
        raise OutputError(
            f"{where} holds {starts} {START!r} and {ends} {END!r} lines; expected one of each around the headline table"
        )
    start, end = text.index(START), text.index(END) + len(END)
    if end < start:
        raise OutputError(f"{where}: {END!r} comes before {START!r}")
    return start, end


def current_block(text: str, where: str = PAGE) -> str:
    """The block between the markers of ``text`` (markers included)."""
    start, end = _bounds(text, where)
    return text[start:end]


def replace_block(text: str, new_block: str, where: str = PAGE) -> str:
    """``text`` with its block between the markers replaced by ``new_block``."""
    start, end = _bounds(text, where)
    return text[:start] + new_block + text[end:]


def regenerate(rows: str | Path, page: str | Path, source: str = ROWS_FOLDER) -> bool:
    """Rewrite ``page``'s block from the rows under ``rows``; whether the page changed."""
    path = Path(page)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise OutputError(f"cannot read the page {path}: {error.strerror or error}") from error
    updated = replace_block(text, block(read_rows(rows), source), str(path))
    if updated == text:
        return False
    try:
        path.write_text(updated, encoding="utf-8")
    except OSError as error:
        raise OutputError(f"cannot write the page {path}: {error.strerror or error}") from error
    return True


__all__ = [
    "END",
    "PAGE",
    "ROWS_FOLDER",
    "START",
    "block",
    "current_block",
    "describe_tuning",
    "headline",
    "read_rows",
    "regenerate",
    "replace_block",
]
