"""Replaying a reader's requests against a modelled object store: crops/s where this machine cannot go.

The emulated store (:mod:`.store_emulation`) runs what fits on this machine: a few requests in flight,
a link the veth and two cores can fill. A real node has 32 cores and a 10-25 Gbit/s link. This module
predicts what a reader would see there from a trace of what it asked for here: the requests one
measured epoch made (their bytes, in the order the reader issued them), the crops it delivered, and
the client's costs fitted to measured wall times; the store is the same :class:`~.store_emulation.StoreModel` the
emulation injects.

The prediction is a discrete-event simulation of the reader's dependency structure, under these
assumptions (each one a simplification the validation against the emulation tests):

- **Steps.** A reader's work is a sequence of steps: the requests of a step are issued together, and
  its crops are computed once they have all arrived. The direct reader's step is a batch (it asks for
  a batch's byte ranges at once and decodes when they are in); a shard-downloading reader's step is one
  object (WebDataset fetches a shard, then reads its crops). A trace's requests are dealt to the steps
  in the order they were issued: evenly over a batched reader's batches, one each for a shard reader,
  whose step's crops are in proportion to its bytes.
- **Processes.** Steps are dealt to ``processes`` in turn (as a DataLoader deals batches to its
  workers); each process keeps at most ``in_flight`` requests open, computes one step at a time, and
  issues the requests of step *i* when it has computed step *i - 1 - read_ahead_steps* (0: a batch is
  asked for after the previous one is decoded). Processes are independent (the loader's own queue
  does not hold one back for another).
- **The client's CPU.** Each process has one CPU (its interpreter) that runs, one job at a time in
  the order they become ready, each response's handling (``client_s_per_byte`` of its body: receiving
  and copying or writing it, from its first byte on; the response is done when both its last byte
  and its handling are, the request's slot held until then) and each step's compute
  (``compute_s_per_crop``: decode, copy, collate). With few requests in flight the handling hides
  behind the wait for other responses; with many, the responses arrive together and their handling
  queues up: this is why the client's cost has two parts, fitted from two traces
  (:func:`fitted_costs`). The processes do not compete for cores (one core each), and the loader's
  main process costs nothing.
- **Store.** Each request waits for the request rate (a FIFO queue spaced ``1 / request_rate``
  apart, as the emulation's ``limit_req`` queue is), then a first-byte latency drawn from the
  model's log-normal, then its body: at most ``connection_mb_s``, and through the node's link, which
  sends whole bodies one after another in the order their first bytes arrive (a FIFO rather than a
  fair share: the link's throughput is right, one response's finish time is early or late).

Seeded and deterministic: the same trace, client, store and seed give the same prediction.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

from cropbench.errors import ConfigError
from cropbench.measure.store_emulation import RequestTrace, StoreModel

#: Halvings of the interval when fitting a cost: 2**-16 of the largest possible value.
FIT_HALVINGS = 16
#: Points of the grid the per-byte cost's fit searches for a change of sign before halving.
FIT_GRID = 8
#: Share of the second setting's seconds within which two neighbouring points of that grid both
#: fitting means the settings do not tell the costs apart.
FLAT_SHARE = 0.002


def _whole(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{name} must be a whole number >= {least}, got {value!r}")


def _non_negative(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 <= value < math.inf):
        raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class Step:
    """One step of a reader: its requests' body bytes, issued together, then the compute of ``crops``
    crops (a fraction where a shard's crops are shared out by bytes)."""

    crops: float
    request_bytes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _non_negative("crops", self.crops)
        for size in self.request_bytes:
            _whole("request_bytes", size, 0)


@dataclass(frozen=True)
class Workload:
    """What one measured epoch of a reader asked for and delivered, as steps (see the module docstring)."""

    steps: tuple[Step, ...]

    def __post_init__(self) -> None:
        if not self.steps:
            raise ConfigError("steps must hold at least one step, got none")
        if not self.crops > 0:
            raise ConfigError(f"steps must deliver at least one crop, got {self.crops!r}")

    @property
    def crops(self) -> float:
        return sum(step.crops for step in self.steps)

    @property
    def requests(self) -> int:
        return sum(len(step.request_bytes) for step in self.steps)

    @property
    def body_bytes(self) -> int:
        return sum(sum(step.request_bytes) for step in self.steps)

    @classmethod
    def batched(cls, requests: Sequence[RequestTrace], crops: int, batch_size: int) -> Workload:
        """A reader that asks for a batch's requests together (the direct reader): ``crops`` in batches of
        ``batch_size``, the requests, in the order they were issued, dealt evenly to the batches."""
        _whole("crops", crops, 1)
        _whole("batch_size", batch_size, 1)
        sizes = _issue_order(requests)
        batches = math.ceil(crops / batch_size)
        bounds = [round(len(sizes) * index / batches) for index in range(batches + 1)]
        return cls(
            tuple(
                Step(min(batch_size, crops - index * batch_size), tuple(sizes[bounds[index] : bounds[index + 1]]))
                for index in range(batches)
            )
        )

    @classmethod
    def streamed(cls, requests: Sequence[RequestTrace], crops: int) -> Workload:
        """A reader that downloads one object, then reads its crops (WebDataset's shards): one step per
        request in the order they were issued, the ``crops`` shared out in proportion to body bytes."""
        _whole("crops", crops, 1)
        sizes = _issue_order(requests)
        if not sizes or not sum(sizes):
            raise ConfigError(
                f"requests must carry body bytes to share {crops} crops out by, got {len(sizes)} requests"
            )
        total = sum(sizes)
        return cls(tuple(Step(crops * size / total, (size,)) for size in sizes))


def _issue_order(requests: Sequence[RequestTrace]) -> list[int]:
    """Body bytes of ``requests`` in the order they started (the server saw them in the reader's order)."""
    return [trace.body_bytes for trace in sorted(requests, key=lambda trace: trace.start_s)]


@dataclass(frozen=True)
class Client:
    """The reader's side: ``processes`` reading at once (DataLoader workers, or 1), each with at most
    ``in_flight`` requests open, ``compute_s_per_crop`` of its own CPU per crop and ``client_s_per_byte``
    per response byte, asking for a step's requests ``read_ahead_steps`` steps before it computes it."""

    processes: int = 1
    in_flight: int = 16
    compute_s_per_crop: float = 0.0
    client_s_per_byte: float = 0.0
    read_ahead_steps: int = 0

    def __post_init__(self) -> None:
        _whole("processes", self.processes, 1)
        _whole("in_flight", self.in_flight, 1)
        _non_negative("compute_s_per_crop", self.compute_s_per_crop)
        _non_negative("client_s_per_byte", self.client_s_per_byte)
        _whole("read_ahead_steps", self.read_ahead_steps, 0)


@dataclass(frozen=True)
class Replay:
    """One prediction's settings: the store, the client, the workload replayed ``repeats`` times over
    (enough steps for every process to reach a steady state), the seed of the latency draws."""

    store: StoreModel
    client: Client
    repeats: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.store, StoreModel):
            raise ConfigError(f"store must be a StoreModel, got {type(self.store).__name__}")
        if not isinstance(self.client, Client):
            raise ConfigError(f"client must be a Client, got {type(self.client).__name__}")
        _whole("repeats", self.repeats, 1)
        _whole("seed", self.seed, 0)


