"""The replay model: a reader's request trace simulated against a modelled store, on traces with known answers."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from cropbench.errors import ConfigError
from cropbench.measure.replay import Client, Replay, Step, Workload, fitted_compute, fitted_costs, predict
from cropbench.measure.store_emulation import RequestTrace, StoreModel

#: A store with a fixed 20 ms first-byte latency and no other limit (each test adds the one it checks).
FIXED = StoreModel(median_latency_ms=20, p99_latency_ms=20, request_rate=None, connection_mb_s=None, link_gbit_s=None)


def _trace(start_s: float, body_bytes: int) -> RequestTrace:
    return RequestTrace("GET", "/key", "bytes=0-9", 206, body_bytes, start_s, start_s + 0.02)


def test_fixed_latency_and_in_flight_give_rounds_of_requests() -> None:
    workload = Workload((Step(64, (1000,) * 100),))
    for in_flight in (1, 10, 16, 100):
        seconds = predict(workload, Replay(FIXED, Client(in_flight=in_flight))).seconds
        assert seconds == pytest.approx(math.ceil(100 / in_flight) * 0.020), in_flight


def test_compute_follows_each_batch_and_processes_share_the_batches() -> None:
    batches = Workload(tuple(Step(10, (1000,) * 4) for _ in range(8)))
    one = predict(batches, Replay(FIXED, Client(in_flight=4, compute_s_per_crop=0.001)))
    assert one.seconds == pytest.approx(8 * (0.020 + 0.010)), "a batch is asked for after the last one is computed"
    assert one.cpu_share == pytest.approx(0.010 / 0.030)
    two = predict(batches, Replay(FIXED, Client(processes=2, in_flight=4, compute_s_per_crop=0.001)))
    assert two.seconds == pytest.approx(4 * 0.030) and two.crops_per_s == pytest.approx(2 * one.crops_per_s)


def test_reading_ahead_hides_the_requests_behind_the_compute() -> None:
    batches = Workload(tuple(Step(10, (1000,) * 4) for _ in range(8)))
    ahead = predict(batches, Replay(FIXED, Client(in_flight=8, compute_s_per_crop=0.003, read_ahead_steps=1)))
    assert ahead.seconds == pytest.approx(0.020 + 8 * 0.030), "only the first batch's requests are waited for"


def test_a_bandwidth_bound_read_lasts_its_bytes_over_the_bandwidth() -> None:
    workload = Workload((Step(1, (10_000_000,) * 50),))
    link = StoreModel(median_latency_ms=0, p99_latency_ms=0, request_rate=None, connection_mb_s=None, link_gbit_s=1)
    prediction = predict(workload, Replay(link, Client(in_flight=64)))
    assert prediction.seconds == pytest.approx(500e6 / 125e6) and prediction.link_utilisation == pytest.approx(1.0)
    connection = StoreModel(
        median_latency_ms=0, p99_latency_ms=0, request_rate=None, connection_mb_s=100, link_gbit_s=None
    )
    assert predict(workload, Replay(connection, Client(in_flight=5))).seconds == pytest.approx(10 * 0.1), (
        "5 connections at 100 MB/s each move 500 MB/s"
    )


def test_the_request_rate_spaces_requests_out() -> None:
    workload = Workload((Step(1, (10,) * 1001),))
    limited = StoreModel(
        median_latency_ms=20, p99_latency_ms=20, request_rate=1000, connection_mb_s=None, link_gbit_s=None
    )
    prediction = predict(workload, Replay(limited, Client(in_flight=1001)))
    assert prediction.seconds == pytest.approx(1000 / 1000 + 0.020)
    assert prediction.requests_per_s == pytest.approx(1001 / 1.020)


def test_a_seed_fixes_the_latency_draws() -> None:
    workload = Workload(tuple(Step(64, (40_000,) * 30) for _ in range(20)))
    tailed = StoreModel(median_latency_ms=20, p99_latency_ms=100)
    client = Client(processes=2, in_flight=16, compute_s_per_crop=0.0002)
    first, again = (predict(workload, Replay(tailed, client, seed=7)) for _ in range(2))
    assert first == again
    assert predict(workload, Replay(tailed, client, seed=8)).seconds != first.seconds
    fixed = predict(workload, Replay(FIXED, client, seed=7))
    assert first.seconds > fixed.seconds, "the tail makes each batch wait for its slowest request"


def test_response_handling_hides_behind_the_wait_until_responses_arrive_together() -> None:
    workload = Workload((Step(0, (1_000_000,) * 4), Step(1)))
    handling = Client(in_flight=1, client_s_per_byte=5e-9)  # 5 ms per 1 MB response
    one_at_a_time = predict(workload, Replay(FIXED, handling)).seconds
    assert one_at_a_time == pytest.approx(4 * (0.020 + 0.005)), "one in flight: each handling delays the next request"
    together = predict(workload, Replay(FIXED, replace(handling, in_flight=4))).seconds
    assert together == pytest.approx(0.020 + 4 * 0.005), "four arrive together: their handling queues on one CPU"
    slow = StoreModel(median_latency_ms=20, p99_latency_ms=20, request_rate=None, connection_mb_s=100, link_gbit_s=None)
    streamed = predict(Workload((Step(1, (10_000_000,)),)), Replay(slow, handling)).seconds
    assert streamed == pytest.approx(0.020 + 0.100), "50 ms of handling overlaps the body's 100 ms on the wire"


def test_two_settings_separate_compute_from_response_handling() -> None:
    workload = Workload(tuple(Step(64, (500_000,) * 30) for _ in range(20)))
    tailed = StoreModel(median_latency_ms=20, p99_latency_ms=100)
    few, many = (Replay(tailed, Client(processes=2, in_flight=in_flight)) for in_flight in (4, 64))
    truth = {"compute_s_per_crop": 0.0004, "client_s_per_byte": 2e-9}
    seconds = [
        predict(workload, replace(replay, client=replace(replay.client, **truth))).seconds for replay in (few, many)
    ]
    fitted = fitted_costs(workload, few, seconds[0], many, seconds[1])
    assert fitted.split_visible
    assert fitted.compute_s_per_crop == pytest.approx(0.0004, rel=1e-3)
    assert fitted.client_s_per_byte == pytest.approx(2e-9, rel=1e-3)


def test_two_settings_bound_by_the_link_do_not_tell_the_costs_apart() -> None:
    shards = Workload(tuple(Step(100, (40_000_000,)) for _ in range(8)))
    tailed = StoreModel(median_latency_ms=20, p99_latency_ms=100)
    slow, slower = (Replay(replace(tailed, link_gbit_s=link), Client(processes=2, in_flight=1)) for link in (1, 0.5))
    truth = {"compute_s_per_crop": 0.0004, "client_s_per_byte": 2e-9}
    seconds = [
        predict(shards, replace(replay, client=replace(replay.client, **truth))).seconds for replay in (slow, slower)
    ]
    assert not fitted_costs(shards, slow, seconds[0], slower, seconds[1]).split_visible


def test_a_fitted_compute_reproduces_the_measured_seconds() -> None:
    workload = Workload(tuple(Step(64, (40_000,) * 30) for _ in range(20)))
    replay = Replay(StoreModel(median_latency_ms=20, p99_latency_ms=100), Client(processes=2, in_flight=16))
    truth = Replay(replay.store, Client(processes=2, in_flight=16, compute_s_per_crop=0.0005))
    measured = predict(workload, truth).seconds
    assert fitted_compute(workload, replay, measured) == pytest.approx(0.0005, rel=1e-5)
    assert fitted_compute(workload, replay, 1e-6) == 0, "requests alone outlast it: no compute is visible"


def test_traces_become_steps_in_the_order_they_were_issued() -> None:
    requests = [_trace(start, size) for start, size in ((0.3, 30), (0.1, 10), (0.2, 20), (0.4, 40), (0.5, 50))]
    batched = Workload.batched(requests, crops=130, batch_size=64)
    assert [step.crops for step in batched.steps] == [64, 64, 2]
    assert [step.request_bytes for step in batched.steps] == [(10, 20), (30,), (40, 50)]
    streamed = Workload.streamed(requests, crops=150)
    assert [step.crops for step in streamed.steps] == pytest.approx([10, 20, 30, 40, 50])
    assert streamed.requests == 5 and streamed.body_bytes == 150


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: Client(in_flight=0), "in_flight"),
        (lambda: Client(processes=True), "processes"),
        (lambda: Client(compute_s_per_crop=-1.0), "compute_s_per_crop"),
        (lambda: Client(read_ahead_steps=-1), "read_ahead_steps"),
        (lambda: Client(client_s_per_byte=math.nan), "client_s_per_byte"),
        (lambda: Replay(FIXED, Client(), repeats=0), "repeats"),
        (lambda: Replay(FIXED, Client(), seed=-1), "seed"),
        (lambda: Replay("s3", Client()), "store"),  # type: ignore[arg-type]
        (lambda: Step(-1.0), "crops"),
        (lambda: Step(1, (-5,)), "request_bytes"),
        (lambda: Workload(()), "steps"),
        (lambda: Workload((Step(0, (10,)),)), "steps"),
        (lambda: Workload.batched([], crops=10, batch_size=0), "batch_size"),
        (lambda: Workload.streamed([], crops=10), "requests"),
        (lambda: fitted_compute(Workload((Step(1),)), Replay(FIXED, Client()), 0.0), "measured_seconds"),
        (
            lambda: fitted_costs(Workload((Step(1),)), Replay(FIXED, Client()), 1.0, Replay(FIXED, Client()), -1),
            "second_seconds",
        ),
    ],
)
def test_bad_input_is_one_line_naming_the_field(build: object, field: str) -> None:
    with pytest.raises(ConfigError) as raised:
        build()  # type: ignore[operator]
    message = str(raised.value)
    assert message.startswith(field) and "\n" not in message
