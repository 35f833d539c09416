"""Two asv runs of one release history side by side: how far a history repeats, release by release.

One wall-time value per release resolves nothing smaller than the run-to-run spread, which one run cannot
show. A history measured twice, each pass into its own results folder (``scripts/walltime_history.sh``),
gives two values per release and benchmark case; this sets them side by side with run 2 / run 1, names
each commit by its release (the commits ``scripts/release_histories.json`` records), and sums up each case:
the ratio's range over the releases beside the spread of run 1's values across the releases, so a step
between releases can be told from the spread between runs.

    cropbench history-spread results-zarr-walltime/run-1 results-zarr-walltime/run-2
    cropbench history-spread RUN1 RUN2 --config asv.ome-arrow.conf.json
    cropbench history-spread RUN1 RUN2 --site results-zarr    # and draw both runs on the site

``--site`` puts both runs on the library's published site: run 1's values of the measured benchmarks
replace the machine's own in ``results-<library>/<machine>/`` (the history the site draws), and run 2's go
to ``<machine>-repeat/``, a second machine, so each of those graphs draws two lines. Everything is checked
before anything is written, and filing the same runs again gives the same files.

Exit code: 0 when both runs hold the same releases and cases; 1 when a release (or a case) was measured in
one run only (the table marks it ``missing``, and nothing is filed into the site); 2 for a folder that
holds no asv results, a run the site cannot take, or a bad argument.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cropbench.history import REPO
from cropbench.history.library_gate import read_config
from cropbench.history.releases import RECORDED, HistoryError, recorded_releases

#: What a cell says where a run has no result for a release and case, and where its benchmark skipped or failed.
MISSING, SKIPPED = "missing", "skipped"
#: The suffix of the machine name under which ``--site`` files the second run.
REPEAT_SUFFIX = "-repeat"
#: Files in an asv machine folder that are not results.
MACHINE_FILE = "machine.json"
SUITE_FILE = "benchmarks.json"


class SpreadError(RuntimeError):
    """A folder holds no asv results (or more than one machine's), or the site cannot take a run."""


#: One run's values: commit -> benchmark with its parameters (as asv's ``-b`` spells it) -> value, None
#: where the benchmark skipped or failed.
Values = dict[str, dict[str, float | None]]


def _value(value: object) -> float | None:
    """A result cell as a number; a failed (None) or skipped (NaN) one as None."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def machine_folder(results_dir: Path) -> Path:
    """The one machine folder of an asv results folder: two values per release mean one machine per run."""
    if not results_dir.is_dir():
        raise SpreadError(f"{results_dir} is not a folder of asv results")
    machines = sorted(path for path in results_dir.iterdir() if (path / MACHINE_FILE).is_file())
    if len(machines) != 1:
        found = ", ".join(path.name for path in machines) or "none"
        raise SpreadError(f"{results_dir} must hold one asv machine folder (with {MACHINE_FILE}); found {found}")
    return machines[0]


def result_files(machine: Path) -> list[Path]:
    """The result files of one machine folder (one per commit and environment)."""
    return sorted(path for path in machine.glob("*.json") if path.name not in (MACHINE_FILE, SUITE_FILE))


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise SpreadError(f"{path} is not an asv result file ({error})") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), dict) or "commit_hash" not in data:
        raise SpreadError(f"{path} is not an asv result file (no commit_hash or results)")
    return data


def row_values(name: str, row: Sequence[Any], columns: Sequence[str]) -> dict[str, float | None]:
    """One benchmark's row of a result file as benchmark with parameters -> value (asv 0.6's format 2)."""
    cells = dict(zip(columns, row, strict=False))
    result, params = cells.get("result"), cells.get("params") or []
    if not params:
        return {name: _value(result[0] if isinstance(result, list) and result else result)}
    combinations = list(itertools.product(*params))
    found = result if isinstance(result, list) else [None] * len(combinations)
    return {
        f"{name}({', '.join(combination)})": _value(value)
        for combination, value in zip(combinations, found, strict=False)
    }


def run_values(results_dir: Path) -> Values:
    """Every value of one run: its machine folder's result files, read as asv writes them."""
    values: Values = {}
    for path in result_files(machine_folder(results_dir)):
        data = _load(path)
        columns = data.get("result_columns") or ["result", "params"]
        commit = values.setdefault(str(data["commit_hash"]), {})
        for name, row in data["results"].items():
            commit.update(row_values(name, row, columns))
    return values


def release_names(library: str, recorded: Path | None = None) -> dict[str, str]:
    """Commit -> release of ``library``, in release order, from the recorded release histories."""
    return {commit: version for version, (_, commit) in recorded_releases(library, recorded).items()}


