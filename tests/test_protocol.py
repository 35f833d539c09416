"""The shared timing helpers: turn order, shapes and arithmetic, on a fake clock (no real timing)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from cropbench import metrics as m
from cropbench.measure import protocol
from cropbench.measure.protocol import (
    alternating_ratios,
    exhaust,
    interleaved_blocks,
    interleaved_rates,
    per_item,
    relative_cost,
    steady_state,
)


class FakeClock:
    """A clock that moves only when a call says how long it took."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def ns(self) -> int:
        return int(round(self.now * 1e9))

    def costs(self, seconds_per_item: float) -> Any:
        def get(item: Any) -> None:
            self.now += seconds_per_item

        return get


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClock]:
    fake = FakeClock()
    monkeypatch.setattr(protocol.time, "perf_counter", fake)
    monkeypatch.setattr(protocol, "clock_ns", fake.ns)
    yield fake


def test_stopwatch_sums_the_blocks_it_times_and_wraps_calls(clock: FakeClock) -> None:
    watch = protocol.Stopwatch()
    with watch:
        clock.now += 0.5
    clock.now += 10.0  # between blocks: not timed
    timed = watch.wrap(clock.costs(0.25))
    timed(None)
    assert (watch.count, watch.last_ns, watch.seconds) == (2, 250_000_000, 0.75)
    watch.reset()
    assert (watch.ns, watch.count) == (0, 0)


def test_samples_per_s_is_samples_over_the_seconds_of_the_timed_fetches() -> None:
    assert protocol.samples_per_s(300, 1.5) == 200.0
    assert protocol.samples_per_s(10, 0.0) == float("inf")


def test_calls_take_turns_and_the_order_rotates_every_block() -> None:
    order: list[tuple[str, int]] = []
    calls = {name: (lambda block, name=name: order.append((name, block))) for name in ("a", "b", "c")}
    seconds = interleaved_blocks(calls, [0, 1, 2, 3], rounds=2)
    assert all(spent.shape == (2, 4) for spent in seconds.values())
    firsts = [order[i][0] for i in range(0, len(order), 3)]
    assert firsts == ["a", "b", "c", "a", "b", "c", "a", "b"], "the turn order rotates across rounds too"
    assert [block for _, block in order[:3]] == [0, 0, 0], "every call reads a block before the next block"


def test_before_runs_before_every_call() -> None:
    events: list[str] = []
    interleaved_blocks(
        {"a": lambda _: events.append("a"), "b": lambda _: events.append("b")},
        [0, 1],
        before=lambda: events.append("before"),
    )
    assert events == ["before", "a", "before", "b", "before", "b", "before", "a"]


def test_rates_count_items_over_each_calls_own_time(clock: FakeClock) -> None:
    rates = interleaved_rates(
        {"fast": per_item(clock.costs(0.001)), "slow": per_item(clock.costs(0.004))}, [[1, 2], [3, 4, 5]], rounds=3
    )
    assert rates["fast"].overall == pytest.approx(1000.0)
    assert rates["slow"].overall == pytest.approx(250.0)
    assert rates["slow"].per_round == pytest.approx((250.0,) * 3)
    assert rates["slow"].median == pytest.approx(250.0)


def test_alternating_ratios_and_relative_cost(clock: FakeClock) -> None:
    ratios = alternating_ratios(per_item(clock.costs(0.003)), per_item(clock.costs(0.001)), [[1], [2, 3]])
    assert ratios == pytest.approx([3.0, 3.0])
    assert relative_cost(clock.costs(0.002), clock.costs(0.001), list(range(64)), block=8) == pytest.approx(2.0)


def test_relative_cost_of_identical_paths_is_one_when_the_first_reader_of_a_block_pays_more(
    clock: FakeClock,
) -> None:
    """The turn order rotates, so per-block ratios alternate 2 and 1/2: their arithmetic mean read 1.33."""
    seen: set[int] = set()

    def get(item: int) -> None:
        clock.now += 0.001 if item in seen else 0.002
        seen.add(item)

    assert relative_cost(get, get, list(range(72)), block=8) == pytest.approx(1.0)