@dataclass(frozen=True)
class Prediction:
    """What the simulation gives: seconds until the last crop was computed, and the rates over them."""

    seconds: float
    crops: float
    requests: int
    body_bytes: int
    #: Share of the processes' time their CPU was busy (compute and response handling; the rest: waiting).
    cpu_share: float
    #: Share of the link's capacity used over the run (None: no link in the model).
    link_utilisation: float | None

    @property
    def crops_per_s(self) -> float:
        return self.crops / self.seconds if self.seconds > 0 else math.inf

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else math.inf


_FIRST_BYTE, _HANDLED, _COMPUTED = 0, 1, 2


class _Process:
    """One reading process's state in the simulation."""

    def __init__(self, steps: Sequence[Step], in_flight: int, latencies: list[list[float]]) -> None:
        self.steps = steps
        self.latencies = latencies  # each request's first-byte latency, drawn up front
        self.free = in_flight
        self.pending: deque[tuple[int, int, int]] = deque()  # (step, request, body bytes) not yet issued
        self.outstanding = [len(step.request_bytes) for step in steps]
        self.released = 0  # steps whose requests were queued
        self.scheduled = 0  # steps whose compute is queued on the CPU
        self.computed = 0  # steps computed
        self.cpu_free = 0.0  # when the process's CPU has done the jobs queued on it