@dataclass(frozen=True)
class Pair:
    """One release's values of one benchmark case in the two runs: a number, or ``MISSING`` / ``SKIPPED``."""

    release: str
    benchmark: str
    first: float | str
    second: float | str

    @property
    def ratio(self) -> float | None:
        """run 2 / run 1, where both runs measured a positive value."""
        if isinstance(self.first, float) and isinstance(self.second, float) and self.first > 0:
            return self.second / self.first
        return None

    @property
    def missing(self) -> bool:
        """Whether one run lacks this release and case altogether (not a skip: no result was written)."""
        return MISSING in (self.first, self.second)


def _cell(values: Mapping[str, float | None], benchmark: str) -> float | str:
    if benchmark not in values:
        return MISSING
    value = values[benchmark]
    return SKIPPED if value is None else value


def pairs(first: Values, second: Values, names: Mapping[str, str]) -> list[Pair]:
    """Each release and benchmark case either run holds, releases in order (commits no release history
    records last, by their hash), cases by name; the cases neither run measured (skipped in both) left out."""
    order = {commit: index for index, commit in enumerate(names)}
    commits = sorted(first.keys() | second.keys(), key=lambda commit: (order.get(commit, len(order)), commit))
    found: list[Pair] = []
    for commit in commits:
        one, two = first.get(commit, {}), second.get(commit, {})
        for benchmark in sorted(one.keys() | two.keys()):
            pair = Pair(names.get(commit, commit[:10]), benchmark, _cell(one, benchmark), _cell(two, benchmark))
            if pair.first == pair.second == SKIPPED:
                continue
            found.append(pair)
    return found


def skipped_in_both(first: Values, second: Values, names: Mapping[str, str]) -> list[str]:
    """Releases at which every case was skipped in both runs (a release that cannot run the benchmarks)."""
    releases = []
    for commit in names:
        one, two = first.get(commit), second.get(commit)
        if one and two and all(value is None for value in [*one.values(), *two.values()]):
            releases.append(names[commit])
    return releases


def _number(value: float | str) -> str:
    """A value as the results pages print them: counts whole with separators, ratios to one or two decimals."""
    if isinstance(value, str):
        return value
    size = abs(value)
    if size >= 1000:
        return f"{value:,.0f}"
    return f"{value:.1f}" if size >= 10 else f"{value:.2f}" if size >= 1 else f"{value:.3g}"


def table(found: Sequence[Pair], library: str) -> str:
    """The Markdown table of every release and case: run 1, run 2 and run 2 / run 1."""
    lines = [f"| {library} | benchmark | run 1 | run 2 | run 2 / run 1 |", "| --- | --- | --- | --- | --- |"]
    for pair in found:
        ratio = "" if pair.ratio is None else f"{pair.ratio:.4f}"
        lines.append(
            f"| {pair.release} | `{pair.benchmark}` | {_number(pair.first)} | {_number(pair.second)} | {ratio} |"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class Summary:
    """One case over the releases: the range of run 2 / run 1, and how far run 1's values range across the
    releases (largest / smallest), the step a history would have to show to stand out of the runs' spread."""

    benchmark: str
    releases: int
    low: float
    median: float
    high: float
    across: float


def summaries(found: Iterable[Pair]) -> list[Summary]:
    """Each case measured in both runs at one release or more, by name."""
    ratios: dict[str, list[float]] = {}
    firsts: dict[str, list[float]] = {}
    for pair in found:
        if pair.ratio is not None and isinstance(pair.first, float):
            ratios.setdefault(pair.benchmark, []).append(pair.ratio)
            firsts.setdefault(pair.benchmark, []).append(pair.first)
    return [
        Summary(
            name,
            len(values),
            min(values),
            statistics.median(values),
            max(values),
            max(firsts[name]) / min(firsts[name]),
        )
        for name, values in sorted(ratios.items())
    ]


def summary_table(rows: Sequence[Summary]) -> str:
    """The Markdown table of each case's run-to-run ratios beside its spread across the releases."""
    lines = [
        "| benchmark | releases | run 2 / run 1, lowest | median | highest "
        "| run 1 across the releases, largest / smallest |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| `{row.benchmark}` | {row.releases} | {row.low:.4f} | {row.median:.4f} | {row.high:.4f} | {row.across:.3f} |"
        for row in rows
    ]
    return "\n".join(lines)


# --- both runs on the published site ---------------------------------------------------------------------


def suite_versions(results_dir: Path) -> dict[str, str]:
    """Benchmark -> its version in the suite an asv results folder was published from (its ``benchmarks.json``)."""
    path = results_dir / SUITE_FILE
    try:
        suite = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise SpreadError(f"{results_dir} is not a results folder asv ran into (its {SUITE_FILE}: {error})") from None
    return {name: str(entry.get("version")) for name, entry in suite.items() if isinstance(entry, dict)}


def stale_rows(data: Mapping[str, Any], versions: Mapping[str, str]) -> list[str]:
    """The benchmarks of a result file whose version is not the site suite's: asv would not draw them."""
    columns = list(data.get("result_columns") or [])
    if "version" not in columns:
        return []
    at = columns.index("version")
    return sorted(name for name, row in data["results"].items() if len(row) > at and versions.get(name) != str(row[at]))


@dataclass(frozen=True)
class Filing:
    """One result file of a run and where it goes on the site: under machine ``machine`` in ``target``."""

    source: Path
    target: Path
    machine: str

    def merged(self) -> dict[str, Any]:
        """The file as the site will hold it: renamed to the site's machine; where the site has a file of the
        same commit and environment already, that file with the run's benchmarks replacing its own."""
        data = _load(self.source)
        data["params"] = {**data.get("params", {}), "machine": self.machine}
        if not self.target.is_file():
            return data
        kept = _load(self.target)
        if (kept["commit_hash"], kept.get("env_name")) != (data["commit_hash"], data.get("env_name")):
            raise SpreadError(f"{self.target} holds another commit or environment than {self.source}")
        if kept.get("result_columns") != data.get("result_columns"):
            raise SpreadError(f"{self.target} and {self.source} have different result columns (another asv?)")
        kept["results"].update(data["results"])
        kept.setdefault("durations", {}).update(data.get("durations", {}))
        return kept


def add_to_site(first: Path, second: Path, site: Path) -> list[str]:
    """Run 1 into the site's own machine folder, run 2 into ``<machine>-repeat``; one line per run saying where.

    Everything is checked before anything is written: a benchmark whose version is not the site's would
    not be drawn, and a file of the site that disagrees on its commit or environment is not overwritten.
    """
    versions = suite_versions(site)
    plan: list[tuple[int, Path, Path, list[Filing]]] = []
    for number, run, suffix in ((1, first, ""), (2, second, REPEAT_SUFFIX)):
        source = machine_folder(run)
        name = source.name + suffix
        filings = [Filing(path, site / name / path.name, name) for path in result_files(source)]
        for filing in filings:
            stale = stale_rows(_load(filing.source), versions)
            if stale:
                raise SpreadError(
                    f"{filing.source}: {', '.join(stale)} not at the version of {site / SUITE_FILE}; asv would not "
                    "draw them (measure with the suites the site's results come from)"
                )
            filing.merged()
        plan.append((number, source, site / name, filings))
    done = []
    for number, source, folder, filings in plan:
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / MACHINE_FILE).is_file():
            described = json.loads((source / MACHINE_FILE).read_text(encoding="utf-8"))
            described["machine"] = folder.name
            (folder / MACHINE_FILE).write_text(json.dumps(described, indent=4, sort_keys=True), encoding="utf-8")
        for filing in filings:
            filing.target.write_text(json.dumps(filing.merged()), encoding="utf-8")
        done.append(f"site: run {number} -> {folder} ({len(filings)} result files)")
    return done