def test_relative_cost_leaves_the_first_call_out(clock: FakeClock) -> None:
    calls = 0

    def get(item: int) -> None:
        nonlocal calls
        calls += 1
        clock.now += 1.0 if calls == 1 else 0.001  # the first call opens a store, say

    assert relative_cost(get, clock.costs(0.001), list(range(64)), block=8) == pytest.approx(1.0)


def test_relative_cost_of_identical_real_work_is_near_one() -> None:
    """Real clocks: a wide band, so a loaded machine cannot fail it (the ratios are symmetric around 1)."""
    source = np.arange(64 * 1024, dtype=np.float32)

    def copy(item: int) -> None:
        source.copy()

    assert 0.5 < relative_cost(copy, copy, list(range(32 * 40)), block=32) < 2.0


def test_exhaust_reads_one_epoch_per_call() -> None:
    epochs: list[int] = []

    class Loader:
        def __iter__(self) -> Iterator[int]:
            epochs.append(1)
            yield from range(3)

    ratios = alternating_ratios(exhaust(Loader()), exhaust(Loader()), [None] * 3)
    assert len(ratios) == 3 and len(epochs) == 6


def test_steady_state_reports_named_metrics_under_a_prefix(clock: FakeClock) -> None:
    metrics = steady_state(clock.costs(0.002), list(range(120)), prefix=m.IO)
    assert metrics[m.prefixed(m.IO, m.SAMPLES_PER_S)] == pytest.approx(500.0)
    assert metrics[m.prefixed(m.IO, m.COUNT)] == 60, "the timed loop reads half of the indices"
    assert metrics[m.prefixed(m.IO, m.P50_MS)] == pytest.approx(2.0)
    assert np.isclose(metrics[m.prefixed(m.IO, m.HARNESS_OVERHEAD)], 0.0)


@pytest.mark.parametrize("items", [50, 150, 7])
def test_steady_state_harness_overhead_is_not_negative_when_the_first_reader_of_an_item_pays_more(
    clock: FakeClock, items: int
) -> None:
    """With an odd number of blocks the tight loop went first once more and paid the first reads alone:
    over one block its time was twice the timed loop's (an overhead of -0.5)."""
    seen: set[int] = set()

    def get(item: int) -> None:
        clock.now += 0.001 if item in seen else 0.002
        seen.add(item)

    metrics = steady_state(get, list(range(items)))
    assert metrics[m.HARNESS_OVERHEAD] == pytest.approx(0.0, abs=0.1)
    assert metrics[m.COUNT] in (items // 2, (items + 1) // 2), "each loop reads half of the indices"


@pytest.mark.parametrize("items", [1, 50, 233])
def test_steady_state_reads_each_index_once_so_no_loop_reads_what_the_other_just_cached(
    clock: FakeClock, items: int
) -> None:
    """A second read of a block finds its chunks in the reader's cache: a rate of first and repeated
    reads mixed. Each index goes to one loop; the tight loop's rate and the percentiles both count."""
    reads: list[int] = []

    def get(item: int) -> None:
        clock.now += 0.002
        reads.append(item)

    metrics = steady_state(get, list(range(items)))
    if items == 1:
        assert reads == [0, 0], "a single item is read by both loops"
        return
    assert sorted(reads) == list(range(items))
    assert metrics[m.SAMPLES_PER_S] == pytest.approx(500.0) and metrics[m.P50_MS] == pytest.approx(2.0)


def test_paired_blocks_are_even_in_number_and_near_equal_in_size() -> None:
    from cropbench.measure.protocol import paired_blocks

    assert [len(block) for block in paired_blocks(list(range(50)), 50)] == [25, 25]
    assert [len(block) for block in paired_blocks(list(range(101)), 50)] == [26, 25, 25, 25]
    assert paired_blocks([7], 50) == [[7]] and paired_blocks([], 50) == []
    assert sum(paired_blocks(list(range(233)), 50), []) == list(range(233))


def test_trimmed_mean_drops_the_extremes() -> None:
    assert protocol.trimmed_mean([1.0] * 8 + [100.0, -100.0], 0.1) == 1.0
    assert protocol.trimmed_mean([1.0, 2.0, 3.0], 0.0) == 2.0