class _Simulation:
    """The event loop of one prediction: first bytes, handled responses and computed steps, in time order."""

    def __init__(self, workload: Workload, replay: Replay) -> None:
        store, client = replay.store, replay.client
        steps = workload.steps * replay.repeats
        self.client = client
        draws = random.Random(replay.seed)
        median, sigma = store.median_latency_ms / 1e3, store.latency_sigma
        self.processes = []
        for index in range(client.processes):
            mine = steps[index :: client.processes]
            # Drawn per request, in a fixed order: a change of the client's costs keeps each request's latency.
            latencies = [[median * math.exp(sigma * draws.gauss()) for _ in step.request_bytes] for step in mine]
            self.processes.append(_Process(mine, client.in_flight, latencies))
        self.connection_bytes_s = store.connection_mb_s * 1e6 if store.connection_mb_s else None
        self.link_bytes_s = store.link_gbit_s * 1e9 / 8 if store.link_gbit_s else None
        self.spacing_s = 1 / store.request_rate if store.request_rate else 0.0
        self.next_admission = 0.0
        self.link_free = 0.0
        self.events: list[tuple[float, int, int, int, int, int]] = []
        self.sequence = 0
        self.end = 0.0

    def _push(self, time: float, kind: int, process: int, step: int = 0, size: int = 0) -> None:
        heapq.heappush(self.events, (time, self.sequence, kind, process, step, size))
        self.sequence += 1

    def _release(self, index: int, now: float) -> None:
        """Queue the requests of the process's next steps, up to ``read_ahead_steps`` beyond the one computing."""
        process = self.processes[index]
        limit = min(len(process.steps), process.computed + 1 + self.client.read_ahead_steps)
        while process.released < limit:
            step = process.released
            process.pending.extend(
                (step, request, size) for request, size in enumerate(process.steps[step].request_bytes)
            )
            process.released += 1
        self._issue(index, now)
        self._compute(index, now)

    def _issue(self, index: int, now: float) -> None:
        process = self.processes[index]
        while process.free and process.pending:
            step, request, size = process.pending.popleft()
            process.free -= 1
            admitted = max(now, self.next_admission)
            self.next_admission = admitted + self.spacing_s
            self._push(admitted + process.latencies[step][request], _FIRST_BYTE, index, step, size)

    def _on_cpu(self, process: _Process, now: float, seconds: float) -> float:
        """Queue a job of ``seconds`` on the process's CPU; when it is done."""
        process.cpu_free = max(now, process.cpu_free) + seconds
        return process.cpu_free

    def _compute(self, index: int, now: float) -> None:
        """Queue the compute of the process's next step once its responses are all handled."""
        process = self.processes[index]
        while process.scheduled < process.released and not process.outstanding[process.scheduled]:
            seconds = process.steps[process.scheduled].crops * self.client.compute_s_per_crop
            process.scheduled += 1
            self._push(self._on_cpu(process, now, seconds), _COMPUTED, index)

    def run(self) -> float:
        for index in range(len(self.processes)):
            self._release(index, 0.0)
        while self.events:
            now, _, kind, index, step, size = heapq.heappop(self.events)
            process = self.processes[index]
            if kind == _FIRST_BYTE:
                arrived = now
                if self.link_bytes_s:  # the link sends whole bodies in the order their first bytes came
                    self.link_free = max(now, self.link_free) + size / self.link_bytes_s
                    arrived = self.link_free
                if self.connection_bytes_s:
                    arrived = max(arrived, now + size / self.connection_bytes_s)
                # The body is handled as it streams in: done when its last byte has come and the CPU has
                # spent its share on it (after the jobs queued before it).
                handling = size * self.client.client_s_per_byte
                handled = max(arrived, self._on_cpu(process, now, handling)) if handling else arrived
                self._push(handled, _HANDLED, index, step, size)
            elif kind == _HANDLED:
                process.free += 1
                process.outstanding[step] -= 1
                self._issue(index, now)
                self._compute(index, now)
            else:
                process.computed += 1
                self.end = max(self.end, now)
                self._release(index, now)
        return self.end


def predict(workload: Workload, replay: Replay) -> Prediction:
    """Simulate ``replay.client`` reading ``workload`` (``replay.repeats`` times) from ``replay.store``."""
    seconds = _Simulation(workload, replay).run()
    crops = workload.crops * replay.repeats
    body = workload.body_bytes * replay.repeats
    link, client = replay.store.link_gbit_s, replay.client
    busy = crops * client.compute_s_per_crop + body * client.client_s_per_byte
    return Prediction(
        seconds=seconds,
        crops=crops,
        requests=workload.requests * replay.repeats,
        body_bytes=body,
        cpu_share=busy / (client.processes * seconds) if seconds > 0 else 1.0,
        link_utilisation=body / (link * 1e9 / 8 * seconds) if link and seconds > 0 else None,
    )


