"""Track 3's searches: the fewest workers that keep the model fed, and the fastest threads-vs-workers split."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from cropbench import metrics as m
from cropbench.harness.context import RunContext
from cropbench.tracks.training.cases import ThreadSplit, TrainingCase, WorkerSearch
from cropbench.tracks.training.loop import run_case


def flagged(metrics: dict[str, Any]) -> bool:
    """Whether a candidate's row carries a validity flag: measured, but no answer rests on it."""
    return bool(metrics.get(m.VALIDITY_FLAGS))


def search_summary(search: WorkerSearch, results: Sequence[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """The search's answer: the fewest workers under the threshold among the candidates without flags;
    None where none was (said apart where every candidate carries a flag)."""
    fed = [workers for workers, metrics in results if _fed(search, metrics)]
    left_out = [workers for workers, metrics in results if flagged(metrics)]
    tried = max((workers for workers, _ in results), default=0)
    if fed:
        answer = str(fed[0])
    elif results and len(left_out) == len(results):
        answer = "none to name: every candidate carries a flag"
    else:
        answer = f"not reached with <= {tried}"
        if left_out:
            answer += f" (flagged, not counted: {', '.join(f'w{workers}' for workers in left_out)})"
    return {
        m.MIN_WORKERS: fed[0] if fed else None,
        m.REACHED: bool(fed),
        m.THRESHOLD: search.threshold,
        m.MIN_WORKERS_ANSWER: answer,
        m.TRIED_WORKERS: [workers for workers, _ in results],
        m.FLAGGED_WORKERS: left_out,
        m.DATA_WAIT_FRACTION_BY_WORKERS: [metrics[m.DATA_WAIT_FRACTION] for _, metrics in results],
        m.IMAGES_PER_S_BY_WORKERS: [metrics[m.IMAGES_PER_S] for _, metrics in results],
        m.COMPUTE_ONLY_IMAGES_PER_S: results[0][1][m.COMPUTE_ONLY_IMAGES_PER_S] if results else None,
    }


def _fed(search: WorkerSearch, metrics: dict[str, Any]) -> bool:
    """Whether a candidate kept the model fed: under the threshold, and its row carries no flag."""
    return bool(metrics[m.DATA_WAIT_FRACTION] < search.threshold) and not flagged(metrics)


def iter_search(
    search: WorkerSearch,
    measure: Callable[[TrainingCase], dict[str, Any]],
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(workers, metrics) of each candidate as it is measured: ascending (stopping at the first fed
    one if ``stop_early``), or bisecting. A flagged candidate counts as not fed."""
    candidates = search.candidates

    def fed(metrics: dict[str, Any]) -> bool:
        return _fed(search, metrics)

    if search.bisect:
        # Invariant: candidates[high] is fed, every candidate below ``low`` is not.
        low, high = 0, len(candidates) - 1
        metrics = measure(search.with_workers(candidates[high]))
        yield candidates[high], metrics
        if fed(metrics):
            while low < high:
                middle = (low + high) // 2
                metrics = measure(search.with_workers(candidates[middle]))
                yield candidates[middle], metrics
                if fed(metrics):
                    high = middle
                else:
                    low = middle + 1
        return
    for workers in candidates:
        metrics = measure(search.with_workers(workers))
        yield workers, metrics
        if fed(metrics) and search.stop_early:
            return


def run_search(
    context: RunContext,
    search: WorkerSearch,
    measure: Callable[[TrainingCase], dict[str, Any]] | None = None,
) -> tuple[list[tuple[int, dict[str, Any]]], dict[str, Any]]:
    """Every candidate :func:`iter_search` measures, in ascending worker order, and the search's answer."""
    results = sorted(iter_search(search, measure or (lambda case: run_case(context, case))), key=lambda r: r[0])
    return results, search_summary(search, results)


def split_name(workers: int, threads: int) -> str:
    return f"w{workers}xt{threads}"


def split_summary(split: ThreadSplit, results: Sequence[tuple[tuple[int, int], dict[str, Any]]]) -> dict[str, Any]:
    """The split's answer: each split's images/s, data wait and supply over demand, and the fastest among
    those whose rows carry no flag (None where every one does)."""
    names = [split_name(*pair) for pair, _ in results]
    rates = [metrics[m.IMAGES_PER_S] for _, metrics in results]
    usable = [
        (rate, name) for (_, metrics), rate, name in zip(results, rates, names, strict=True) if not flagged(metrics)
    ]
    return {
        m.CORES: split.cores,
        m.SPLITS: names,
        m.IMAGES_PER_S_BY_SPLIT: rates,
        m.DATA_WAIT_FRACTION_BY_SPLIT: [metrics[m.DATA_WAIT_FRACTION] for _, metrics in results],
        m.SUPPLY_OVER_DEMAND_BY_SPLIT: [metrics.get(m.SUPPLY_OVER_DEMAND) for _, metrics in results],
        m.BEST_SPLIT: max(usable, key=lambda entry: entry[0])[1] if usable else None,
        m.FLAGGED_SPLITS: [name for (_, metrics), name in zip(results, names, strict=True) if flagged(metrics)],
        m.COMPUTE_ONLY_IMAGES_PER_S: results[0][1][m.COMPUTE_ONLY_IMAGES_PER_S] if results else None,
    }