# --- the command --------------------------------------------------------------------------------------------


def library_of(config: Path) -> str:
    """The library an asv configuration measures: its ``project``, as the release histories name it."""
    try:
        project = read_config(config).get("project")
    except (OSError, ValueError) as error:
        raise SpreadError(f"{config} is not an asv configuration ({' '.join(str(error).split())})") from None
    if not isinstance(project, str) or not project:
        raise SpreadError(f"{config} names no project")
    return project


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cropbench history-spread", description=__doc__.split("\n\n")[0])
    parser.add_argument("run1", type=Path, help="run 1's asv results folder (results-zarr-walltime/run-1)")
    parser.add_argument("run2", type=Path, help="run 2's asv results folder")
    parser.add_argument(
        "--config",
        type=Path,
        default=REPO / "asv.zarr.conf.json",
        help="the library's asv configuration, which names the library (default asv.zarr.conf.json)",
    )
    parser.add_argument(
        "--recorded", type=Path, default=RECORDED, help="the recorded releases (default scripts/release_histories.json)"
    )
    parser.add_argument(
        "--site",
        type=Path,
        help="also file both runs into this results folder for the site (run 2 as <machine>-repeat)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        library = library_of(args.config)
        names = release_names(library, args.recorded)
        first, second = run_values(args.run1), run_values(args.run2)
        found = pairs(first, second, names)
        print(f"{library}: run 1 {args.run1}, run 2 {args.run2}\n")
        print(summary_table(summaries(found)) + "\n")
        print(table(found, library))
        skipped = skipped_in_both(first, second, names)
        if skipped:
            print(f"\nskipped in both runs: {', '.join(skipped)}")
        incomplete = sorted({f"{pair.release} {pair.benchmark}" for pair in found if pair.missing})
        if incomplete:
            not_filed = "; nothing filed into the site" if args.site is not None else ""
            print(
                f"history_spread: incomplete: measured in one run only: {'; '.join(incomplete)}{not_filed}",
                file=sys.stderr,
            )
            return 1
        if args.site is not None:
            print("\n" + "\n".join(add_to_site(args.run1, args.run2, args.site)))
    except (SpreadError, HistoryError, OSError, ValueError) as error:
        print(f"history_spread: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    return 0