def _check_seconds(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")


def _with_costs(replay: Replay, compute_s_per_crop: float, client_s_per_byte: float) -> Replay:
    client = replace(replay.client, compute_s_per_crop=compute_s_per_crop, client_s_per_byte=client_s_per_byte)
    return replace(replay, client=client)


def fitted_compute(workload: Workload, replay: Replay, measured_seconds: float) -> float:
    """The compute seconds per crop with which replaying ``workload`` at its own setting (``replay``, its
    client's ``client_s_per_byte`` kept) lasts ``measured_seconds``: the measured wall time less the time
    the model spends waiting and handling responses. 0 where those alone last as long (the compute is
    then not visible in the trace)."""
    _check_seconds("measured_seconds", measured_seconds)
    per_byte = replay.client.client_s_per_byte

    def seconds(compute: float) -> float:
        return predict(workload, _with_costs(replay, compute, per_byte)).seconds

    low = 0.0
    if seconds(low) >= measured_seconds:
        return low
    # Every process computing all of the time lasts at least the measured seconds.
    high = measured_seconds * replay.client.processes / (workload.crops * replay.repeats)
    for _ in range(FIT_HALVINGS):
        middle = (low + high) / 2
        low, high = (middle, high) if seconds(middle) < measured_seconds else (low, middle)
    return (low + high) / 2


@dataclass(frozen=True)
class FittedCosts:
    """A client's two costs fitted to two settings, and whether those settings told them apart."""

    compute_s_per_crop: float
    client_s_per_byte: float
    #: False where a range of splits fits both settings alike (both bound by the link, say): the
    #: per-byte cost is then the least of that range, and a setting that depends on it is a guess.
    split_visible: bool


def fitted_costs(
    workload: Workload, first: Replay, first_seconds: float, second: Replay, second_seconds: float
) -> FittedCosts:
    """The compute seconds per crop and client seconds per response byte with which replaying
    ``workload`` at two settings lasts what each measured: for each per-byte cost the compute is fitted
    to the first (:func:`fitted_compute`), and the per-byte cost is the one whose second replay lasts
    its measured seconds (the nearest where none does). The two settings must differ in what hides the
    handling (requests in flight, bandwidth), or the split is not visible (``split_visible``)."""
    _check_seconds("first_seconds", first_seconds)
    _check_seconds("second_seconds", second_seconds)

    def costs(per_byte: float, visible: bool = True) -> FittedCosts:
        compute = fitted_compute(workload, _with_costs(first, 0.0, per_byte), first_seconds)
        return FittedCosts(compute, per_byte, visible)

    def error(per_byte: float) -> float:
        fitted = costs(per_byte)
        return predict(workload, _with_costs(second, fitted.compute_s_per_crop, per_byte)).seconds - second_seconds

    # The error is not monotonic over the whole range (the compute fitted to the first setting reaches
    # 0 and stays there): look for the first change of sign on a grid, then halve that interval.
    high = first_seconds * first.client.processes / max(workload.body_bytes * first.repeats, 1)
    grid = [high * point / FIT_GRID for point in range(FIT_GRID + 1)]
    errors = [error(per_byte) for per_byte in grid]
    tolerance = FLAT_SHARE * second_seconds
    flat = next(
        (point for point in range(FIT_GRID) if max(abs(errors[point]), abs(errors[point + 1])) <= tolerance), None
    )
    if flat is not None:
        return costs(grid[flat], visible=False)
    crossing = next((point for point in range(FIT_GRID) if (errors[point] > 0) != (errors[point + 1] > 0)), None)
    if crossing is None:
        return costs(min(zip(errors, grid, strict=True), key=lambda pair: abs(pair[0]))[1])
    low, high, low_positive = grid[crossing], grid[crossing + 1], errors[crossing] > 0
    for _ in range(FIT_HALVINGS):
        middle = (low + high) / 2
        if (error(middle) > 0) == low_positive:
            low = middle
        else:
            high = middle
    return costs((low + high) / 2)


__all__ = [
    "Client",
    "FittedCosts",
    "Prediction",
    "Replay",
    "Step",
    "Workload",
    "fitted_compute",
    "fitted_costs",
    "predict",
]
